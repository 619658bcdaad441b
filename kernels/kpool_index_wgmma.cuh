// The index scorer's routine on Hopper's warpgroup MMA (sm_90a builds,
// MMA == kp::kMmaWgmma): one warpgroup (128 threads) scores one query token
// against N pooled FP8 keys staged in shared memory.
//
//     logit[p] = sum over h of  weights[h] * relu( s[p] * dot(q[h, :], k[p, :]) )
//
// The product D [64 heads x N keys] = Q K^T is a chain of HEAD_DIM / 32
// wgmma.mma_async m64nNk32 (e4m3 in, float32 out) per 64 heads, the token's
// heads on the M side (an M-tile, zero rows past its heads), the keys on N,
// head_dim on K: each step's 32 products summed inside the tensor core, the
// steps in ascending k. Every logit of this path, the scorer's and the
// fused select's, comes from wgmma_head_sums then wgmma_logit, so its sums
// run in one fixed order:
//   - per thread, over its two rows of each M-tile (heads 64 m + 16 w + g
//     and that + 8, thread g of warp w of the warpgroup), M-tiles ascending;
//   - across the 8 threads of a column (g) in the pairs of a butterfly xor
//     4, 8, 16 (taken by halves: keep_half);
//   - across the 4 warps through shared memory: ((w0 + w1) + w2) + w3.
// That is not the mma.sync path's order (kp::score_token), so this path's
// logits are its own bits; the two paths agree within the accuracy bound.
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

constexpr int kWgmmaThreads = 128;   // a warpgroup
constexpr int kWgmmaRows = 64;       // a wgmma's M: one M-tile of a token's heads
constexpr int kWgmmaKeyBytes = 8192;  // the keys of one wgmma chain: N rows of HEAD_DIM bytes
constexpr int kWgmmaKeyPieces = kWgmmaKeyBytes / 16 / kWgmmaThreads;  // 16-byte pieces a thread stages: 4

// Keys a wgmma chain scores (its N): 8 KB of key rows.
template <int HEAD_DIM>
__host__ __device__ constexpr int wgmma_keys() {
    return kWgmmaKeyBytes / HEAD_DIM;
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

// The query rows of `tokens` tokens from token_begin into a stage of whole
// M-tiles (piece i at byte 16 i), each token's heads padded with zero rows to
// token_rows. THREADS threads call it together; every load of a round is
// issued before any is stored.
template <int HEAD_DIM, int THREADS, bool VECTOR_Q>
__device__ __forceinline__ void wgmma_stage_queries(const unsigned char* q, long long q_token_stride,
                                                    long long q_head_stride, int heads, long long token_begin,
                                                    int tokens, int token_rows, int thread, uint4* stage) {
    constexpr int kRound = 8;  // pieces a thread loads before it stores them
    const int pieces = tokens * token_rows * (HEAD_DIM / 16);
    for (int first = 0; first < pieces; first += THREADS * kRound) {
        uint4 v[kRound];
#pragma unroll
        for (int k = 0; k < kRound; ++k) {
            const int i = first + k * THREADS + thread;
            const unsigned int row = wgmma_row<HEAD_DIM>(static_cast<unsigned int>(i));
            const unsigned int token = row / token_rows, head = row - token * token_rows;
            v[k] = uint4{0u, 0u, 0u, 0u};
            if (i < pieces && head < static_cast<unsigned int>(heads))
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

// What one thread stages of a key tile: pieces i = thread + 128 k (k < 4),
// all piece `piece` of rows row0 + kRowStep k. The pages come first
// (find_key_pages with that step), the bytes and scales from them next,
// without waiting on each other until the bytes are stored.
template <int HEAD_DIM>
struct WgmmaKeyPart {
    static constexpr int kRowStep = kWgmmaThreads / (HEAD_DIM / 16);  // rows between a thread's pieces
    KeyPages<kWgmmaKeyPieces> at;
    uint4 bytes[kWgmmaKeyPieces];
    float scale[kWgmmaKeyPieces];
    bool have[kWgmmaKeyPieces];
};

template <int HEAD_DIM>
__device__ __forceinline__ void wgmma_find_key_pages(long long first_pool, long long reach, const int* table_row,
                                                     long long table_columns, unsigned int block_size32, int thread,
                                                     WgmmaKeyPart<HEAD_DIM>& part) {
    find_key_pages<kWgmmaKeyPieces, WgmmaKeyPart<HEAD_DIM>::kRowStep>(
        first_pool, reach, table_row, table_columns, block_size32,
        static_cast<int>(wgmma_row<HEAD_DIM>(static_cast<unsigned int>(thread))), part.at);
}

// The bytes of the pages found, zero where the page is missing or outside
// the cache; the thread that holds a row's piece 0 reads its scale.
template <int HEAD_DIM, bool VECTOR_CACHE>
__device__ __forceinline__ void wgmma_load_key_part(const unsigned char* cache, long long page_stride, long long pages,
                                                    long long block_size, int thread, WgmmaKeyPart<HEAD_DIM>& part) {
    const unsigned int piece = wgmma_piece<HEAD_DIM>(static_cast<unsigned int>(thread));
#pragma unroll
    for (int k = 0; k < kWgmmaKeyPieces; ++k) {
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

// Stores the part into the tile (kWgmmaKeyBytes of shared memory) and, from
// the threads holding piece 0, each row's scale and presence. The caller
// makes them visible to the wgmma (kp_fence_proxy_async, then a barrier).
template <int HEAD_DIM>
__device__ __forceinline__ void wgmma_store_key_part(const WgmmaKeyPart<HEAD_DIM>& part, int thread,
                                                     unsigned char* tile, float* scales, int* present) {
    const unsigned int row0 = wgmma_row<HEAD_DIM>(static_cast<unsigned int>(thread));
#pragma unroll
    for (int k = 0; k < kWgmmaKeyPieces; ++k) {
        *reinterpret_cast<uint4*>(tile + 16 * (thread + kWgmmaThreads * k)) = part.bytes[k];
        if (wgmma_piece<HEAD_DIM>(static_cast<unsigned int>(thread)) == 0) {
            const unsigned int row = row0 + WgmmaKeyPart<HEAD_DIM>::kRowStep * k;
            scales[row] = part.scale[k];
            present[row] = part.have[k] ? 1 : 0;
        }
    }
}

// One step of wgmma_head_sums' sums across a column's threads: of v's
// first 2 HALF values this thread keeps the upper half (`upper`) or the
// lower, adds its partner's (lane xor `mask`) part of the same half, and
// leaves them in v[0 .. HALF - 1]. Every lane of the warp calls it together.
template <int HALF>
__device__ __forceinline__ void keep_half(float* v, bool upper, int mask) {
#pragma unroll
    for (int j = 0; j < HALF; ++j) {
        const float kept = upper ? v[HALF + j] : v[j];
        const float sent = upper ? v[j] : v[HALF + j];
        v[j] = kept + __shfl_xor_sync(kIndexWarpLanes, sent, mask);
    }
}

// One token's logits against the N keys of `keys`, up to the warps'
// partial sums: the token's query rows are `tiles` M-tiles of 64 rows at
// q_tiles (the layout above; rows past its heads zero), w_token its heads'
// weights, scales the keys' scales. Writes partial[warp][column]; the caller
// meets the warpgroup at a barrier before wgmma_logit reads them. All 128
// threads of the warpgroup call it together (wgmma and the shuffles).
template <int HEAD_DIM>
__device__ __forceinline__ void wgmma_head_sums(const unsigned char* q_tiles, int tiles, int heads,
                                                const float* w_token, const unsigned char* keys,
                                                const float* scales, int thread, float* partial) {
    constexpr int N = wgmma_keys<HEAD_DIM>();
    constexpr int kSteps = HEAD_DIM / 32;
    const int lane = thread % 32, warp = thread / 32 % 4, g = lane / 4, t = lane % 4;
    float sums[N / 4];  // columns 8 (i / 2) + 2 t + i % 2
#pragma unroll
    for (int i = 0; i < N / 4; ++i) sums[i] = 0.0f;
    for (int m = 0; m < tiles; ++m) {
        const unsigned char* q_tile = q_tiles + m * kWgmmaRows * HEAD_DIM;
        KpWgmmaAccum<N> d;
        kp_wgmma_fence();
#pragma unroll
        for (int s = 0; s < kSteps; ++s)
            kp_wgmma_e4m3<N>(d, wgmma_step_desc<HEAD_DIM>(q_tile, s), wgmma_step_desc<HEAD_DIM>(keys, s), s > 0);
        kp_wgmma_commit();
        kp_wgmma_wait<0>();
        const int h0 = m * kWgmmaRows + 16 * warp + g, h1 = h0 + 8;
        const float w0 = h0 < heads ? w_token[h0] : 0.0f, w1 = h1 < heads ? w_token[h1] : 0.0f;
#pragma unroll
        for (int i = 0; i < N / 4; ++i) {
            // Element 4 j + 2 r + c of d: row (r ? h1 : h0), column 8 j + 2 t + c, with j = i / 2, c = i % 2.
            const float s = scales[8 * (i / 2) + 2 * t + i % 2];
            if (h0 < heads) sums[i] += w0 * relu_keep_nan(s * d[4 * (i / 2) + i % 2]);
            if (h1 < heads) sums[i] += w1 * relu_keep_nan(s * d[4 * (i / 2) + 2 + i % 2]);
        }
    }
    // The sums over a column's 8 threads (g), by halves: at each step a thread keeps half of its columns and adds
    // its partner's part of them, partners g ^ 1, g ^ 2, g ^ 4 (lanes xor 4, 8, 16). Each sum is the butterfly's
    // (the same pairs in the same order, each add the same both ways), with N / 4 * 7 / 8 shuffles in place of
    // N / 4 * 3. Thread g ends with the columns of slots first .. first + N / 32 - 1.
    keep_half<N / 8>(sums, (g & 1) != 0, 4);
    keep_half<N / 16>(sums, (g & 2) != 0, 8);
    keep_half<N / 32>(sums, (g & 4) != 0, 16);
    const int first = (g & 1) * (N / 8) + (g >> 1 & 1) * (N / 16) + (g >> 2 & 1) * (N / 32);
#pragma unroll
    for (int k = 0; k < N / 32; ++k) {
        const int i = first + k;
        partial[warp * N + 8 * (i / 2) + 2 * t + i % 2] = sums[k];
    }
}

// The logit of key `column` from the warps' partial sums, in warp order.
template <int HEAD_DIM>
__device__ __forceinline__ float wgmma_logit(const float* partial, int column) {
    constexpr int N = wgmma_keys<HEAD_DIM>();
    return ((partial[column] + partial[N + column]) + partial[2 * N + column]) + partial[3 * N + column];
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
__device__ __forceinline__ void wgmma_copy_key_tile(const KeyPages<kWgmmaKeyPieces>& at, const unsigned char* cache,
                                                    long long page_stride, long long pages, long long block_size,
                                                    int thread, unsigned char* tile, float* scales, int* present) {
    const unsigned int piece = wgmma_piece<HEAD_DIM>(static_cast<unsigned int>(thread));
    const unsigned int row0 = wgmma_row<HEAD_DIM>(static_cast<unsigned int>(thread));
#pragma unroll
    for (int k = 0; k < kWgmmaKeyPieces; ++k) {
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

// The scorer's dynamic shared memory on this path, in this order: a ring of
// kWgmmaStages key tiles and a spare one (for a token of another request
// than the tile's first), the tiles' scales and presence, the warps' partial
// sums, then the tile's weights and query rows, each token's in whole
// M-tiles of 64 rows (ops/index_logits_fp8.py sizes the launch by the same
// sum: kernel.geometry.index_logits_shared_bytes).
constexpr int kWgmmaStages = 3;

template <int HEAD_DIM>
struct WgmmaScorerShared {
    static constexpr int N = wgmma_keys<HEAD_DIM>();
    static constexpr int kTiles = kWgmmaStages + 1;
    unsigned char* base;
    float* scales;
    int* present;
    float* partial;
    float* weights;
    unsigned char* queries;
    __device__ __forceinline__ WgmmaScorerShared(unsigned char* dynamic, long long heads, long long tokens)
        : base(dynamic),
          scales(reinterpret_cast<float*>(dynamic + kTiles * kWgmmaKeyBytes)),
          present(reinterpret_cast<int*>(scales + kTiles * N)),
          partial(reinterpret_cast<float*>(present + kTiles * N)),
          weights(partial + 4 * N),
          queries(reinterpret_cast<unsigned char*>(weights + tokens * ((heads + kWgmmaRows - 1) / kWgmmaRows) *
                                                                  kWgmmaRows)) {}
    __device__ __forceinline__ unsigned char* key_tile(int i) const { return base + i * kWgmmaKeyBytes; }
    __device__ __forceinline__ float* key_scale(int i) const { return scales + i * N; }
    __device__ __forceinline__ int* key_present(int i) const { return present + i * N; }
};

// The fused select's dynamic shared memory on this path, after its
// selection buffers (kp::SelectGroupShared), in this order: for each of its
// two warpgroups a key tile, the keys' scales and presence and the warps'
// partial sums, then the weights and the query rows of the block's `tokens`
// tokens, each token's in whole M-tiles of 64 rows (ops/index_select_fp8.py
// sizes the launch by the same sum: index_select_shared_bytes).
constexpr int kWgmmaSelectGroups = 2;

template <int HEAD_DIM>
struct WgmmaSelectShared {
    static constexpr int N = wgmma_keys<HEAD_DIM>();
    static constexpr int kGroupBytes = kWgmmaKeyBytes + (1 + 1 + 4) * 4 * N;  // tile, scales, presence, partials
    unsigned char* base;
    float* weights;
    unsigned char* queries;
    __device__ __forceinline__ WgmmaSelectShared(unsigned char* dynamic, long long heads, int tokens)
        : base(dynamic),
          weights(reinterpret_cast<float*>(dynamic + kWgmmaSelectGroups * kGroupBytes)),
          queries(reinterpret_cast<unsigned char*>(weights +
                                                   tokens * ((heads + kWgmmaRows - 1) / kWgmmaRows * kWgmmaRows))) {}
    __device__ __forceinline__ unsigned char* key_tile(int group) const { return base + group * kGroupBytes; }
    __device__ __forceinline__ float* key_scale(int group) const {
        return reinterpret_cast<float*>(key_tile(group) + kWgmmaKeyBytes);
    }
    __device__ __forceinline__ int* key_present(int group) const {
        return reinterpret_cast<int*>(key_scale(group) + N);
    }
    __device__ __forceinline__ float* partial(int group) const {
        return reinterpret_cast<float*>(key_present(group) + N);
    }
};

}  // namespace kp

#endif  // KPOOL_INDEX_WGMMA_CUH
