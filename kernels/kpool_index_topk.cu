// kpool_index_topk: each query token's pool_topk best pools by their index
// logits, among the pools it sees, expanded to token positions (or cache
// slots) in the same launch.
//
//     candidates(t) = min(visible(t), logits_width)      visible(t): the scorer's rule
//     selected(t)   = every candidate when there are at most pool_topk, else the pool_topk best
//                     (kpool_select.cuh's order), in ascending pool id, -1 after
//     positions[t]  = selected(t) expanded as kpool_expand_topk expands pool ids (kpool_expand.cuh)
//
// One block per token and split of its candidates (splits from the host:
// ops/families/split_selection.py; the last of a token's blocks merges,
// kpool_select.cuh). A token with at most pool_topk candidates reads no
// logit; any other reads each of its logits once (kp::select_best; first a
// sample of a chunk's worth where its block's range holds more than the
// buffer), a tile of kTopkGroups 16-byte loads a
// thread in flight together, so the logits are read from global memory once
// whatever the context length (the sample's sectors again from L2), with
// shared memory bounded by CAP (the largest pool_topk an instantiation
// takes).
//
// Every index may be garbage when the caller skipped validation: a token
// outside its request's rows has no candidate, no logit past
// logits_width is read, and the expansion checks every table entry.
#include "kpool_select.cuh"

namespace kp {
// A thread's groups of 4 logits a tile: 4 (a block has 16 KB of logits in flight, 4,096 candidates a
// tile), and 3 blocks an SM (80 registers, no spill; 8 groups took 128 registers and spilled at 2 blocks, and
// a tile holds at most 4 since warp_ranks packs a group's count in a byte). KP_TOPK_GROUPS sets another count
// (1 to 4) in a test's build (a tile smaller than the largest pool_topk).
#ifndef KP_TOPK_GROUPS
#define KP_TOPK_GROUPS 4
#endif
constexpr int kTopkGroups = KP_TOPK_GROUPS;
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
                     int* __restrict__ positions, long long width, int* __restrict__ counts,
                     unsigned char* __restrict__ workspace, long long splits) {
    KP_THREADS_COOPERATE(true);
    constexpr int kTile = kp::kTopkGroups * kp::kSelectChunk;
    __shared__ kp::SelectBuffer<CAP> buffer;
    const long long token = blockIdx.x / splits, split = blockIdx.x % splits;
    if (token >= num_tokens) return;
    long long candidates =
        kp::token_pools_visible(token, input_row_offsets, cache_lengths, batch, num_tokens, kpool);
    candidates = candidates < logits_width ? candidates : logits_width;
    const bool all = candidates <= pool_topk;  // every candidate, no logit read
    if (all && split != 0) return;             // one block writes the row
    kp::SelectState state;
    if (!all) {
        // This split's whole tiles of the token's candidates.
        const long long tiles = (candidates + kTile - 1) / kTile;
        const long long per_split = (tiles + splits - 1) / splits;
        const long long lo = split * per_split * kTile < candidates ? split * per_split * kTile : candidates;
        const long long hi = lo + per_split * kTile < candidates ? lo + per_split * kTile : candidates;
        const float* row = logits + token * logits_stride;
        state = kp::select_best<CAP, kp::kTopkGroups>(
            buffer, lo, hi, static_cast<int>(pool_topk),
            [row](long long first, float (&values)[kp::kSelectPerThread], int count) {
                if (VECTOR && count == kp::kSelectPerThread) {
                    const uint4 v = kp_load16(row + first);
                    values[0] = kp_bits_to_float(v.x);
                    values[1] = kp_bits_to_float(v.y);
                    values[2] = kp_bits_to_float(v.z);
                    values[3] = kp_bits_to_float(v.w);
                } else {
#pragma unroll
                    for (int e = 0; e < kp::kSelectPerThread; ++e)  // unrolled: values stay in registers
                        values[e] = e < count ? row[first + e] : 0.0f;
                }
            });
        if (!kp::gather_splits(buffer, state, workspace, num_tokens, token, split, splits, pool_topk)) return;
    }
    const long long selected = all ? candidates : (state.count < pool_topk ? state.count : pool_topk);
    kp::write_selection<PAGED, COMPACT>(buffer, all, selected, token, input_row_offsets, cache_lengths, batch,
                                        num_tokens, kpool, pool_topk, block_table, max_blocks, block_table_stride,
                                        block_size, positions, width, counts);
}
