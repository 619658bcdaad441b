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
// One block per tile of tokens_per_block consecutive tokens and range of
// pools_per_block pools (the token tiles fastest in the grid, so the tiles
// of one range meet its keys in L2). A block first reads its tokens' query
// rows and weights and the first nine steps of their request search
// (kp::RequestTree) into shared memory, all in one round trip, then finds
// each token's request and the pools it sees there (one lane a token;
// batches past 512 requests take their last steps from global memory).
// Then each of its 4 warps walks its key tiles of 8 NT pools through the
// range, scoring every token of the tile against each (kp::score_token): a
// warp reads the keys of a request once for all of that request's tokens in
// the tile, and loads the keys of its next tile and the pages of the one
// after while it scores this one. Pool arithmetic inside the walk is 32-bit (pool ids are int32).
//
// Every index may be garbage when the caller skipped validation: a token
// outside its request's rows sees nothing, a pool whose page is missing or
// out of range scores -inf, and nothing outside the arrays is read.
#include "kpool_index.cuh"
#include "kpool_index_wgmma.cuh"

namespace kp {
constexpr int kIndexWarps = 4;
constexpr int kIndexThreads = 32 * kIndexWarps;
constexpr int kIndexVectorCache = 1;  // cache pages 16-byte aligned
constexpr int kIndexVectorQ = 2;      // query rows 16-byte aligned
constexpr int kIndexTileTokens = 16;  // the most tokens a block's tile holds
constexpr int kIndexMaxHeads = 128;   // ops.families.scoring.MAX_HEADS
// Shared memory for the tile's query rows: each row HEAD_DIM bytes and 16 of
// padding (the lanes of a 16-byte shared load then hit distinct banks); one
// token of 128 heads at head_dim 256 fits. ops/index_logits_fp8.py sizes
// tiles to it.
constexpr int kIndexStageBytes = 36864;
constexpr int kIndexStageWeights = kIndexStageBytes / (64 + 16);  // the most (token, head) rows the stage holds
// The sm_90a path's stage for the tile's query rows: chunks of 64 rows, 4 at
// head_dim 128, so a token of 128 heads fits at head_dim 256.
constexpr int kWgmmaStageBytes = 32768;
}  // namespace kp

// The kernel's parameters, which both paths' bodies take.
#define KP_INDEX_LOGITS_PARAMS                                                                                    \
    const unsigned char* __restrict__ q, long long q_token_stride, long long q_head_stride, long long heads,      \
        const float* __restrict__ weights, long long weights_stride, const unsigned char* __restrict__ cache,     \
        long long page_stride, long long pages, long long block_size, const int* __restrict__ cache_block_table, \
        long long table_columns, long long table_stride, const IO* __restrict__ input_row_offsets,               \
        const IC* __restrict__ cache_lengths, long long batch, long long num_tokens, long long kpool,             \
        float* __restrict__ out, long long out_stride, long long max_pools, long long tokens_per_block,          \
        long long token_tiles, long long pools_per_block
#define KP_INDEX_LOGITS_ARGS                                                                                      \
    q, q_token_stride, q_head_stride, heads, weights, weights_stride, cache, page_stride, pages, block_size,      \
        cache_block_table, table_columns, table_stride, input_row_offsets, cache_lengths, batch, num_tokens,      \
        kpool, out, out_stride, max_pools, tokens_per_block, token_tiles, pools_per_block

namespace kp {

// The mma.sync paths (MMA kp::kMmaE4m3, kp::kMmaE4m3Hmma or kp::kMmaF16): each warp scores its key tiles with
// kp::score_token.
template <int HEAD_DIM, int MMA, int VECTOR, typename IO, typename IC>
__device__ __forceinline__ void index_logits_mma(KP_INDEX_LOGITS_PARAMS) {
    constexpr int NT = kp::index_key_tiles<HEAD_DIM, MMA>();
    constexpr int kSteps = HEAD_DIM / 32;
    constexpr int kTilePools = 8 * NT;               // a warp's key tiles
    constexpr int kPitch = HEAD_DIM + 16;            // a staged query row
    constexpr int kPieces = HEAD_DIM / 16;           // 16-byte pieces of a query row
    constexpr int kStageRound = 8;                   // pieces a thread loads before it stores them
    constexpr bool kVectorCache = (VECTOR & kp::kIndexVectorCache) != 0;
    constexpr bool kVectorQ = (VECTOR & kp::kIndexVectorQ) != 0;
    __shared__ uint4 q_words[kp::kIndexStageBytes / 16];  // 16-byte aligned
    unsigned char* const q_stage = reinterpret_cast<unsigned char*>(q_words);
    __shared__ float w_stage[kp::kIndexStageWeights];
    __shared__ kp::RequestTree tree;
    __shared__ long long token_request[kp::kIndexTileTokens];  // -1: the token sees nothing
    __shared__ long long token_visible[kp::kIndexTileTokens];  // pools it sees, at most max_pools
    __shared__ long long token_reach[kp::kIndexTileTokens];    // pools its request's tokens in the tile see

    // The launcher's tiling (ops/index_logits_fp8.py): a tile the stage cannot hold writes nothing.
    if (tokens_per_block < 1 || tokens_per_block > kp::kIndexTileTokens || heads < 1 ||
        heads > kp::kIndexMaxHeads || tokens_per_block * heads * kPitch > kp::kIndexStageBytes ||
        pools_per_block < 1 || token_tiles < 1 || token_tiles > 2147483647LL)
        return;
    // 32-bit from here to the walk's end where a value allows: the grid, the tile and the stage are below 2^31.
    const unsigned int block = blockIdx.x, tiles = static_cast<unsigned int>(token_tiles);
    const long long tile = block % tiles, range = block / tiles;
    const long long range_lo = range * pools_per_block;
    if (range_lo >= max_pools) return;  // the grid covers max_pools in whole ranges
    const long long range_hi = range_lo + pools_per_block < max_pools ? range_lo + pools_per_block : max_pools;
    const long long token_begin = tile * tokens_per_block;
    const int tokens = static_cast<int>(
        token_begin + tokens_per_block < num_tokens ? tokens_per_block : num_tokens - token_begin);
    if (tokens <= 0) return;
    const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
    const int g = lane / 4, t = lane % 4;
    const float minus_infinity = kp_bits_to_float(0xff800000u);

    // The tile's query rows, weights and the first steps of its tokens' request search, read by the whole block
    // into shared memory once for every warp and key tile of the range: every load of a round issued before any
    // is used, so a decode tile's are one round trip.
    const int thread = static_cast<int>(threadIdx.x);
    const int head_count = static_cast<int>(heads), rows = tokens * head_count, pieces = rows * kPieces;
    kp::TreePart<kp::kIndexThreads, IO, IC> tree_part;
    kp::load_request_tree<kp::kIndexThreads, IO, IC>(input_row_offsets, cache_lengths, batch, thread, tree_part);
    float w[kp::kIndexStageWeights / kp::kIndexThreads + 1];
#pragma unroll
    for (int k = 0; k < kp::kIndexStageWeights / kp::kIndexThreads + 1; ++k) {
        const int i = thread + k * kp::kIndexThreads;
        const unsigned int token = static_cast<unsigned int>(i) / head_count;
        w[k] = i < rows ? weights[(token_begin + token) * weights_stride + (i - token * head_count)] : 0.0f;
    }
    for (int first = 0; first < pieces; first += kp::kIndexThreads * kStageRound) {
        uint4 v[kStageRound];
#pragma unroll
        for (int k = 0; k < kStageRound; ++k) {
            const int i = first + k * kp::kIndexThreads + thread;
            const int row = i / kPieces, piece = i % kPieces;
            const unsigned int token = static_cast<unsigned int>(row) / head_count;
            const unsigned int head = static_cast<unsigned int>(row) - token * head_count;
            const unsigned char* from = q + (token_begin + token) * q_token_stride + head * q_head_stride + 16 * piece;
            v[k].x = v[k].y = v[k].z = v[k].w = 0u;
            if (i >= pieces) continue;
            v[k] = kp::load_piece16<kVectorQ>(from);
        }
#pragma unroll
        for (int k = 0; k < kStageRound; ++k) {
            const int i = first + k * kp::kIndexThreads + thread;
            if (i < pieces) *reinterpret_cast<uint4*>(q_stage + (i / kPieces) * kPitch + 16 * (i % kPieces)) = v[k];
        }
    }
#pragma unroll
    for (int k = 0; k < kp::kIndexStageWeights / kp::kIndexThreads + 1; ++k) {
        const int i = thread + k * kp::kIndexThreads;
        if (i < rows) w_stage[i] = w[k];
    }
    kp::store_request_tree<kp::kIndexThreads, IO, IC>(tree_part, thread, tree);
    __syncthreads();
    kp::find_tile_tokens<IO, IC>(tree, input_row_offsets, cache_lengths, batch, num_tokens, kpool, max_pools,
                                 token_begin, tokens, thread, token_request, token_visible, token_reach);

    // The warp's key tiles: first_pool, first_pool + kStride, ... below range_hi. The request of the tile's
    // first token leads: its keys are loaded a tile ahead, the pages two.
    constexpr int kStride = kp::kIndexWarps * kTilePools;
    const long long lead = token_request[0];
    const long long lead_reach = lead >= 0 ? token_reach[0] : 0;
    const int* lead_table = cache_block_table + (lead >= 0 ? lead : 0) * table_stride;
    const kp::PageSize page_size = kp::page_size_of(block_size);
    kp::KeyPages<NT> next_pages;
    kp::Bytes8 keys[NT][kSteps], next_keys[NT][kSteps] = {};
    float scale[NT], next_scale[NT] = {};
    bool have[NT], next_have[NT] = {};
    long long first_pool = range_lo + warp * kTilePools;
    if (lead >= 0 && first_pool < range_hi) {
        kp::find_key_pages<NT>(first_pool, lead_reach, lead_table, table_columns, page_size, g, next_pages);
        kp::load_key_rows<HEAD_DIM, NT, kVectorCache>(next_pages, cache, page_stride, pages, block_size, t,
                                                      next_keys, next_scale, next_have);
        kp::find_key_pages<NT>(first_pool + kStride, lead_reach, lead_table, table_columns, page_size, g,
                               next_pages);
    }
    for (; first_pool < range_hi; first_pool += kStride) {
        // This tile's lead keys, loaded a tile ago; the next tile's asked for now.
        long long keys_of = lead;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int s = 0; s < kSteps; ++s) keys[n][s] = next_keys[n][s];
            scale[n] = next_scale[n];
            have[n] = next_have[n];
        }
        if (lead >= 0 && first_pool + kStride < range_hi) {
            kp::load_key_rows<HEAD_DIM, NT, kVectorCache>(next_pages, cache, page_stride, pages, block_size, t,
                                                          next_keys, next_scale, next_have);
            kp::find_key_pages<NT>(first_pool + 2 * kStride, lead_reach, lead_table, table_columns, page_size, g,
                                   next_pages);
        }
        float scales[NT][2];
        bool present[NT][2];
        kp::share_key_scales<NT>(scale, have, t, scales, present);
        kp::KeyOperands<HEAD_DIM, MMA, NT> operands;
        kp::key_operands<HEAD_DIM, MMA, NT>(keys, operands);
        for (int j = 0; j < tokens; ++j) {
            const long long request = token_request[j], visible = token_visible[j];
            const bool scores = request >= 0 && first_pool < visible;
            if (scores && request != keys_of) {
                // A token of another request than the lead's (a tile across requests): its keys now.
                kp::load_key_tiles<HEAD_DIM, NT, kVectorCache>(first_pool, token_reach[j], request, cache,
                                                              page_stride, pages, block_size, page_size,
                                                              cache_block_table,
                                                              table_columns, table_stride, g, t, keys, scales,
                                                              present);
                kp::key_operands<HEAD_DIM, MMA, NT>(keys, operands);
                keys_of = request;
            }
            float own[2] = {0.0f, 0.0f};
            if (scores)
                kp::score_token<HEAD_DIM, MMA, NT, true>(q_stage + j * head_count * kPitch, kPitch, heads,
                                                         w_stage + j * head_count, operands, scales, lane, own);
            // Lane (g, t) writes keys 2 t and 2 t + 1 of tile g.
            if (g < NT) {
                bool there[2];
                kp::own_tile_present<NT>(present, g, there);
                float* row = out + (token_begin + j) * out_stride;
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const long long pool = first_pool + 8 * g + 2 * t + e;
                    if (pool < range_hi)
                        row[pool] = scores && there[e] && pool < visible ? own[e] : minus_infinity;
                }
            }
        }
    }
}


// The sm_90a path (MMA kp::kMmaWgmma): the block is one warpgroup, and each
// key tile of 64 pools (kp::wgmma_keys) is staged in shared memory once and
// scored against every token of the tile by kp::wgmma_key_logits, the keys on
// the M side and each token's heads on N; a key's logit ends in the 4
// threads of its row, which write it. The lead request's key tiles stream
// through a ring of kWgmmaStages slots in dynamic shared memory
// (kp::WgmmaScorerShared): each thread copies its pieces of the tile
// kWgmmaStages - 1 ahead with cp.async (a group a tile) while the tensor
// cores score this one, its pages found a tile before that, so no load waits
// on the one before it; one barrier a tile (two more where a token of another
// request loads the spare tile). Where the pages hold a multiple
// of 64 pools (the engines' 64) a tile lies in one page: its page is read
// and its address made once a tile (kp::wgmma_find_tile_page,
// kp::wgmma_copy_tile_page), not once a row. A token of another request loads
// its keys on the spot into a spare tile, as on the mma.sync path. The
// tile's query rows and weights sit in the same dynamic memory, each token's
// heads padded with zero rows to whole chunks of 64.
template <int HEAD_DIM, int VECTOR, typename IO, typename IC>
__device__ __forceinline__ void index_logits_wgmma(KP_INDEX_LOGITS_PARAMS) {
    constexpr int N = wgmma_keys<HEAD_DIM>();
    constexpr int kStages = kWgmmaStages;
    constexpr int kStageTiles = kWgmmaStageBytes / (kWgmmaRows * HEAD_DIM);  // chunks of 64 query rows
    constexpr bool kVectorCache = (VECTOR & kIndexVectorCache) != 0;
    constexpr bool kVectorQ = (VECTOR & kIndexVectorQ) != 0;
    static_assert(kWgmmaThreads == kIndexThreads, "the block is one warpgroup");
    __shared__ RequestTree tree;
    __shared__ long long token_request[kIndexTileTokens];  // -1: the token sees nothing
    __shared__ long long token_visible[kIndexTileTokens];  // pools it sees, at most max_pools
    __shared__ long long token_reach[kIndexTileTokens];    // pools its request's tokens in the tile see

    // The launcher's tiling (ops/index_logits_fp8.py, which sizes the dynamic memory by the same rule): a tile
    // the stage cannot hold writes nothing.
    if (heads < 1 || heads > kIndexMaxHeads || tokens_per_block < 1 || tokens_per_block > kIndexTileTokens ||
        tokens_per_block * ((heads + kWgmmaRows - 1) / kWgmmaRows) > kStageTiles || pools_per_block < 1 ||
        token_tiles < 1 || token_tiles > 2147483647LL)
        return;
    KP_DYNAMIC_SHARED(dynamic);
    const WgmmaScorerShared<HEAD_DIM> shared(dynamic, heads, tokens_per_block);
    const unsigned int block = blockIdx.x, tiles = static_cast<unsigned int>(token_tiles);
    const long long tile = block % tiles, range = block / tiles;
    const long long range_lo = range * pools_per_block;
    if (range_lo >= max_pools) return;  // the grid covers max_pools in whole ranges
    const long long range_hi = range_lo + pools_per_block < max_pools ? range_lo + pools_per_block : max_pools;
    const long long token_begin = tile * tokens_per_block;
    const int tokens = static_cast<int>(
        token_begin + tokens_per_block < num_tokens ? tokens_per_block : num_tokens - token_begin);
    if (tokens <= 0) return;
    const int thread = static_cast<int>(threadIdx.x);
    const int head_count = static_cast<int>(heads);
    const int token_chunks = (head_count + kWgmmaRows - 1) / kWgmmaRows;  // chunks of 64 heads a token
    const int token_rows = token_chunks * kWgmmaRows, rows = tokens * token_rows;
    const float minus_infinity = kp_bits_to_float(0xff800000u);

    // The prologue, one round trip: the tree, the weights and the query rows (piece i of the stage at byte 16 i).
    TreePart<kIndexThreads, IO, IC> tree_part;
    load_request_tree<kIndexThreads, IO, IC>(input_row_offsets, cache_lengths, batch, thread, tree_part);
    constexpr int kWeightRounds = (kStageTiles * kWgmmaRows + kIndexThreads - 1) / kIndexThreads;
    float w[kWeightRounds];
#pragma unroll
    for (int k = 0; k < kWeightRounds; ++k) {
        const int i = thread + k * kIndexThreads;
        const unsigned int token = static_cast<unsigned int>(i) / token_rows;
        const int head = i - static_cast<int>(token) * token_rows;
        w[k] = i < rows && head < head_count ? weights[(token_begin + token) * weights_stride + head] : 0.0f;
    }
    wgmma_stage_queries<HEAD_DIM, kIndexThreads, kVectorQ>(q, q_token_stride, q_head_stride, head_count, token_begin,
                                                          tokens, tokens, token_rows, thread,
                                                          reinterpret_cast<uint4*>(shared.queries));
#pragma unroll
    for (int k = 0; k < kWeightRounds; ++k) {
        const int i = thread + k * kIndexThreads;
        if (i < rows) shared.weights[i] = w[k];
    }
    store_request_tree<kIndexThreads, IO, IC>(tree_part, thread, tree);
    __syncthreads();
    find_tile_tokens<IO, IC>(tree, input_row_offsets, cache_lengths, batch, num_tokens, kpool, max_pools,
                             token_begin, tokens, thread, token_request, token_visible, token_reach);

    // The block's key tiles: range_lo + N x for x = 0, 1, ... below range_hi. Every thread commits one group of
    // copies a tile (empty where there is nothing to copy), kStages - 1 before the walk: at tile x, waiting for
    // all but the newest kStages - 2 completes tile x's.
    const long long lead = token_request[0];
    const long long lead_reach = lead >= 0 ? token_reach[0] : 0;
    const int* lead_table = cache_block_table + (lead >= 0 ? lead : 0) * table_stride;
    const PageSize page_size = page_size_of(block_size);
    const int walk = static_cast<int>((range_hi - range_lo + N - 1) / N);
    WgmmaTileWhere<HEAD_DIM> next;  // where the next tile to copy lies
    // Pages of a multiple of 64 pools (the engines' 64) and 16-byte aligned: each tile lies in one page (range_lo
    // and N are multiples of 64), found and copied from once. The same in every thread.
    const bool one_page = kVectorCache && page_size.size % static_cast<unsigned int>(N) == 0u && range_lo % N == 0;
    const WgmmaTileSource<HEAD_DIM, kVectorCache> source{cache,      page_stride,   pages,      block_size,
                                                         lead_table, table_columns, lead_reach, page_size,
                                                         thread,     one_page};
    if (lead >= 0) {
        WgmmaTileWhere<HEAD_DIM> first[kStages - 1];
#pragma unroll
        for (int x = 0; x < kStages - 1; ++x) source.find(range_lo + N * x, first[x]);
        source.find(range_lo + N * (kStages - 1), next);
#pragma unroll
        for (int x = 0; x < kStages - 1; ++x) {
            if (x < walk) source.copy(first[x], shared.key_tile(x), shared.key_scale(x), shared.key_present(x));
            kp_cp_async_commit();
        }
    }
    for (int x = 0; x < walk; ++x) {
        const long long first_pool = range_lo + static_cast<long long>(N) * x;
        const int slot = x % kStages;
        long long keys_of = -1;  // whose keys the slot holds
        if (lead >= 0) {
            kp_cp_async_wait<kStages - 2>();  // this thread's copies of tile x
            keys_of = lead;
        }
        kp_fence_proxy_async();
        __syncthreads();  // every thread's copies of tile x; every read of the slot refilled below done
        if (lead >= 0) {
            const int ahead = x + kStages - 1;
            if (ahead < walk) {
                source.copy(next, shared.key_tile(ahead % kStages), shared.key_scale(ahead % kStages),
                            shared.key_present(ahead % kStages));
                source.find(range_lo + static_cast<long long>(N) * (ahead + 1), next);
            }
            kp_cp_async_commit();
        }
        long long spare_of = -1;  // whose keys the spare tile holds
        const int row = wgmma_written_row(thread);  // the key this thread writes
        for (int j = 0; j < tokens; ++j) {
            const long long request = token_request[j], visible = token_visible[j];
            const bool scores = request >= 0 && first_pool < visible;
            const bool spare = request != keys_of;  // the same in every thread
            if (scores && spare && request != spare_of) {
                // A token of another request than the slot's keys: its keys now, into the spare tile, once every
                // wgmma that read the spare tile's last keys is done.
                WgmmaKeyPart<HEAD_DIM> other;
                wgmma_find_key_pages<HEAD_DIM>(first_pool, token_reach[j], cache_block_table + request * table_stride,
                                               table_columns, page_size, thread, other);
                wgmma_load_key_part<HEAD_DIM, kVectorCache>(cache, page_stride, pages, block_size, thread, other);
                __syncthreads();
                wgmma_store_key_part<HEAD_DIM>(other, thread, shared.key_tile(kStages), shared.key_scale(kStages),
                                               shared.key_present(kStages));
                kp_fence_proxy_async();
                __syncthreads();
                spare_of = request;
            }
            const int from = spare ? kStages : slot;
            float logit[2] = {0.0f, 0.0f};
            if (scores)
                wgmma_key_logits<HEAD_DIM>(shared.queries + j * token_rows * HEAD_DIM, token_chunks, head_count,
                                           shared.weights + j * token_rows, shared.key_tile(from),
                                           shared.key_scale(from), thread, logit);
            const long long pool = first_pool + row;
            if (wgmma_writes_a_logit(thread) && pool < range_hi)
                out[(token_begin + j) * out_stride + pool] =
                    scores && shared.key_present(from)[row] != 0 && pool < visible ? wgmma_written_logit(logit, thread)
                                                                                   : minus_infinity;
        }
    }
    kp_cp_async_wait<0>();  // nothing is left in flight (the last groups are empty)
}

}  // namespace kp

// HEAD_DIM: 64, 128 or 256. MMA: kp::kMmaE4m3, kp::kMmaE4m3Hmma, kp::kMmaF16
// or (an sm_90a build) kp::kMmaWgmma. VECTOR: kIndexVectorCache | kIndexVectorQ. IO, IC:
// the index types of input_row_offsets and cache_lengths.
template <int HEAD_DIM, int MMA, int VECTOR, typename IO, typename IC>
__global__ void __launch_bounds__(kp::kIndexThreads, MMA == kp::kMmaWgmma ? 4 : 2)
    kpool_index_logits_fp8(KP_INDEX_LOGITS_PARAMS) {
    KP_THREADS_COOPERATE(true);
    static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256, "head_dim 64, 128 or 256");
    if constexpr (MMA == kp::kMmaWgmma)
        kp::index_logits_wgmma<HEAD_DIM, VECTOR, IO, IC>(KP_INDEX_LOGITS_ARGS);
    else
        kp::index_logits_mma<HEAD_DIM, MMA, VECTOR, IO, IC>(KP_INDEX_LOGITS_ARGS);
}
