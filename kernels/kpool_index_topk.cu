// kpool_index_topk: each query token's pool_topk best pools by their index
// logits, among the pools it sees, expanded to token positions (or cache
// slots) in the same launch.
//
//     candidates(t) = min(visible(t), logits_width)      visible(t): the scorer's rule
//     selected(t)   = every candidate when there are at most pool_topk, else the pool_topk best
//                     (kpool_select.cuh's order), in ascending pool id, -1 after
//     positions[t]  = selected(t) expanded as kpool_expand_topk expands pool ids (kpool_expand.cuh)
//
// One block per token. A token with at most pool_topk candidates reads no
// logit; any other reads each of its logits once (kp::select_best), a tile
// of kTopkGroups 16-byte loads a thread in flight together, so the logits
// are read from global memory once whatever the context length, with shared
// memory bounded by CAP (the largest pool_topk an instantiation takes).
//
// Every index may be garbage when the caller skipped validation: a token
// outside its request's rows has no candidate, no logit past
// logits_width is read, and the expansion checks every table entry.
#include "kpool_select.cuh"

namespace kp {
// A thread's groups of 4 logits a tile: 4 (a block has 16 KB of logits in flight, 4,096 candidates a
// tile), and 3 blocks an SM (80 registers, no spill; 8 groups took 128 registers and spilled at 2 blocks).
constexpr int kTopkGroups = 4;
constexpr int kTopkBlocksPerSm = 3;
}  // namespace kp

// CAP: 512, 1024, 2048 or 4096, at least pool_topk. VECTOR: logits rows
// 16-byte aligned. IO, IC: the index types of input_row_offsets and
// cache_lengths. PAGED: positions become slots through block_table.
// COMPACT: each row's valid entries packed left, their number in counts.
template <int CAP, int VECTOR, typename IO, typename IC, bool PAGED, bool COMPACT>
__global__ void __launch_bounds__(kp::kSelectThreads, kp::kTopkBlocksPerSm)
    kpool_index_topk(const float* __restrict__ logits, long long logits_stride, long long logits_width,
                     const IO* __restrict__ input_row_offsets, const IC* __restrict__ cache_lengths, long long batch,
                     long long num_tokens, long long kpool, long long pool_topk, const int* __restrict__ block_table,
                     long long max_blocks, long long block_table_stride, long long block_size,
                     int* __restrict__ positions, long long width, int* __restrict__ counts) {
    KP_THREADS_COOPERATE(true);
    __shared__ kp::SelectBuffer<CAP> buffer;
    const long long token = blockIdx.x;
    if (token >= num_tokens) return;
    long long candidates =
        kp::token_pools_visible(token, input_row_offsets, cache_lengths, batch, num_tokens, kpool);
    candidates = candidates < logits_width ? candidates : logits_width;
    const bool all = candidates <= pool_topk;  // every candidate, no logit read
    if (!all) {
        const float* row = logits + token * logits_stride;
        kp::select_best<CAP, kp::kTopkGroups>(
            buffer, 0, candidates, static_cast<int>(pool_topk),
            [row](long long first, unsigned int (&keys)[kp::kSelectPerThread], int count) {
                if (VECTOR && count == kp::kSelectPerThread) {
                    const uint4 v = kp_load16(row + first);
                    keys[0] = kp::order_key(kp_bits_to_float(v.x));
                    keys[1] = kp::order_key(kp_bits_to_float(v.y));
                    keys[2] = kp::order_key(kp_bits_to_float(v.z));
                    keys[3] = kp::order_key(kp_bits_to_float(v.w));
                } else {
#pragma unroll
                    for (int e = 0; e < kp::kSelectPerThread; ++e)  // unrolled: keys stay in registers
                        if (e < count) keys[e] = kp::order_key(row[first + e]);
                }
            });
    }
    kp::write_selection<PAGED, COMPACT>(buffer, all, all ? candidates : pool_topk, token, input_row_offsets,
                                        cache_lengths, batch, num_tokens, kpool, pool_topk, block_table, max_blocks,
                                        block_table_stride, block_size, positions, width, counts);
}
