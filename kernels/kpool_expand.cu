// kpool_expand_topk: selected pool ids back to token positions.
//
//     positions[t, s * KPOOL + j] = pool_ids[t, s] * KPOOL + j        (pool_ids[t, s] >= 0)
//     positions[t, s * KPOOL + j] = -1                                 (pool_ids[t, s] < 0)
//
// A -1 id (no selection) stays -1 in all its columns, never a clamped valid
// position; so does an id whose positions would not fit int32. With
// always_select_tail, KPOOL - 1 more columns hold the query's trailing
// positions no complete pool covers yet: with visible = cache_len + local + 1,
// column i < visible % KPOOL holds visible - visible % KPOOL + i, the rest -1.
#include "kpool_common.cuh"

// One thread per output element of positions [total_tokens, width]. IPID,
// IO, IC: the element types of pool_ids, input_row_offsets and
// cache_lengths.
template <int KPOOL, typename IPID, typename IO, typename IC>
__global__ void __launch_bounds__(kp::kMaxThreadsPerBlock, 1)
    kpool_expand_topk(const IPID* __restrict__ pool_ids, long long pool_topk, const IO* __restrict__ input_row_offsets,
                      const IC* __restrict__ cache_lengths, long long batch, long long total_tokens,
                      int* __restrict__ positions, long long width) {
    static_assert(KPOOL >= 1, "kpool must be at least 1");
    const long long index = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (width <= 0 || index >= total_tokens * width) return;
    const long long token = index / width, column = index % width;
    long long value = -1;
    if (column < pool_topk * KPOOL) {
        const long long pool = kp::load_index(pool_ids, token * pool_topk + column / KPOOL);
        // The whole pool must fit int32, its last position included.
        const long long first = pool >= 0 && pool <= (2147483647LL - (KPOOL - 1)) / KPOOL ? pool * KPOOL : -1;
        value = first < 0 ? -1 : first + column % KPOOL;
    } else if (batch > 0) {
        const long long request = kp::find_request(input_row_offsets, batch, token);
        long long row_begin, row_end, cached;
        if (kp::request_rows(input_row_offsets, cache_lengths, request, total_tokens, &row_begin, &row_end,
                             &cached) &&
            row_begin <= token && token < row_end && cached < (1LL << 62)) {
            const long long visible = cached + (token - row_begin) + 1;
            const long long count = visible % KPOOL, i = column - pool_topk * KPOOL;
            value = i < count ? visible - count + i : -1;
        }
    }
    positions[index] = value <= 2147483647LL ? static_cast<int>(value) : -1;
}
