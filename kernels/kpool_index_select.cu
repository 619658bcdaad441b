// kpool_index_select_fp8: kpool_index_topk over kpool_index_logits_fp8's
// logits, bit for bit, in one launch and without writing the logits.
//
// One block (8 warps) per token and split of its visible pools. It scores
// its pools a chunk of kSelectChunk at a time into shared memory, each warp
// 8 NT pools a call with the scorer's own routines (kp::load_key_tiles,
// kp::score_token), so each logit has the scorer's bits, and offers the
// chunk to the streaming selection (kp::offer_tile). With one split the
// block writes the token's expanded row; with several each writes its best
// (at most pool_topk keys and ids, ascending id) to the workspace, and the
// last of the token's blocks to finish (an atomicInc that wraps back to 0,
// so the counters stay zero between calls) selects again over those lists
// in split order and writes the row. A split covers whole chunks, so a
// pool's place in its key tile (8 n + g) is the scorer's.
//
// Working memory: shared memory and the workspace, neither grows with the
// context. A token's candidates are its visible pools up to the table's
// reach (table_columns * cache_block_size; a validated call's table reaches
// them all). Every index may be garbage when the caller skipped validation: a
// token outside its request's rows selects nothing, a pool whose page is
// missing scores -inf as in the scorer, a count read back from the
// workspace is clamped to pool_topk, and nothing outside the arrays is read
// or written.
#include "kpool_index.cuh"
#include "kpool_index_wgmma.cuh"
#include "kpool_select.cuh"


// HEAD_DIM, MMA, VECTOR: as kpool_index_logits_fp8 (VECTOR's bits: the
// cache pages, the query rows 16-byte aligned). CAP, IO, IC, PAGED,
// COMPACT: as kpool_index_topk.
template <int HEAD_DIM, int MMA, int VECTOR, int CAP, typename IO, typename IC, bool PAGED, bool COMPACT>
__global__ void __launch_bounds__(kp::kSelectThreads)
    kpool_index_select_fp8(const unsigned char* __restrict__ q, long long q_token_stride, long long q_head_stride,
                           long long heads, const float* __restrict__ weights, long long weights_stride,
                           const unsigned char* __restrict__ cache, long long page_stride, long long pages,
                           long long cache_block_size, const int* __restrict__ cache_block_table,
                           long long table_columns, long long table_stride, const IO* __restrict__ input_row_offsets,
                           const IC* __restrict__ cache_lengths, long long batch, long long num_tokens, long long kpool,
                           long long pool_topk, const int* __restrict__ block_table, long long max_blocks,
                           long long block_table_stride, long long block_size, int* __restrict__ positions,
                           long long width, int* __restrict__ counts, unsigned char* __restrict__ workspace,
                           long long splits) {
    KP_THREADS_COOPERATE(true);
    static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256, "head_dim 64, 128 or 256");
    constexpr int NT = kp::index_key_tiles<HEAD_DIM, MMA>();  // the scorer's
    constexpr int kCalls = kp::kSelectChunk / kp::kSelectWarps / (8 * NT);  // a warp's score_token calls a chunk
    constexpr bool kVectorCache = (VECTOR & 1) != 0;
    constexpr bool kVectorQ = (VECTOR & 2) != 0;
    __shared__ kp::SelectBuffer<CAP> buffer;
    __shared__ float chunk_logits[kp::kSelectChunk];
    const long long token = blockIdx.x / splits, split = blockIdx.x % splits;
    if (token >= num_tokens) return;
    const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
    const int g = lane / 4, t = lane % 4;
    const int k = static_cast<int>(pool_topk);

    // The scorer's rule: the pools a token of a usable request sees.
    const long long request = batch > 0 ? kp::find_request(input_row_offsets, batch, token) : 0;
    long long row_begin = 0, row_end = 0, cached = 0;
    const bool known =
        batch > 0 &&
        kp::request_rows(input_row_offsets, cache_lengths, request, num_tokens, &row_begin, &row_end, &cached) &&
        token >= row_begin && token < row_end;
    long long visible = known ? kp::pools_visible(cached, token - row_begin, kpool) : 0;
    // Candidates stop at the table's reach (as the logits' width stops kpool_index_topk's): with a validated
    // call the table covers every visible pool, and garbage lengths cannot send a block through 2^62 pools.
    const long long reach = table_columns * cache_block_size;
    visible = visible < reach ? visible : reach;
    visible = visible < 2147483647LL ? visible : 2147483647LL;  // pool ids are int32, as the scorer's width
    const bool all = visible <= pool_topk;  // every candidate, nothing scored
    if (all && split != 0) return;          // one block writes the row

    kp::SelectState state;
    if (!all) {
        const long long chunks = (visible + kp::kSelectChunk - 1) / kp::kSelectChunk;
        const long long per_split = (chunks + splits - 1) / splits;
        const long long lo = split * per_split * kp::kSelectChunk;
        const long long hi = lo + per_split * kp::kSelectChunk < visible ? lo + per_split * kp::kSelectChunk : visible;
        const unsigned char* q_token = q + token * q_token_stride;
        const float* w_token = weights + token * weights_stride;
        const float minus_infinity = kp_bits_to_float(0xff800000u);
        if constexpr (MMA == kp::kMmaWgmma) {
            // The token's query rows and weights, staged once for its chunks.
            KP_DYNAMIC_SHARED(dynamic);
            const kp::WgmmaSelectShared<HEAD_DIM> shared(dynamic, heads);
            const int head_count = static_cast<int>(heads);
            const int token_rows = (head_count + kp::kWgmmaRows - 1) / kp::kWgmmaRows * kp::kWgmmaRows;
            for (int h = static_cast<int>(threadIdx.x); h < token_rows; h += kp::kSelectThreads)
                shared.weights[h] = h < head_count ? w_token[h] : 0.0f;
            kp::wgmma_stage_queries<HEAD_DIM, kp::kSelectThreads, kVectorQ>(
                q, q_token_stride, q_head_stride, head_count, token, 1, token_rows, static_cast<int>(threadIdx.x),
                reinterpret_cast<uint4*>(shared.queries));
        }
        for (long long base = lo; base < hi; base += kp::kSelectChunk) {
            if constexpr (MMA == kp::kMmaWgmma) {
                // Warpgroup `group` scores pools base + kHalf group + N c, c < kChains, with the scorer's routine:
                // every thread takes every step (the barriers), a chain past hi scores nothing.
                constexpr int N = kp::wgmma_keys<HEAD_DIM>();
                constexpr int kHalf = kp::kSelectChunk / kp::kWgmmaSelectGroups;
                constexpr int kChains = kHalf / N;
                static_assert(kp::kSelectThreads == kp::kWgmmaSelectGroups * kp::kWgmmaThreads,
                              "a warpgroup a half chunk");
                static_assert(kHalf % N == 0, "whole chains: a pool's column is its id modulo N, as the scorer's");
                const int group = static_cast<int>(threadIdx.x) / kp::kWgmmaThreads;
                const int member = static_cast<int>(threadIdx.x) % kp::kWgmmaThreads;
                KP_DYNAMIC_SHARED(dynamic);
                const kp::WgmmaSelectShared<HEAD_DIM> shared(dynamic, heads);
                unsigned char* const key_tile = shared.key_tile(group);
                float* const key_scale = shared.key_scale(group);
                int* const key_present = shared.key_present(group);
                float* const partial = shared.partial(group);
                const int tiles = (static_cast<int>(heads) + kp::kWgmmaRows - 1) / kp::kWgmmaRows;
                for (int c = 0; c < kChains; ++c) {
                    const long long first_pool = base + kHalf * group + N * c;
                    const bool scores = first_pool < hi;  // the same in every thread of the warpgroup
                    if (scores) {
                        kp::WgmmaKeyPart<HEAD_DIM> part;
                        kp::wgmma_find_key_pages<HEAD_DIM>(first_pool, hi, cache_block_table + request * table_stride,
                                                           table_columns, kp::block_size32(cache_block_size), member,
                                                           part);
                        kp::wgmma_load_key_part<HEAD_DIM, kVectorCache>(cache, page_stride, pages, cache_block_size,
                                                                        member, part);
                        kp::wgmma_store_key_part<HEAD_DIM>(part, member, key_tile, key_scale, key_present);
                    }
                    kp_fence_proxy_async();
                    __syncthreads();
                    if (scores)
                        kp::wgmma_head_sums<HEAD_DIM>(shared.queries, tiles, static_cast<int>(heads), shared.weights,
                                                      key_tile, key_scale, member, partial);
                    __syncthreads();
                    if (scores && member < N && first_pool + member < hi)
                        chunk_logits[first_pool + member - base] =
                            key_present[member] != 0 ? kp::wgmma_logit<HEAD_DIM>(partial, member) : minus_infinity;
                    __syncthreads();  // the next chain's stores wait for these reads
                }
            }
            for (int call = 0; call < (MMA == kp::kMmaWgmma ? 0 : kCalls); ++call) {
                const long long first_pool = base + (warp * kCalls + call) * (8 * NT);
                if (first_pool >= hi) break;  // the same in every lane of the warp
                kp::Bytes8 keys[NT][HEAD_DIM / 32];
                float scales[NT][2];
                bool present[NT][2];
                kp::load_key_tiles<HEAD_DIM, NT, kVectorCache>(first_pool, hi, request, cache, page_stride, pages,
                                                              cache_block_size, cache_block_table, table_columns,
                                                              table_stride, g, t, keys, scales, present);
                float sums[NT][2];
                kp::score_token<HEAD_DIM, MMA, NT, kVectorQ>(q_token, q_head_stride, heads, w_token, keys, scales,
                                                             lane, sums);
                // Lane (g, t) keeps keys 2 t and 2 t + 1 of tile g, as the scorer writes them.
                if (g < NT) {
#pragma unroll
                    for (int n = 0; n < NT; ++n)
                        if (n == g)
#pragma unroll
                            for (int e = 0; e < 2; ++e)
                                chunk_logits[first_pool - base + 8 * n + 2 * t + e] =
                                    present[n][e] ? sums[n][e] : minus_infinity;
                }
            }
            __syncthreads();
            const int count = hi - base < kp::kSelectChunk ? static_cast<int>(hi - base) : kp::kSelectChunk;
            kp::SelectTile<1> tile;
#pragma unroll
            for (int e = 0; e < kp::kSelectPerThread; ++e) {
                const int offset = kp::tile_offset<1>(0, e);
                tile.keys[0][e] = offset < count ? kp::order_key(chunk_logits[offset]) : 0u;
            }
            kp::offer_tile(buffer, state, tile, count, k,  // its barriers free chunk_logits
                           [base](int, int e) { return static_cast<int>(base + kp::tile_offset<1>(0, e)); });
        }
        kp::finish_selection(buffer, state, k);
        if (!kp::gather_splits(buffer, state, workspace, num_tokens, token, split, splits, pool_topk)) return;
    }
    const long long selected = all ? visible : (state.count < k ? state.count : k);
    kp::write_selection<PAGED, COMPACT>(buffer, all, selected, token, input_row_offsets, cache_lengths, batch,
                                        num_tokens, kpool, pool_topk, block_table, max_blocks, block_table_stride,
                                        block_size, positions, width, counts);
}
