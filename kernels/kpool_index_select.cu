// kpool_index_select_fp8: kpool_index_topk over kpool_index_logits_fp8's
// logits, bit for bit, in one launch and without writing the logits.
//
// One block (8 warps) per group of up to kSelectGroupTokens consecutive
// tokens (the host's group_tokens) and split of their visible pools. The
// group's tokens of one request (a run) share its keys: the block loads
// each chunk of kSelectChunk pools once and scores it for every token of
// the run that sees into it, each warp 8 NT pools a call with the scorer's
// own routines (kp::load_key_tiles, kp::score_token; on sm_90a each of two
// warpgroups streams tiles of 64 keys through its ring with cp.async and
// runs kp::wgmma_key_logits per token), so each logit
// has the scorer's bits and a request's keys are read once a step whatever
// its next_n. Each token offers its chunk of logits to its own streaming
// selection (kp::offer_tile, a kp::SelectBuffer a token). With one split
// the block writes each token's expanded row; with several it writes each
// token's best (at most pool_topk keys and ids, ascending id) to the
// workspace, and the last of a token's blocks to finish (an atomicInc that
// wraps back to 0, so the counters stay zero between calls) selects again
// over that token's lists in split order and writes its row. The splits
// cut the run's longest range (its last scoring token's pools) into whole
// chunks, so a pool's place in its key tile (8 n + g) is the scorer's; a
// token's candidates in a split are the split's pools it sees. The
// selection's result does not depend on how the candidates were split.
//
// Working memory: dynamic shared memory (the tokens' buffers and chunks,
// kp::SelectGroupShared, then the sm_90a path's tiles and query rows) and
// the workspace; neither grows with the context. A token's candidates are
// its visible pools up to the table's reach (table_columns *
// cache_block_size; a validated call's table reaches them all). Every index
// may be garbage when the caller skipped validation: a token outside its
// request's rows selects nothing, a pool whose page is missing scores -inf
// as in the scorer, a count read back from the workspace is clamped to
// pool_topk, and nothing outside the arrays is read or written.
#include "kpool_index.cuh"
#include "kpool_index_wgmma.cuh"
#include "kpool_select.cuh"

namespace kp {

constexpr int kSelectGroupTokens = 4;  // the most tokens a block selects for (kernel/geometry.py: SELECT_GROUP_TOKENS)
// A token with this many times the seed's chunks' worth of candidates in a split or more (3,072 at pool_topk
// 1,024 or less, a chunk's seed; 6,144 to 12,288 above, 2 to 4 chunks'): passes over the seed's chunks first
// find its starting threshold (below). At 3 they add a third at most to the chunks scored, and a rising row of
// 3 chunks would cut back once or twice without them.
constexpr int kSeedChunks = 3;

// The selection's part of the fused select's dynamic shared memory, first in
// it: `tokens` buffers, each at a multiple of 128 bytes, then each token's
// chunk of logits (kernel/geometry.py's index_select_shared_bytes mirrors
// kBufferBytes and kTokenBytes).
template <int CAP>
struct SelectGroupShared {
    static constexpr int kBufferBytes = (static_cast<int>(sizeof(SelectBuffer<CAP>)) + 127) / 128 * 128;
    static constexpr int kTokenBytes = kBufferBytes + kSelectChunk * 4;
    unsigned char* base;
    int tokens;
    __device__ __forceinline__ SelectBuffer<CAP>& buffer(int j) const {
        return *reinterpret_cast<SelectBuffer<CAP>*>(base + j * kBufferBytes);
    }
    __device__ __forceinline__ float* logits(int j) const {
        return reinterpret_cast<float*>(base + tokens * kBufferBytes) + j * kSelectChunk;
    }
    __device__ __forceinline__ unsigned char* end() const { return base + tokens * kTokenBytes; }
};

}  // namespace kp


// HEAD_DIM, MMA, VECTOR: as kpool_index_logits_fp8 (VECTOR's bits: the
// cache pages, the query rows 16-byte aligned; on sm_90a, 4: a key tile in
// one page, 8: tokens paired). CAP, IO, IC, PAGED, COMPACT: as
// kpool_index_topk. group_tokens: the tokens a block selects
// for (1 to kSelectGroupTokens; the dynamic shared memory holds as many).
// On sm_90a, 2 blocks an SM: at most 128 registers. The mma.sync paths
// take more than 128 and hold 1 block an SM; saying so lets ptxas take up to
// 255 (with no count it held some head_dim-64 builds to 128, and spilled in
// the chunk loop once a warp's next tile waited in registers).
template <int HEAD_DIM, int MMA, int VECTOR, int CAP, typename IO, typename IC, bool PAGED, bool COMPACT>
__global__ void __launch_bounds__(kp::kSelectThreads, MMA == kp::kMmaWgmma ? 2 : 1)
    kpool_index_select_fp8(const unsigned char* __restrict__ q, long long q_token_stride, long long q_head_stride,
                           long long heads, const float* __restrict__ weights, long long weights_stride,
                           const unsigned char* __restrict__ cache, long long page_stride, long long pages,
                           long long cache_block_size, const int* __restrict__ cache_block_table,
                           long long table_columns, long long table_stride, const IO* __restrict__ input_row_offsets,
                           const IC* __restrict__ cache_lengths, long long batch, long long num_tokens, long long kpool,
                           long long pool_topk, const int* __restrict__ block_table, long long max_blocks,
                           long long block_table_stride, long long block_size, int* __restrict__ positions,
                           long long width, int* __restrict__ counts, unsigned char* __restrict__ workspace,
                           long long splits, long long group_tokens) {
    KP_THREADS_COOPERATE(true);
    static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256, "head_dim 64, 128 or 256");
    constexpr int NT = kp::index_key_tiles<HEAD_DIM, MMA>();  // the scorer's
    constexpr int kCalls = kp::kSelectChunk / kp::kSelectWarps / (8 * NT);  // a warp's score_token calls a chunk
    constexpr bool kVectorCache = (VECTOR & 1) != 0;
    constexpr bool kVectorQ = (VECTOR & 2) != 0;
    // sm_90a: each key tile of 64 pools lies in one page (kp::WgmmaTileSource's one_page), found and copied from
    // once; the host sets the bit where the cache is 16-byte aligned and its pages hold a multiple of 64 pools. A
    // compile-time choice: with both ways in one kernel, chosen at run time, ptxas spilled at the 128 registers
    // two blocks an SM allow (24 bytes; it wanted 156 unbounded, 152 and 144 for each way alone).
    constexpr bool kTilePages = MMA == kp::kMmaWgmma && kVectorCache && (VECTOR & 4) != 0;
    // sm_90a: tokens of at most kWgmmaPairHeads heads each stage half a chunk of query rows, so two share a chain
    // (kp::wgmma_pair_logits: the tensor cores' work of one token), the host setting the bit where the heads fit.
    // Compile-time as kTilePages: the step then holds one of the two routines.
    constexpr bool kPaired = MMA == kp::kMmaWgmma && (VECTOR & 8) != 0;
    const int slots = group_tokens < 1 ? 1 : (group_tokens > kp::kSelectGroupTokens ? kp::kSelectGroupTokens
                                                                                    : static_cast<int>(group_tokens));
    // The host's rules for kTilePages and kPaired: a launch that breaks one writes nothing rather than copy a tile
    // across pages or score a token's heads past its half of a chain.
    if (kTilePages && kp::block_size32(cache_block_size) % static_cast<unsigned int>(kp::kWgmmaRows) != 0u) return;
    if (kPaired && heads > kp::kWgmmaPairHeads) return;
    // 32-bit: the grid is, and a division less (the host launches splits >= 1).
    const unsigned int block = blockIdx.x, split_count = static_cast<unsigned int>(splits);
    const long long group = block / split_count, split = block % split_count;
    const long long first_token = group * slots;
    if (first_token >= num_tokens) return;
    const int tokens = num_tokens - first_token < slots ? static_cast<int>(num_tokens - first_token) : slots;
    const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
    const int g = lane / 4, t = lane % 4;
    const int k = static_cast<int>(pool_topk);
    const float minus_infinity = kp_bits_to_float(0xff800000u);
    KP_DYNAMIC_SHARED(dynamic);
    const kp::SelectGroupShared<CAP> held{dynamic, slots};

    // The scorer's rule for each token, one thread a token: the request, and the pools it sees (0 for a token of
    // no usable request). A token that sees at most pool_topk takes them all: nothing scored.
    __shared__ long long token_request[kp::kSelectGroupTokens];
    __shared__ long long token_visible[kp::kSelectGroupTokens];
    // Each token's selection state between its offers: every thread takes a copy for an offer, thread 0 puts it
    // back after (every thread has read it by then: offer_tile meets at a barrier first).
    __shared__ kp::SelectState token_state[kp::kSelectGroupTokens];
    if (static_cast<int>(threadIdx.x) < kp::kSelectGroupTokens) token_state[threadIdx.x] = kp::SelectState{};
    if (static_cast<int>(threadIdx.x) < tokens) {
        const long long token = first_token + threadIdx.x;
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
        token_request[threadIdx.x] = request;
        token_visible[threadIdx.x] = visible;
    }
    __syncthreads();
    // Whether token j takes candidates at and past pool `pool` (it sees more than pool_topk, and past `pool`).
    const auto takes = [&](int j, long long pool) { return token_visible[j] > pool_topk && pool < token_visible[j]; };

    for (int r0 = 0; r0 < tokens;) {
        // A run: the group's next tokens of one request. Its range is the most pools a scoring token of it sees
        // (its last one's, where the offsets are sorted).
        const long long request = token_request[r0];
        int r1 = r0 + 1;
        while (r1 < tokens && token_request[r1] == request) ++r1;
        long long longest = 0;
        for (int j = r0; j < r1; ++j)
            if (takes(j, longest)) longest = token_visible[j];
        if (longest == 0) {  // every token of the run takes all its pools
            r0 = r1;
            continue;
        }
        const long long chunks = (longest + kp::kSelectChunk - 1) / kp::kSelectChunk;
        const long long per_split = (chunks + splits - 1) / splits;
        const long long lo = split * per_split * kp::kSelectChunk;
        const long long hi = lo + per_split * kp::kSelectChunk < longest ? lo + per_split * kp::kSelectChunk : longest;
        const int tiles = (static_cast<int>(heads) + kp::kWgmmaRows - 1) / kp::kWgmmaRows;  // sm_90a's head chunks
        // kPaired: the run's rows staged for an even count of tokens, an odd run's last partner zero.
        const int token_rows = kPaired ? kp::kWgmmaPairHeads : tiles * kp::kWgmmaRows;
        const int staged = kPaired ? (r1 - r0 + 1) / 2 * 2 : r1 - r0;
        // A starting threshold, as kp::select_best takes one: for each token with kSeedChunks times seed_chunks
        // chunks' worth of candidates or more in the split, the k-th largest key of its candidates in the
        // seed_chunks chunks from seed_base (as many as hold k), scored in passes of their own before the split's
        // chunks in order (which score them again, the same bits). No key below it can be selected, so logits
        // that rise with pool id cut back about once a split instead of at every chunk. seed_base is the chunk of
        // the least such end minus k: the seed's chunks hold k candidates of every seeded token, every chunk but
        // the last one a chunk of them (it starts before every such end, as (seed_chunks - 1) chunks < k). -1: none.
        const auto token_end = [&](int j) { return token_visible[j] < hi ? token_visible[j] : hi; };
        const int seed_chunks = (k + kp::kSelectChunk - 1) / kp::kSelectChunk;
        unsigned int seeded_tokens = 0u;  // bit j: token j takes a threshold
        long long seed_base = -1;
        for (int j = r0; j < r1; ++j)
            if (takes(j, lo) &&
                token_end(j) - lo >= static_cast<long long>(kp::kSeedChunks) * seed_chunks * kp::kSelectChunk) {
                seeded_tokens |= 1u << j;
                if (seed_base < 0 || token_end(j) - k < seed_base) seed_base = token_end(j) - k;
            }
        if (seed_base >= 0) seed_base = lo + (seed_base - lo) / kp::kSelectChunk * kp::kSelectChunk;
        const auto seeded = [&](int j) { return ((seeded_tokens >> j) & 1u) != 0u; };
        // The passes: the seed's chunks (where there is a seed), then the split's chunks from lo; chunk_at(passes)
        // and past lie at or past hi.
        const int split_chunks = hi > lo ? static_cast<int>((hi - lo + kp::kSelectChunk - 1) / kp::kSelectChunk) : 0;
        const int first_chunk = seed_base >= 0 ? seed_chunks : 0;  // the pass of the split's first chunk
        const int passes = split_chunks + first_chunk;
        const long long split_base = lo - static_cast<long long>(first_chunk) * kp::kSelectChunk;
        const auto chunk_at = [&](int pass) {
            return (pass < first_chunk ? seed_base : split_base) + static_cast<long long>(pass) * kp::kSelectChunk;
        };
        // Token j's candidates of the chunk at base as a tile of keys (the chunk's logits in shared memory): how
        // many there are, entry e of the tile's one group holding candidate tile_offset(0, e) where it is one.
        const auto chunk_tile = [&](int j, long long base, kp::SelectTile<1>& tile) {
            const long long end = token_end(j);
            const int count = end - base < kp::kSelectChunk ? static_cast<int>(end - base) : kp::kSelectChunk;
#pragma unroll
            for (int e = 0; e < kp::kSelectPerThread; ++e) {
                const int offset = kp::tile_offset<1>(0, e);
                tile.keys[0][e] = offset < count ? kp::order_key(held.logits(j)[offset]) : 0u;
            }
            return count;
        };
        // sm_90a: warpgroup part_group scores pools base + kHalf part_group + N c (c < kChains) of each pass's
        // chunk at base with the scorer's routine, for each token of the run that sees into them. The chains' key
        // tiles stream through a ring of kStages slots of the warpgroup's own, across passes: each thread copies
        // its pieces of the chain kStages - 1 ahead with cp.async (a group a chain) while this chain is scored,
        // its pages read while this chain's copies land, so no load waits on the one before it, and a chunk's
        // selection runs while the next chunk's first tiles arrive. Chain c of pass `pass` (c may pass kChains:
        // the next pass's) sits in slot (kChains pass + c) % kStages.
        constexpr int N = kp::wgmma_keys<HEAD_DIM>();
        constexpr int kHalf = kp::kSelectChunk / kp::kWgmmaSelectGroups;
        constexpr int kChains = kHalf / N;
        constexpr int kStages = kp::wgmma_select_stages<HEAD_DIM>();
        static_assert(kp::kSelectThreads == kp::kWgmmaSelectGroups * kp::kWgmmaThreads, "a warpgroup a half chunk");
        static_assert(kHalf % N == 0 && kStages - 1 <= kChains, "whole chains, a chunk ahead at most");
        const int part_group = static_cast<int>(threadIdx.x) / kp::kWgmmaThreads;
        const int member = static_cast<int>(threadIdx.x) % kp::kWgmmaThreads;
        const kp::WgmmaSelectShared<HEAD_DIM> shared(held.end(), heads, slots);
        const auto chain_pool = [&](int pass, int c) {
            return chunk_at(pass + c / kChains) + kHalf * part_group + N * (c % kChains);
        };
        const auto chain_slot = [](int pass, int c) { return (pass * kChains + c) % kStages; };
        // Copies chain c of pass `pass` into its slot where it scores (its first pool below hi): the pages found
        // first (find), the copies issued after (copy), so a caller may put a barrier between.
        const int* const table_row = cache_block_table + request * table_stride;
        const kp::PageSize page_size = kp::page_size_of(cache_block_size);  // both paths' page lookups
        const kp::WgmmaTileSource<HEAD_DIM, kVectorCache> source{
            cache, page_stride, pages, cache_block_size, table_row, table_columns, hi, page_size, member, kTilePages};
        const auto copy_chain = [&](int pass, int c, const kp::WgmmaTileWhere<HEAD_DIM>& where) {
            const int slot = chain_slot(pass, c);
            if (chain_pool(pass, c) < hi)
                source.copy(where, shared.key_tile(part_group, slot), shared.key_scale(part_group, slot),
                            shared.key_present(part_group, slot));
            kp_cp_async_commit();  // a group a chain, empty where it does not score
        };
        if constexpr (MMA == kp::kMmaWgmma) {
            // The run's query rows and weights, staged once for its chunks.
            const int head_count = static_cast<int>(heads);
            for (int i = static_cast<int>(threadIdx.x); i < staged * token_rows; i += kp::kSelectThreads) {
                const int j = i / token_rows, h = i - j * token_rows;
                shared.weights[i] =
                    h < head_count && j < r1 - r0 ? weights[(first_token + r0 + j) * weights_stride + h] : 0.0f;
            }
            kp::wgmma_stage_queries<HEAD_DIM, kp::kSelectThreads, kVectorQ>(
                q, q_token_stride, q_head_stride, head_count, first_token + r0, r1 - r0, staged, token_rows,
                static_cast<int>(threadIdx.x), reinterpret_cast<uint4*>(shared.queries));
        }
        // mma.sync: warp `warp` scores the tiles of 8 NT pools warp_tiles(pass, call) of each pass's chunk (call <
        // kCalls; call may pass kCalls: the next pass's), its keys loaded a tile ahead and their pages two ahead
        // (as the scorer's walk), across passes, so a chunk's selection runs while the next one's first keys
        // arrive. A tile at or past hi loads nothing (no page) and scores nothing, but keeps the pipeline's step.
        const auto warp_tiles = [&](int pass, int call) {
            return chunk_at(pass + call / kCalls) + (warp * kCalls + call % kCalls) * (8 * NT);
        };
        const auto find_pages = [&](long long first_pool, kp::KeyPages<NT>& at) {
            kp::find_key_pages<NT>(first_pool, hi, table_row, table_columns, page_size, g, at);
        };
        kp::KeyPages<NT> next_pages;
        kp::Bytes8 next_keys[NT][HEAD_DIM / 32] = {};
        float next_scale[NT] = {};
        bool next_have[NT] = {};
        if constexpr (MMA != kp::kMmaWgmma) {
            find_pages(warp_tiles(0, 0), next_pages);
            kp::load_key_rows<HEAD_DIM, NT, kVectorCache>(next_pages, cache, page_stride, pages, cache_block_size, t,
                                                          next_keys, next_scale, next_have);
            find_pages(warp_tiles(0, 1), next_pages);
        }
        for (int pass = 0; pass < passes; ++pass) {
            const long long base = chunk_at(pass);
            if constexpr (MMA == kp::kMmaWgmma) {
                const int row = kp::wgmma_written_row(member);  // the key it keeps
                // The run's first pass starts kStages - 1 steps early, steps that copy its first chains only
                // (every slot's last reader, the run before, met the block's barriers since).
                for (int c = pass == 0 ? 1 - kStages : 0; c < kChains; ++c) {
                    kp::WgmmaTileWhere<HEAD_DIM> ahead;
                    source.find(chain_pool(pass, c + kStages - 1), ahead);
                    if (c >= 0) {
                        kp_cp_async_wait<kStages - 2>();  // this thread's copies of chain c
                        kp_fence_proxy_async();
                        __syncthreads();  // every thread's copies of chain c; every read of the slot refilled next done
                    }
                    copy_chain(pass, c + kStages - 1, ahead);
                    if (c < 0) continue;  // the same in every thread
                    const long long first_pool = chain_pool(pass, c);
                    const bool scores = first_pool < hi;  // the same in every thread of the warpgroup
                    const int slot = chain_slot(pass, c);
                    const unsigned char* const key_tile = shared.key_tile(part_group, slot);
                    const float* const key_scale = shared.key_scale(part_group, slot);
                    const int* const key_present = shared.key_present(part_group, slot);
                    // Token j, and j + 1 where paired (uniform in the warpgroup).
                    for (int j = r0; j < r1; j += kPaired ? 2 : 1) {
                        const bool first = takes(j, first_pool);
                        const bool second = kPaired && j + 1 < r1 && takes(j + 1, first_pool);
                        if (!scores || !(first || second)) continue;
                        const unsigned char* const token_queries = shared.queries + (j - r0) * token_rows * HEAD_DIM;
                        const float* const token_weights = shared.weights + (j - r0) * token_rows;
                        float logit[2][2];
                        if constexpr (kPaired)
                            kp::wgmma_pair_logits<HEAD_DIM>(token_queries, static_cast<int>(heads), token_weights,
                                                            key_tile, key_scale, member, logit);
                        else
                            kp::wgmma_key_logits<HEAD_DIM>(token_queries, tiles, static_cast<int>(heads),
                                                           token_weights, key_tile, key_scale, member, logit[0]);
                        if (kp::wgmma_writes_a_logit(member) && first_pool + row < hi) {
                            const int at = static_cast<int>(first_pool + row - base);
                            if (first)
                                held.logits(j)[at] =
                                    key_present[row] != 0 ? kp::wgmma_written_logit(logit[0], member) : minus_infinity;
                            if (second)
                                held.logits(j + 1)[at] =
                                    key_present[row] != 0 ? kp::wgmma_written_logit(logit[1], member) : minus_infinity;
                        }
                    }
                }
            }
            // Two calls a trip: the tiles' registers alternate, where one call a trip copied the next tile's into
            // this tile's (a call 853 SASS instructions at head_dim 128 on sm_90, 932 with the copy). Not at
            // head_dim 256, where sm_86 then spilled at 255 registers.
#pragma unroll(HEAD_DIM == 256 ? 1 : 2)
            for (int call = 0; call < (MMA == kp::kMmaWgmma ? 0 : kCalls); ++call) {
                const long long first_pool = warp_tiles(pass, call);
                // This tile's keys, loaded a tile ago; the next tile's asked for now, the pages of the one after.
                kp::Bytes8 keys[NT][HEAD_DIM / 32];
                float scale[NT];
                bool have[NT];
#pragma unroll
                for (int n = 0; n < NT; ++n) {
#pragma unroll
                    for (int s = 0; s < HEAD_DIM / 32; ++s) keys[n][s] = next_keys[n][s];
                    scale[n] = next_scale[n];
                    have[n] = next_have[n];
                }
                kp::load_key_rows<HEAD_DIM, NT, kVectorCache>(next_pages, cache, page_stride, pages, cache_block_size,
                                                              t, next_keys, next_scale, next_have);
                find_pages(warp_tiles(pass, call + 2), next_pages);
                if (first_pool >= hi) continue;  // the same in every lane of the warp
                float scales[NT][2];
                bool present[NT][2];
                kp::share_key_scales<NT>(scale, have, t, scales, present);
                kp::KeyOperands<HEAD_DIM, MMA, NT> operands;
                kp::key_operands<HEAD_DIM, MMA, NT>(keys, operands);
                bool own_present[2];  // keys 2 t and 2 t + 1 of tile g, for lanes g < NT
                kp::own_tile_present<NT>(present, g, own_present);
#pragma unroll 1
                for (int j = r0; j < r1; ++j) {
                    if (!takes(j, first_pool)) continue;  // uniform in the warp
                    const long long token = first_token + j;
                    float own[2];
                    kp::score_token<HEAD_DIM, MMA, NT, kVectorQ>(q + token * q_token_stride, q_head_stride, heads,
                                                                 weights + token * weights_stride, operands, scales,
                                                                 lane, own);
                    // Lane (g, t) keeps keys 2 t and 2 t + 1 of tile g, as the scorer writes them.
                    float* const chunk_logits = held.logits(j);
                    if (g < NT) {
#pragma unroll
                        for (int e = 0; e < 2; ++e)
                            chunk_logits[first_pool - base + 8 * g + 2 * t + e] = own_present[e] ? own[e]
                                                                                                 : minus_infinity;
                    }
                }
            }
            __syncthreads();
            if (pass < first_chunk) {
                // A seed pass: each seeded token's keys of this chunk (a whole chunk of candidates but in the
                // last) kept in its buffer, from entry kSelectChunk pass (it holds fewer than k); after the last,
                // its threshold from them and the last chunk's (k or more in all), the buffer's histogram the
                // radix select's. Nothing offered: the buffer holds no candidate after.
                const bool last = pass == first_chunk - 1;
#pragma unroll 1
                for (int j = r0; j < r1; ++j) {
                    if (!seeded(j)) continue;  // uniform in the block
                    kp::SelectTile<1> tile;
                    const int count = chunk_tile(j, base, tile);
                    if (!last) {
#pragma unroll
                        for (int e = 0; e < kp::kSelectPerThread; ++e)
                            held.buffer(j).keys[pass * kp::kSelectChunk + kp::tile_offset<1>(0, e)] = tile.keys[0][e];
                        continue;
                    }
                    tile.enter = 0u;
#pragma unroll
                    for (int e = 0; e < kp::kSelectPerThread; ++e)
                        tile.enter |= static_cast<unsigned int>(kp::tile_offset<1>(0, e) < count) << e;
                    kp::SelectState state = token_state[j];
                    kp::start_from_kth(held.buffer(j), pass * kp::kSelectChunk, tile, k, state);
                    if (threadIdx.x == 0) token_state[j] = state;  // read after the next pass's barriers
                }
                if (!last) __syncthreads();  // the chunk's logits read before the next pass writes them
                continue;
            }
#pragma unroll 1
            for (int j = r0; j < r1; ++j) {
                if (!takes(j, base)) continue;  // uniform in the block
                kp::SelectTile<1> tile;
                const int count = chunk_tile(j, base, tile);
                kp::SelectState state = token_state[j];
                kp::offer_tile(held.buffer(j), state, tile, count, k,  // its barriers free the chunk's logits
                               [base](int, int e) { return static_cast<int>(base + kp::tile_offset<1>(0, e)); });
                if (threadIdx.x == 0) token_state[j] = state;  // read next after the next chunk's barriers
            }
        }
        if constexpr (MMA == kp::kMmaWgmma) kp_cp_async_wait<0>();  // nothing in flight (the last groups are empty)
        r0 = r1;
    }

    __syncthreads();  // the last offer's state put back
#pragma unroll 1
    for (int j = 0; j < tokens; ++j) {
        const long long token = first_token + j;
        const long long visible = token_visible[j];
        const bool all = visible <= pool_topk;  // every candidate, nothing scored
        if (all && split != 0) continue;        // one block writes the row
        kp::SelectState state = token_state[j];
        kp::SelectBuffer<CAP>& buffer = held.buffer(j);
        if (!all) {
            kp::finish_selection(buffer, state, k);
            if (!kp::gather_splits(buffer, state, workspace, num_tokens, token, split, splits, pool_topk)) continue;
        }
        const long long selected = all ? visible : (state.count < k ? state.count : k);
        kp::write_selection<PAGED, COMPACT>(buffer, all, selected, token, input_row_offsets, cache_lengths, batch,
                                            num_tokens, kpool, pool_topk, block_table, max_blocks,
                                            block_table_stride, block_size, positions, width, counts);
    }
}
