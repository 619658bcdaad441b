// kpool_expand_topk: selected pool ids back to token positions, by the
// rules of kpool_expand.cuh.
#include "kpool_expand.cuh"

// A block of kp::kExpandThreads per token row and span of kp::kExpandSpan
// columns of positions [total_tokens, width] (kp::run_pools, then the
// row's request, then kp::run_values: the ids are read while the request is
// searched for), or with COMPACT per token row (kp::write_expanded_row): its
// valid entries packed to the left in column order, -1 after, and their
// number in counts[token]. The grid is a whole number of rows' spans
// (ops/expand_topk.py); with fewer blocks than rows each takes every
// gridDim.x / spans-th row. PAGED maps positions to cache slots. IPID, IO,
// IC: the element types of pool_ids, input_row_offsets and cache_lengths.
template <int KPOOL, typename IPID, typename IO, typename IC, bool PAGED, bool COMPACT>
__global__ void __launch_bounds__(kp::kExpandThreads)
    kpool_expand_topk(const IPID* __restrict__ pool_ids, long long pool_topk, const IO* __restrict__ input_row_offsets,
                      const IC* __restrict__ cache_lengths, long long batch, long long total_tokens,
                      const int* __restrict__ block_table, long long max_blocks, long long block_table_stride,
                      long long block_size,
                      int* __restrict__ positions, long long width, int* __restrict__ counts) {
    static_assert(KPOOL >= 1, "kpool must be at least 1");
    KP_THREADS_COOPERATE(true);
    if (width <= 0) return;
    const kp::ExpandTarget target = kp::expand_target<PAGED>(block_table, max_blocks, block_table_stride, block_size,
                                                             width, pool_topk * KPOOL, KPOOL);
    // Columns fit 32 bits (the host refuses wider rows), so spans and the block's place are 32-bit.
    const unsigned int spans = COMPACT ? 1u : (target.width + kp::kExpandSpan - 1) / kp::kExpandSpan;
    const unsigned int span = blockIdx.x % spans;
    const long long rows_a_pass = gridDim.x / spans;
    const bool find = PAGED || width > pool_topk * KPOOL;  // the block table and the tail need the request
    for (long long token = blockIdx.x / spans; token < total_tokens; token += rows_a_pass) {
        const IPID* const ids = pool_ids + token * pool_topk;
        const auto pool_of = [ids](unsigned int slot) { return ids[slot]; };  // widened when looked at
        int* const out = positions + token * width;
        if (COMPACT) {
            const kp::ExpandRow row = kp::block_expand_row(find, token, input_row_offsets, cache_lengths, batch,
                                                           total_tokens, KPOOL);
            kp::write_expanded_row<PAGED, true>(row, target, pool_of, out, counts + token);
            continue;
        }
        kp::ExpandRun<IPID> run;
        run.first = span * kp::kExpandSpan + threadIdx.x * kp::kExpandRun;
        kp::run_pools(run, target, pool_of);
        const kp::ExpandRow row =
            kp::block_expand_row(find, token, input_row_offsets, cache_lengths, batch, total_tokens, KPOOL);
        if (run.one)  // a run in one pool and one page: one id, one table entry, consecutive values
            kp::run_values<PAGED, true>(run, row, target);
        else
            kp::run_values<PAGED>(run, row, target);
        if (run.first < target.width) kp::store_run(run, out, target.width);
    }
}
