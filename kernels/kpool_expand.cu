// kpool_expand_topk: selected pool ids back to token positions, by the
// rules of kpool_expand.cuh.
#include "kpool_expand.cuh"

namespace kp {

// Column `column` of token `token`'s row (kpool_expand.cuh): the logical
// position (or -1), then, with PAGED, its cache slot.
template <int KPOOL, bool PAGED, typename IPID, typename IO, typename IC>
__device__ __forceinline__ long long expanded(long long token, long long column, const IPID* pool_ids,
                                              long long pool_topk, const IO* input_row_offsets,
                                              const IC* cache_lengths, long long batch, long long total_tokens,
                                              const int* block_table, long long max_blocks, long long table_stride,
                                              long long block_size) {
    long long visible = 0;
    const long long request = PAGED || column >= pool_topk * KPOOL
                                  ? expand_request(token, input_row_offsets, cache_lengths, batch, total_tokens,
                                                   &visible)
                                  : -1;
    const long long value =
        column < pool_topk * KPOOL
            ? pool_position(load_signed_index(pool_ids, token * pool_topk + column / KPOOL), column % KPOOL, KPOOL)
            : tail_position(request, visible, visible % KPOOL, column - pool_topk * KPOOL);
    return PAGED ? paged_slot(value, request, block_table, max_blocks, table_stride, block_size) : value;
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
