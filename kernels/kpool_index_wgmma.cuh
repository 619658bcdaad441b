// The index scorer's routine on Hopper's warpgroup MMA (sm_90a builds,
// MMA == kp::kMmaWgmma): one warpgroup (128 threads) scores one query token
// against 64 pooled FP8 keys staged in shared memory.
//
//     logit[p] = sum over h of  weights[h] * relu( s[p] * dot(k[p, :], q[h, :]) )
//
// The product D [64 keys x 64 heads] = K Q^T is a chain of HEAD_DIM / 32
// wgmma.mma_async m64n64k32 (e4m3 in, float32 out) per 64 heads: the keys
// on the M side, the token's heads on N (a chunk of 64, zero rows past its
// heads), head_dim on K, each step's 32 products summed inside the tensor
// core, the steps in ascending k. A key's row of D lies in the 4 threads of
// one column group (thread g, t of warp w holds rows 16 w + g and + 8), so
// its head sum needs no other warp and no shared memory. Every logit of
// this path, the scorer's and the fused select's, comes from
// wgmma_key_logits or (two tokens of at most 32 heads at once, their heads
// side by side on N) wgmma_pair_logits, so its sums run in one fixed order:
//   - per thread, for each of its two rows, over its heads 64 m + 8 j + 2 t
//     + c (chunks m ascending, then j, then c), each weighted after its relu
//     and added in one rounding: sum = fmaf(weight, relu(scale * dot), sum);
//   - across the row's 4 threads in the pairs of a butterfly xor 1, 2 (every
//     add the same both ways, so the 4 threads hold the same bits).
// A key's logit does not depend on its row in the tile. That is not the
// mma.sync path's order (kp::score_token), so this path's logits are its own
// bits; the two paths agree within the accuracy bound.
//
// Operands in shared memory, both K-major without swizzle (PTX ISA, "Shared
// Memory Matrix Layout"): rows of HEAD_DIM bytes in core matrices of 8 rows
// x 16 bytes; the core matrices of a group of 8 rows follow each other along
// k (LBO 128 bytes), row groups 8 HEAD_DIM bytes apart (SBO). Row r's 16-byte
// piece p then sits at 16 i for i = 8 (kPieces (r / 8) + p) + r % 8, so a
// block that stores piece i at byte 16 i writes shared memory in order.
#ifndef KPOOL_INDEX_WGMMA_CUH
#define KPOOL_INDEX_WGMMA_CUH

#include "kpool_cp_async.cuh"
#include "kpool_index.cuh"
#include "kpool_wgmma.cuh"

namespace kp {

constexpr int kWgmmaThreads = 128;  // a warpgroup
constexpr int kWgmmaRows = 64;      // a wgmma's M and N here: a tile's keys, a chunk of a token's heads

// Keys a wgmma chain scores (its M): a tile of 64 rows of HEAD_DIM bytes.
template <int HEAD_DIM>
__host__ __device__ constexpr int wgmma_keys() {
    return kWgmmaRows;
}
template <int HEAD_DIM>
__host__ __device__ constexpr int wgmma_tile_bytes() {
    return kWgmmaRows * HEAD_DIM;
}
// 16-byte pieces of a key tile each thread stages: HEAD_DIM / 32.
template <int HEAD_DIM>
__host__ __device__ constexpr int wgmma_key_pieces() {
    return wgmma_tile_bytes<HEAD_DIM>() / 16 / kWgmmaThreads;
}

// The row and 16-byte piece of an operand of HEAD_DIM-byte rows stored at byte 16 i (the layout above).
template <int HEAD_DIM>
__device__ __forceinline__ unsigned int wgmma_row(unsigned int i) {
    return i / (8 * (HEAD_DIM / 16)) * 8 + i % 8;
}
template <int HEAD_DIM>
__device__ __forceinline__ unsigned int wgmma_piece(unsigned int i) {
    return i / 8 % (HEAD_DIM / 16);
}

// The descriptor of k-step s (bytes 32 s .. 32 s + 31 of each row) of an operand at `tile`.
template <int HEAD_DIM>
__device__ __forceinline__ unsigned long long wgmma_step_desc(const unsigned char* tile, int s) {
    return kp_wgmma_desc(tile + 256 * s, 128, 8 * HEAD_DIM, kp_swizzle_none);
}

// The query rows of `tokens` tokens from token_begin into a stage of
// `staged` tokens' rows (piece i at byte 16 i), each token's heads padded
// with zero rows to token_rows, the rows of tokens past `tokens` zero.
// THREADS threads call it together; every load of a round is issued before
// any is stored.
template <int HEAD_DIM, int THREADS, bool VECTOR_Q>
__device__ __forceinline__ void wgmma_stage_queries(const unsigned char* q, long long q_token_stride,
                                                    long long q_head_stride, int heads, long long token_begin,
                                                    int tokens, int staged, int token_rows, int thread,
                                                    uint4* stage) {
    constexpr int kRound = 8;  // pieces a thread loads before it stores them
    const int pieces = staged * token_rows * (HEAD_DIM / 16);
    for (int first = 0; first < pieces; first += THREADS * kRound) {
        uint4 v[kRound];
#pragma unroll
        for (int k = 0; k < kRound; ++k) {
            const int i = first + k * THREADS + thread;
            const unsigned int row = wgmma_row<HEAD_DIM>(static_cast<unsigned int>(i));
            const unsigned int token = row / token_rows, head = row - token * token_rows;
            v[k] = uint4{0u, 0u, 0u, 0u};
            if (i < pieces && token < static_cast<unsigned int>(tokens) && head < static_cast<unsigned int>(heads))
                v[k] = load_piece16<VECTOR_Q>(q + (token_begin + token) * q_token_stride + head * q_head_stride +
                                              16 * wgmma_piece<HEAD_DIM>(static_cast<unsigned int>(i)));
        }
#pragma unroll
        for (int k = 0; k < kRound; ++k) {
            const int i = first + k * THREADS + thread;
            if (i < pieces) stage[i] = v[k];
        }
    }
}

// What one thread stages of a key tile: pieces i = thread + 128 k (k <
// kPieces, HEAD_DIM / 32), all piece `piece` of rows row0 + kRowStep k. The pages come first
// (find_key_pages with that step), the bytes and scales from them next,
// without waiting on each other until the bytes are stored.
template <int HEAD_DIM>
struct WgmmaKeyPart {
    static constexpr int kRowStep = kWgmmaThreads / (HEAD_DIM / 16);  // rows between a thread's pieces
    static constexpr int kPieces = wgmma_key_pieces<HEAD_DIM>();
    KeyPages<kPieces> at;
    uint4 bytes[kPieces];
    float scale[kPieces];
    bool have[kPieces];
};

template <int HEAD_DIM>
__device__ __forceinline__ void wgmma_find_key_pages(long long first_pool, long long reach, const int* table_row,
                                                     long long table_columns, const PageSize& page, int thread,
                                                     WgmmaKeyPart<HEAD_DIM>& part) {
    find_key_pages<WgmmaKeyPart<HEAD_DIM>::kPieces, WgmmaKeyPart<HEAD_DIM>::kRowStep>(
        first_pool, reach, table_row, table_columns, page,
        static_cast<int>(wgmma_row<HEAD_DIM>(static_cast<unsigned int>(thread))), part.at);
}

// The bytes of the pages found, zero where the page is missing or outside
// the cache; the thread that holds a row's piece 0 reads its scale.
template <int HEAD_DIM, bool VECTOR_CACHE>
__device__ __forceinline__ void wgmma_load_key_part(const unsigned char* cache, long long page_stride, long long pages,
                                                    long long block_size, int thread, WgmmaKeyPart<HEAD_DIM>& part) {
    const unsigned int piece = wgmma_piece<HEAD_DIM>(static_cast<unsigned int>(thread));
#pragma unroll
    for (int k = 0; k < WgmmaKeyPart<HEAD_DIM>::kPieces; ++k) {
        const long long page = part.at.page[k];
        part.have[k] = page >= 0 && page < pages;
        part.scale[k] = 0.0f;
        part.bytes[k] = uint4{0u, 0u, 0u, 0u};
        if (part.have[k]) {
            const unsigned char* base = cache + page * page_stride;
            const unsigned char* from = base + static_cast<long long>(part.at.entry[k]) * HEAD_DIM + 16 * piece;
            if constexpr (VECTOR_CACHE) {
                part.bytes[k] = kp_load16(from);
            } else {  // cache rows 4-byte aligned
                const unsigned int* words = reinterpret_cast<const unsigned int*>(from);
                part.bytes[k] = uint4{words[0], words[1], words[2], words[3]};
            }
            if (piece == 0) part.scale[k] = reinterpret_cast<const float*>(base + block_size * HEAD_DIM)[part.at.entry[k]];
        }
    }
}

// Stores the part into the tile (wgmma_tile_bytes of shared memory) and, from
// the threads holding piece 0, each row's scale and presence. The caller
// makes them visible to the wgmma (kp_fence_proxy_async, then a barrier).
template <int HEAD_DIM>
__device__ __forceinline__ void wgmma_store_key_part(const WgmmaKeyPart<HEAD_DIM>& part, int thread,
                                                     unsigned char* tile, float* scales, int* present) {
    const unsigned int row0 = wgmma_row<HEAD_DIM>(static_cast<unsigned int>(thread));
#pragma unroll
    for (int k = 0; k < WgmmaKeyPart<HEAD_DIM>::kPieces; ++k) {
        *reinterpret_cast<uint4*>(tile + 16 * (thread + kWgmmaThreads * k)) = part.bytes[k];
        if (wgmma_piece<HEAD_DIM>(static_cast<unsigned int>(thread)) == 0) {
            const unsigned int row = row0 + WgmmaKeyPart<HEAD_DIM>::kRowStep * k;
            scales[row] = part.scale[k];
            present[row] = part.have[k] ? 1 : 0;
        }
    }
}

// Adds one chunk's weighted heads to this thread's two rows' sums: element
// 4 j + 2 r + c of d is row 16 w + g + 8 r, column 8 j + 2 t + c of the
// chunk, which holds head 8 (j - J0) + 2 t + c of columns J0 .. J1 - 1 (in
// groups of 8: the whole chunk, or one token's half of a pair's);
// w_pairs[4 j] holds that column pair's weights. A head at or past `left`
// is padding and adds nothing (its product may be NaN: a zero query row
// times a NaN key byte); ptxas predicates those adds, no branch. FULL: the
// caller knows every column a head (left >= 8 (J1 - J0)), so no add needs
// its predicate; the same adds in the same order, the same bits.
// The relu is kp_relu_nan (one FMNMX.FTZ.NAN), which gives +0 for -0. A sum
// is -0 only after a product flushed to -0 (below 2^-126, flush-to-zero);
// there the zero's sign from the relu decides the logit's sign bit (an
// exact zero either way, equal for every comparison and the selection).
template <int N, bool FULL, int J0 = 0, int J1 = N / 8>
__device__ __forceinline__ void add_head_chunk(KpWgmmaAccum<N>& d, const float2* w_pairs, int left, int t,
                                               const float (&scale)[2], float (&sums)[2]) {
#pragma unroll
    for (int j = J0; j < J1; ++j) {
        const float2 w = w_pairs[4 * j];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const bool head = FULL || 8 * (j - J0) + 2 * t + c < left;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float term = fmaf(c ? w.y : w.x, kp_relu_nan(scale[r] * d[4 * j + 2 * r + c]), sums[r]);
                sums[r] = head ? term : sums[r];
            }
        }
    }
}

// add_head_chunk over columns J0 .. J1 - 1 with `left` heads in them: where
// they fill every column (the engines' 64 heads a chunk, 32 a pair's half;
// the same in every thread, so the warpgroup takes one branch), without a
// predicate an add.
template <int N, int J0 = 0, int J1 = N / 8>
__device__ __forceinline__ void add_heads(KpWgmmaAccum<N>& d, const float2* w_pairs, int left, int t,
                                          const float (&scale)[2], float (&sums)[2]) {
    if (left >= 8 * (J1 - J0))
        add_head_chunk<N, true, J0, J1>(d, w_pairs, left, t, scale, sums);
    else
        add_head_chunk<N, false, J0, J1>(d, w_pairs, left, t, scale, sums);
}

// Which logit of wgmma_key_logits thread `thread` (of 128) writes, and of
// which key: threads t = 0 and 1 of a row's four take rows 16 w + g and + 8.
__device__ __forceinline__ bool wgmma_writes_a_logit(int thread) { return thread % 4 < 2; }
__device__ __forceinline__ int wgmma_written_row(int thread) {
    return 16 * (thread / 32 % 4) + thread % 32 / 4 + 8 * (thread % 2);
}
__device__ __forceinline__ float wgmma_written_logit(const float (&logit)[2], int thread) {
    return thread % 2 ? logit[1] : logit[0];
}

// D = keys (64 rows) times the 64 query rows at `queries`, transposed: one
// chain of HEAD_DIM / 32 m64n64k32, waited for.
template <int HEAD_DIM>
__device__ __forceinline__ void wgmma_key_chain(const unsigned char* keys, const unsigned char* queries,
                                                KpWgmmaAccum<kWgmmaRows>& d) {
    kp_wgmma_fence();
#pragma unroll
    for (int s = 0; s < HEAD_DIM / 32; ++s)
        kp_wgmma_e4m3<kWgmmaRows>(d, wgmma_step_desc<HEAD_DIM>(keys, s), wgmma_step_desc<HEAD_DIM>(queries, s), s > 0);
    kp_wgmma_commit();
    kp_wgmma_wait<0>();
}

// A row's sum across its 4 threads, in the butterfly's pairs xor 1, 2 (the
// same bits in all 4).
__device__ __forceinline__ float wgmma_row_sum(float sum) {
    sum += __shfl_xor_sync(kIndexWarpLanes, sum, 1);
    return sum + __shfl_xor_sync(kIndexWarpLanes, sum, 2);
}

// One token's logits against the 64 keys of `keys` (the layout above), for
// this thread's two rows of the tile: logit[r] is key 16 w + g + 8 r's
// (thread g, t of warp w), the same in the row's 4 threads. The token's
// query rows are `chunks` chunks of 64 rows at q_chunks (rows past its heads
// zero), w_token its heads' weights in as many (zero past its heads),
// scales the keys' scales. Each head adds weight * relu(scale * dot) to the
// row's sum in one rounding (fmaf). All 128 threads of the warpgroup call it
// together (wgmma and the shuffles); it waits for its wgmma before it
// returns, so the caller may overwrite the tile after its threads meet.
template <int HEAD_DIM>
__device__ __forceinline__ void wgmma_key_logits(const unsigned char* q_chunks, int chunks, int heads,
                                                 const float* w_token, const unsigned char* keys, const float* scales,
                                                 int thread, float (&logit)[2]) {
    constexpr int N = kWgmmaRows;  // a chunk of the token's heads
    const int lane = thread % 32, warp = thread / 32 % 4, g = lane / 4, t = lane % 4;
    const int row = 16 * warp + g;
    const float scale[2] = {scales[row], scales[row + 8]};
    float sums[2] = {0.0f, 0.0f};
    for (int m = 0; m < chunks; ++m) {
        KpWgmmaAccum<N> d;
        wgmma_key_chain<HEAD_DIM>(keys, q_chunks + m * N * HEAD_DIM, d);
        const int left = heads - m * N;  // heads in this chunk
        const float2* w_pairs = reinterpret_cast<const float2*>(w_token + m * N) + t;
        add_heads<N>(d, w_pairs, left, t, scale, sums);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) logit[r] = wgmma_row_sum(sums[r]);
}

// Two tokens' logits against the 64 keys of `keys` with one chain, where a
// token has at most kWgmmaPairHeads heads: their query rows kWgmmaPairHeads
// apart at q_pair (rows past each one's heads zero), so the chain's 64
// columns hold the first token's heads, then the second's; w_pair their
// weights as far apart (zero past their heads). logit[p][r] is token p's
// logit of key 16 w + g + 8 r, each summed in wgmma_key_logits's order (its
// heads' columns in ascending j, then c, one rounding a head, then the
// butterfly), so a token's bits are the ones it gets alone. The tensor cores'
// work of one token; the sums of two. Called as wgmma_key_logits is.
constexpr int kWgmmaPairHeads = kWgmmaRows / 2;
template <int HEAD_DIM>
__device__ __forceinline__ void wgmma_pair_logits(const unsigned char* q_pair, int heads, const float* w_pair,
                                                  const unsigned char* keys, const float* scales, int thread,
                                                  float (&logit)[2][2]) {
    constexpr int N = kWgmmaRows;
    const int lane = thread % 32, warp = thread / 32 % 4, t = lane % 4;
    const int row = 16 * warp + lane / 4;
    const float scale[2] = {scales[row], scales[row + 8]};
    KpWgmmaAccum<N> d;
    wgmma_key_chain<HEAD_DIM>(keys, q_pair, d);
    float sums[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    const float2* w_pairs = reinterpret_cast<const float2*>(w_pair) + t;
    add_heads<N, 0, N / 16>(d, w_pairs, heads, t, scale, sums[0]);
    add_heads<N, N / 16, N / 8>(d, w_pairs, heads, t, scale, sums[1]);
#pragma unroll
    for (int p = 0; p < 2; ++p)
#pragma unroll
        for (int r = 0; r < 2; ++r) logit[p][r] = wgmma_row_sum(sums[p][r]);
}

// Where a key tile lies in one page (its first pool and the page size
// multiples of 64, so its 64 pools share a page): that page and the entry of
// this thread's row row0, with one division and one table read a tile. Every
// row takes the page, those at or past `reach` too: they lie in it, and a
// scorer writes -inf for them whatever they hold. -1: the tile's first pool
// is at or past reach, or its column past the table.
struct TilePage {
    int page;
    unsigned int entry;
};

__device__ __forceinline__ TilePage wgmma_find_tile_page(long long first_pool, long long reach, const int* table_row,
                                                         long long table_columns, const PageSize& page,
                                                         unsigned int row0) {
    TilePage at{-1, row0};
    // reach is at most 2^31 - 1 and first_pool not negative in every caller: 32-bit from here, exact whatever
    // a kernel is passed.
    if (first_pool < reach && first_pool < 2147483647LL && first_pool >= 0) {
        const unsigned int column = page.quotient(static_cast<unsigned int>(first_pool));
        at.entry += static_cast<unsigned int>(first_pool) - column * page.size;
        if (column < table_columns) at.page = table_row[column];
    }
    return at;
}

// Copies this thread's pieces of a key tile (the pages `at` found, as
// wgmma_find_key_pages finds them) into `tile` with cp.async, and, from the
// threads holding a row's piece 0, its scale into `scales` the same way and
// its presence into `present` (an ordinary store). A missing page, or one
// outside the cache, reads nothing and lands zeros. The caller commits the
// group, waits for it, and makes the tile visible to the wgmma
// (kp_fence_proxy_async, then a barrier). VECTOR_CACHE: 16-byte copies,
// else four of 4 bytes (rows 4-byte aligned).
template <int HEAD_DIM, bool VECTOR_CACHE>
__device__ __forceinline__ void wgmma_copy_key_tile(const KeyPages<WgmmaKeyPart<HEAD_DIM>::kPieces>& at,
                                                    const unsigned char* cache, long long page_stride,
                                                    long long pages, long long block_size, int thread,
                                                    unsigned char* tile, float* scales, int* present) {
    const unsigned int piece = wgmma_piece<HEAD_DIM>(static_cast<unsigned int>(thread));
    const unsigned int row0 = wgmma_row<HEAD_DIM>(static_cast<unsigned int>(thread));
#pragma unroll
    for (int k = 0; k < WgmmaKeyPart<HEAD_DIM>::kPieces; ++k) {
        const long long page = at.page[k];
        const bool have = page >= 0 && page < pages;
        const unsigned char* base = cache + (have ? page : 0) * page_stride;
        const unsigned char* from = have ? base + static_cast<long long>(at.entry[k]) * HEAD_DIM + 16 * piece : cache;
        unsigned char* to = tile + 16 * (thread + kWgmmaThreads * k);
        if constexpr (VECTOR_CACHE) {
            kp_cp_async16(to, from, have);
        } else {
#pragma unroll
            for (int b = 0; b < 16; b += 4) kp_cp_async4(to + b, have ? from + b : cache, have);
        }
        if (piece == 0) {
            const unsigned int row = row0 + WgmmaKeyPart<HEAD_DIM>::kRowStep * k;
            kp_cp_async4(scales + row, have ? base + block_size * HEAD_DIM + 4LL * at.entry[k] : cache, have);
            present[row] = have ? 1 : 0;
        }
    }
}

// The same for a tile in one page (wgmma_find_tile_page), in 16-byte copies
// (cache pages 16-byte aligned): the page's address found once, the thread's
// rows kRowStep rows apart, and the tile's 64 scales (256 contiguous bytes
// of the page) copied by its first 16 threads, 16 bytes each. The page is
// the same in every thread, so the branch on it is too.
template <int HEAD_DIM>
__device__ __forceinline__ void wgmma_copy_tile_page(TilePage at, const unsigned char* cache, long long page_stride,
                                                     long long pages, long long block_size, int thread,
                                                     unsigned char* tile, float* scales, int* present) {
    constexpr int kStep = WgmmaKeyPart<HEAD_DIM>::kRowStep;
    const bool have = at.page >= 0 && at.page < pages;
    const unsigned int row0 = wgmma_row<HEAD_DIM>(static_cast<unsigned int>(thread));
    if (have) {
        const unsigned char* base = cache + static_cast<long long>(at.page) * page_stride;
        const unsigned char* row = base + static_cast<long long>(at.entry) * HEAD_DIM +
                                   16 * wgmma_piece<HEAD_DIM>(static_cast<unsigned int>(thread));
#pragma unroll
        for (int k = 0; k < WgmmaKeyPart<HEAD_DIM>::kPieces; ++k)
            kp_cp_async16(tile + 16 * (thread + kWgmmaThreads * k), row + kStep * HEAD_DIM * k, true);
        if (thread < kWgmmaRows / 4)
            kp_cp_async16(scales + 4 * thread,
                          base + block_size * HEAD_DIM + 4LL * (at.entry - row0) + 16 * thread, true);
    } else {
#pragma unroll
        for (int k = 0; k < WgmmaKeyPart<HEAD_DIM>::kPieces; ++k)
            kp_cp_async16(tile + 16 * (thread + kWgmmaThreads * k), cache, false);
        if (thread < kWgmmaRows / 4) kp_cp_async16(scales + 4 * thread, cache, false);
    }
    const unsigned int flag = have ? 1u : 0u;
    if (thread < kWgmmaRows / 4) *reinterpret_cast<uint4*>(present + 4 * thread) = uint4{flag, flag, flag, flag};
}

// Where a key tile's rows lie: its one page (one_page, below) or the page of
// each of the thread's rows.
template <int HEAD_DIM>
struct WgmmaTileWhere {
    KeyPages<WgmmaKeyPart<HEAD_DIM>::kPieces> rows;
    TilePage page;
};

// A request's key tiles as one thread of a warpgroup finds and copies them
// into a ring: from one page a tile (wgmma_find_tile_page,
// wgmma_copy_tile_page) where one_page holds (the caller's rule: 16-byte
// aligned pages of a multiple of 64 pools, every tile's first pool a
// multiple of 64; the same in every thread), else row by row
// (find_key_pages, wgmma_copy_key_tile). find reads the table (one load a
// tile, or one a row), copy issues the cp.async copies from what find read;
// the caller commits, waits and fences as wgmma_copy_key_tile says. Pools at
// or past reach (at most 2^31 - 1) find no page, or (one_page) their
// tile's page, whose rows a caller scores -inf.
template <int HEAD_DIM, bool VECTOR_CACHE>
struct WgmmaTileSource {
    const unsigned char* cache;
    long long page_stride, pages, block_size;
    const int* table_row;  // the request's row of the block table
    long long table_columns, reach;
    PageSize page_size;  // page_size_of(block_size)
    int thread;              // of the warpgroup
    bool one_page;

    __device__ __forceinline__ void find(long long first_pool, WgmmaTileWhere<HEAD_DIM>& at) const {
        const unsigned int row0 = wgmma_row<HEAD_DIM>(static_cast<unsigned int>(thread));
        if (one_page)
            at.page = wgmma_find_tile_page(first_pool, reach, table_row, table_columns, page_size, row0);
        else
            find_key_pages<WgmmaKeyPart<HEAD_DIM>::kPieces, WgmmaKeyPart<HEAD_DIM>::kRowStep>(
                first_pool, reach, table_row, table_columns, page_size, static_cast<int>(row0), at.rows);
    }
    __device__ __forceinline__ void copy(const WgmmaTileWhere<HEAD_DIM>& at, unsigned char* tile, float* scales,
                                         int* present) const {
        if (one_page)
            wgmma_copy_tile_page<HEAD_DIM>(at.page, cache, page_stride, pages, block_size, thread, tile, scales,
                                           present);
        else
            wgmma_copy_key_tile<HEAD_DIM, VECTOR_CACHE>(at.rows, cache, page_stride, pages, block_size, thread, tile,
                                                       scales, present);
    }
};

// The scorer's dynamic shared memory on this path, in this order: a ring of
// kWgmmaStages key tiles and a spare one (for a token of another request
// than the tile's first), the tiles' scales and presence, then the tile's
// weights and query rows, each token's in whole chunks of 64 rows
// (ops/index_logits_fp8.py sizes the launch by the same sum:
// kernel.geometry.index_logits_shared_bytes).
constexpr int kWgmmaStages = 3;

template <int HEAD_DIM>
struct WgmmaScorerShared {
    static constexpr int N = wgmma_keys<HEAD_DIM>();
    static constexpr int kTileBytes = wgmma_tile_bytes<HEAD_DIM>();
    static constexpr int kTiles = kWgmmaStages + 1;
    unsigned char* base;
    float* scales;
    int* present;
    float* weights;
    unsigned char* queries;
    __device__ __forceinline__ WgmmaScorerShared(unsigned char* dynamic, long long heads, long long tokens)
        : base(dynamic),
          scales(reinterpret_cast<float*>(dynamic + kTiles * kTileBytes)),
          present(reinterpret_cast<int*>(scales + kTiles * N)),
          weights(reinterpret_cast<float*>(present + kTiles * N)),
          queries(reinterpret_cast<unsigned char*>(weights + tokens * ((heads + kWgmmaRows - 1) / kWgmmaRows) *
                                                                  kWgmmaRows)) {}
    __device__ __forceinline__ unsigned char* key_tile(int i) const { return base + i * kTileBytes; }
    __device__ __forceinline__ float* key_scale(int i) const { return scales + i * N; }
    __device__ __forceinline__ int* key_present(int i) const { return present + i * N; }
};

// The fused select's dynamic shared memory on this path, after its
// selection buffers (kp::SelectGroupShared), in this order: for each of its
// two warpgroups a ring of wgmma_select_stages key tiles, then their keys'
// scales and presence; then the weights and the query rows of the block's
// `tokens` tokens, each token's in whole chunks of 64 rows
// (ops/index_select_fp8.py sizes the launch by the same sum:
// index_select_shared_bytes).
constexpr int kWgmmaSelectGroups = 2;
// Key tiles in a warpgroup's ring: 3 (two tiles in flight while one is scored); 2 at head_dim 256, whose 16 KB
// tiles would otherwise hold the select to one block an SM (kernel.geometry.wgmma_select_stages mirrors it).
template <int HEAD_DIM>
__host__ __device__ constexpr int wgmma_select_stages() {
    return HEAD_DIM > 128 ? 2 : 3;
}

template <int HEAD_DIM>
struct WgmmaSelectShared {
    static constexpr int N = wgmma_keys<HEAD_DIM>();
    static constexpr int kTileBytes = wgmma_tile_bytes<HEAD_DIM>();
    static constexpr int kStages = wgmma_select_stages<HEAD_DIM>();
    static constexpr int kGroupBytes = kStages * (kTileBytes + (1 + 1) * 4 * N);  // tiles, scales, presence
    unsigned char* base;
    float* weights;
    unsigned char* queries;
    __device__ __forceinline__ WgmmaSelectShared(unsigned char* dynamic, long long heads, int tokens)
        : base(dynamic),
          weights(reinterpret_cast<float*>(dynamic + kWgmmaSelectGroups * kGroupBytes)),
          queries(reinterpret_cast<unsigned char*>(weights +
                                                   tokens * ((heads + kWgmmaRows - 1) / kWgmmaRows * kWgmmaRows))) {}
    __device__ __forceinline__ unsigned char* key_tile(int group, int slot) const {
        return base + group * kGroupBytes + slot * kTileBytes;
    }
    __device__ __forceinline__ float* key_scale(int group, int slot) const {
        return reinterpret_cast<float*>(key_tile(group, kStages)) + slot * N;
    }
    __device__ __forceinline__ int* key_present(int group, int slot) const {
        return reinterpret_cast<int*>(key_scale(group, kStages)) + slot * N;
    }
};

}  // namespace kp

#endif  // KPOOL_INDEX_WGMMA_CUH
