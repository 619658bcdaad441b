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

namespace kp {

// Column `column` of token `token`'s row: the logical position (or -1), then,
// with PAGED, its cache slot through the request's block table row:
// block_table[b, p / block_size] * block_size + p % block_size (row b at
// b * table_stride entries), -1 for a
// block past the table, a negative entry, or a slot past int32. Every index
// read may be garbage when the caller skipped validation; each is checked
// before it forms an address.
template <int KPOOL, bool PAGED, typename IPID, typename IO, typename IC>
__device__ __forceinline__ long long expanded(long long token, long long column, const IPID* pool_ids,
                                              long long pool_topk, const IO* input_row_offsets,
                                              const IC* cache_lengths, long long batch, long long total_tokens,
                                              const int* block_table, long long max_blocks, long long table_stride,
                                              long long block_size) {
    long long value = -1;
    long long request = -1;  // the token's request, when its rows hold the token
    if (batch > 0 && (PAGED || column >= pool_topk * KPOOL)) {
        const long long candidate = find_request(input_row_offsets, batch, token);
        long long row_begin, row_end, cached;
        if (request_rows(input_row_offsets, cache_lengths, candidate, total_tokens, &row_begin, &row_end, &cached) &&
            row_begin <= token && token < row_end && cached < (1LL << 62)) {
            request = candidate;
            if (column >= pool_topk * KPOOL) {
                const long long visible = cached + (token - row_begin) + 1;
                const long long count = visible % KPOOL, i = column - pool_topk * KPOOL;
                value = i < count ? visible - count + i : -1;
            }
        }
    }
    if (column < pool_topk * KPOOL) {
        const long long pool = load_signed_index(pool_ids, token * pool_topk + column / KPOOL);
        // The whole pool must fit int32, its last position included.
        const long long first = pool >= 0 && pool <= (2147483647LL - (KPOOL - 1)) / KPOOL ? pool * KPOOL : -1;
        value = first < 0 ? -1 : first + column % KPOOL;
    }
    if (value > 2147483647LL) value = -1;
    if (PAGED && value >= 0) {
        const long long block = value / block_size;
        const long long entry = request >= 0 && block < max_blocks ? block_table[request * table_stride + block] : -1;
        value = entry >= 0 && entry <= (2147483647LL - (block_size - 1)) / block_size
                    ? entry * block_size + value % block_size
                    : -1;
    }
    return value;
}

}  // namespace kp

// One thread per output element of positions [total_tokens, width], or with
// COMPACT one per token row: its valid entries packed to the left in column
// order, -1 after, and their number in counts[token]. PAGED maps positions to
// cache slots (kp::expanded). IPID, IO, IC: the element types of pool_ids,
// input_row_offsets and cache_lengths.
template <int KPOOL, typename IPID, typename IO, typename IC, bool PAGED, bool COMPACT>
__global__ void __launch_bounds__(kp::kMaxThreadsPerBlock, 1)
    kpool_expand_topk(const IPID* __restrict__ pool_ids, long long pool_topk, const IO* __restrict__ input_row_offsets,
                      const IC* __restrict__ cache_lengths, long long batch, long long total_tokens,
                      const int* __restrict__ block_table, long long max_blocks, long long block_table_stride,
                      long long block_size,
                      int* __restrict__ positions, long long width, int* __restrict__ counts) {
    static_assert(KPOOL >= 1, "kpool must be at least 1");
    const long long index = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (width <= 0) return;
    if (!COMPACT) {
        if (index >= total_tokens * width) return;
        positions[index] = static_cast<int>(kp::expanded<KPOOL, PAGED>(
            index / width, index % width, pool_ids, pool_topk, input_row_offsets, cache_lengths, batch, total_tokens,
            block_table, max_blocks, block_table_stride, block_size));
        return;
    }
    if (index >= total_tokens) return;
    int* const row = positions + index * width;
    long long kept = 0;
    for (long long column = 0; column < width; ++column) {
        const long long value = kp::expanded<KPOOL, PAGED>(index, column, pool_ids, pool_topk, input_row_offsets,
                                                           cache_lengths, batch, total_tokens, block_table,
                                                           max_blocks, block_table_stride, block_size);
        if (value >= 0) row[kept++] = static_cast<int>(value);
    }
    for (long long column = kept; column < width; ++column) row[column] = -1;
    counts[index] = static_cast<int>(kept);
}
