// kpool_index_logits_fp8: every query token's index logits over the pooled
// FP8 cache, on tensor cores.
//
//     logits[t, p] = sum over h of weights[t, h] * relu(s[p] * dot(q[t, h, :], k[p, :]))   p < visible(t)
//                  = -inf                                                                 visible(t) <= p < max_pools
//     visible(t)   = (cache_lengths[b] + t - input_row_offsets[b] + 1) / kpool            (b: the request of t)
//
// One logit per token and pool, not per head: the heads are summed inside,
// each weighted after its relu. Causality is at pool level: a token sees the
// pools whose members all sit at or before its own position.
//
// One block per tile of tokens_per_block consecutive tokens and tile of
// 32 NT pools; each of its 4 warps scores 8 NT pools for every token of the
// tile (kp::score_token). A warp reads its keys (16-byte loads from the
// cache pages) once for each request its tile's tokens belong to and keeps
// them in registers for all of that request's tokens and heads there; the
// query rows come straight from global memory, once per warp. Blocks of
// one pool tile follow each other in the grid, so the token tiles of one
// request meet its keys in L2.
//
// Every index may be garbage when the caller skipped validation: a token
// outside its request's rows sees nothing, a pool whose page is missing or
// out of range scores -inf, and nothing outside the arrays is read.
#include "kpool_index.cuh"

namespace kp {
constexpr int kIndexWarps = 4;
constexpr int kIndexThreads = 32 * kIndexWarps;
constexpr int kIndexVectorCache = 1;  // cache pages 16-byte aligned
constexpr int kIndexVectorQ = 2;      // query rows 16-byte aligned
}  // namespace kp

// HEAD_DIM: 64, 128 or 256. MMA: kp::kMmaE4m3 or kp::kMmaF16. VECTOR:
// kIndexVectorCache | kIndexVectorQ. IO, IC: the index types of
// input_row_offsets and cache_lengths.
template <int HEAD_DIM, int MMA, int VECTOR, typename IO, typename IC>
__global__ void __launch_bounds__(kp::kIndexThreads, 2)
    kpool_index_logits_fp8(const unsigned char* __restrict__ q, long long q_token_stride, long long q_head_stride,
                           long long heads, const float* __restrict__ weights, long long weights_stride,
                           const unsigned char* __restrict__ cache, long long page_stride, long long pages,
                           long long block_size, const int* __restrict__ cache_block_table, long long table_columns,
                           long long table_stride, const IO* __restrict__ input_row_offsets,
                           const IC* __restrict__ cache_lengths, long long batch, long long num_tokens, long long kpool,
                           float* __restrict__ out, long long out_stride, long long max_pools,
                           long long tokens_per_block, long long token_tiles) {
    KP_THREADS_COOPERATE(true);
    static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256, "head_dim 64, 128 or 256");
    // Key tiles of 8 a warp: the keys stay at 32 registers; the f16 path at head_dim 128 takes 2 (with 4, ptxas
    // for sm_80 spills: its conversions keep more alive).
    constexpr int NT = HEAD_DIM > 128 || (MMA == kp::kMmaF16 && HEAD_DIM == 128) ? 2 : 4;
    constexpr int kSteps = HEAD_DIM / 32;
    constexpr bool kVectorCache = (VECTOR & kp::kIndexVectorCache) != 0;
    constexpr bool kVectorQ = (VECTOR & kp::kIndexVectorQ) != 0;
    const int lane = static_cast<int>(threadIdx.x % 32), g = lane / 4, t = lane % 4;
    const long long tile = blockIdx.x % token_tiles, pool_tile = blockIdx.x / token_tiles;
    const long long first_pool = pool_tile * (kp::kIndexWarps * NT * 8) + (threadIdx.x / 32) * (NT * 8);
    // The grid covers max_pools in whole blocks: a warp past it writes nothing.
    if (first_pool >= max_pools) return;
    const long long token_begin = tile * tokens_per_block;
    const long long token_end =
        token_begin + tokens_per_block < num_tokens ? token_begin + tokens_per_block : num_tokens;
    const float minus_infinity = kp_bits_to_float(0xff800000u);

    kp::Bytes8 keys[NT][kSteps];
    float scales[NT][2] = {};
    bool present[NT][2] = {};
    long long keys_of = -1;  // the request whose keys the registers hold
    for (long long token = token_begin; token < token_end; ++token) {
        // Everything up to the scores is the same in every lane of the warp.
        // With no request (batch 0) no token is known and nothing of the offsets is read.
        const long long request = batch > 0 ? kp::find_request(input_row_offsets, batch, token) : 0;
        long long row_begin = 0, row_end = 0, cached = 0;
        const bool known =
            batch > 0 &&
            kp::request_rows(input_row_offsets, cache_lengths, request, num_tokens, &row_begin, &row_end, &cached) &&
            token >= row_begin && token < row_end;
        const long long visible = known ? kp::pools_visible(cached, token - row_begin, kpool) : 0;
        if (known && request != keys_of) {
            // Keys up to what the request's last token in this tile sees.
            const long long last = (row_end < token_end ? row_end : token_end) - 1;
            long long reach = kp::pools_visible(cached, last - row_begin, kpool);
            reach = reach < max_pools ? reach : max_pools;
            kp::load_key_tiles<HEAD_DIM, NT, kVectorCache>(first_pool, reach, request, cache, page_stride, pages,
                                                          block_size, cache_block_table, table_columns,
                                                          table_stride, g, t, keys, scales, present);
            keys_of = request;
        }
        float sums[NT][2];
        const bool scores = known && first_pool < visible;
        if (scores)
            kp::score_token<HEAD_DIM, MMA, NT, kVectorQ>(q + token * q_token_stride, q_head_stride, heads,
                                                         weights + token * weights_stride, keys, scales, lane, sums);
        // Lane (g, t) writes keys 2 t and 2 t + 1 of tile g.
        if (g < NT) {
            float value[2] = {0.0f, 0.0f};
            bool have[2] = {false, false};
#pragma unroll
            for (int n = 0; n < NT; ++n)
                if (n == g)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        value[e] = scores ? sums[n][e] : 0.0f;
                        have[e] = present[n][e];
                    }
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const long long pool = first_pool + 8 * g + 2 * t + e;
                if (pool < max_pools)
                    out[token * out_stride + pool] = scores && have[e] && pool < visible ? value[e] : minus_infinity;
            }
        }
    }
}
