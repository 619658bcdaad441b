// The index scorer's shared routine: one warp scores one query token against
// 8 * NT pooled FP8 keys on tensor cores.
//
//     logit[p] = sum over h of  weights[h] * relu( s[p] * dot(q[h, :], k[p, :]) )
//
// relu keeps NaN (x < 0 ? 0 : x): an e4m3 NaN byte in q or k makes the
// logit NaN on every backend. Every logit is computed by this routine alone,
// so its sums run in one fixed order whatever calls it (the scoring kernel,
// a later fused selection): the D-sum in 32-wide mma steps in the order of
// `steps` below, each step's 32 products summed inside the tensor core (on
// the f16 paths in two mmas of 16, the second adding into the first's
// result); the H-sum per lane over its heads g, g + 8, g + 16, g + 24, ... (heads
// ascending in steps of 8, each lane a residue class mod 8), then across the
// 8 lanes of a column by the butterfly xor 4, 8, 16 (kp::own_tile_sums takes
// its sums, each lane left with its own tile's).
//
// Lane contract: lane = 4 g + t holds, for every 32-wide step, 8 bytes of
// query rows g and g + 8 of a 16-head tile and 8 bytes of key g of each
// 8-key tile: bytes [t * D/4 + 8 s, t * D/4 + 8 s + 8) of the rows for step
// s. A dot product does not depend on how its D positions are dealt to the
// mma's k positions as long as query and key deal them alike, so each lane
// reads its D/4 contiguous bytes with 16-byte loads; the mma sees them as
// k positions {4t .. 4t+3, 16+4t .. 16+4t+3} (e4m3) or two f16 halves of
// those (kpool_mma.h has the fragment layouts).
#ifndef KPOOL_INDEX_CUH
#define KPOOL_INDEX_CUH

#include "kpool_common.cuh"

namespace kp {

// 8 bytes of a row, as two 32-bit words (byte 0 lowest).
struct Bytes8 {
    unsigned int lo, hi;
};

// mma.sync and the sums' butterfly take the whole warp.
constexpr unsigned int kIndexWarpLanes = 0xffffffffu;

// Which tensor-core instruction scores: e4m3 mma.sync m16n8k32 (sm_89 and
// newer but sm_90) or, on sm_80, f16 mma.sync m16n8k16 after an exact
// conversion.
constexpr int kMmaF16 = 0;
constexpr int kMmaE4m3 = 1;
// Or, in an sm_90a build, a warpgroup's e4m3 wgmma (kpool_index_wgmma.cuh),
// whose sums run in their own order.
constexpr int kMmaWgmma = 2;
// Or, on sm_90 (no e4m3 mma.sync: ptxas lowers it to f16 HMMAs, converting
// both operands at every instruction and adding each step's sum to C apart),
// f16 mma.sync m16n8k16 on e4m3 the hardware converts exactly: a warp's keys
// once a tile (kp::key_operands), a token's query rows once a head tile, and
// a step's two mmas accumulating into C in turn.
constexpr int kMmaE4m3Hmma = 3;

// Two e4m3fn bytes (the low 16 bits) as two f16 halves, each exactly the
// e4m3 value times 2^-8: the 7 magnitude bits shifted into the f16's
// exponent and mantissa fields rebias 7 -> 15 for normals, and the e4m3
// subnormals (m * 2^-9) become f16 subnormals (m * 2^-17). NaN stays NaN.
__device__ __forceinline__ unsigned int e4m3x2_as_f16x2(unsigned int two) {
    unsigned int halves = 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const unsigned int byte = (two >> (8 * i)) & 0xffu, magnitude = byte & 0x7fu;
        const unsigned int half = ((byte & 0x80u) << 8) | (magnitude == 0x7fu ? 0x7e00u : magnitude << 7);
        halves |= half << (16 * i);
    }
    return halves;
}

// The f16 path's products are the e4m3 products times 2^-16; this undoes it
// (a power of two: exact).
constexpr float kF16Unscale = 65536.0f;

// Two e4m3fn bytes (the low 16 bits) as two f16 halves of the same values
// (exact: every e4m3 value is an f16). On sm_89 and newer one instruction
// (cvt.rn.f16x2.e4m3x2, an F2FP); the emulator and older GPUs build the
// halves from the bits. NaN stays NaN.
template <int HALF>
__device__ __forceinline__ unsigned int e4m3x2_to_f16x2(unsigned int word) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    unsigned int halves;
    if constexpr (HALF == 0)
        asm("{ .reg .b16 low, high; mov.b32 {low, high}, %1; cvt.rn.f16x2.e4m3x2 %0, low; }" : "=r"(halves) : "r"(word));
    else
        asm("{ .reg .b16 low, high; mov.b32 {low, high}, %1; cvt.rn.f16x2.e4m3x2 %0, high; }" : "=r"(halves) : "r"(word));
    return halves;
#else
    const unsigned int two = word >> (16 * HALF);
    unsigned int halves = 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const unsigned int byte = (two >> (8 * i)) & 0xffu, magnitude = byte & 0x7fu;
        unsigned int exponent = magnitude >> 3, mantissa = magnitude & 7u, half = 0x7e00u;  // NaN
        if (magnitude != 0x7fu) {
            // Normals rebias 7 -> 15; a subnormal (m * 2^-9) shifts until its leading one leaves the field.
            int field = static_cast<int>(exponent) + 8;
            if (exponent == 0) {
                field = mantissa == 0 ? 0 : 9;
                while (mantissa != 0 && (mantissa & 8u) == 0) {
                    mantissa <<= 1;
                    --field;
                }
                mantissa &= 7u;
            }
            half = (static_cast<unsigned int>(field) << 10) | (mantissa << 7);
        }
        halves |= (((byte & 0x80u) << 8) | half) << (16 * i);
    }
    return halves;
#endif
}

// A key tile's operands as kMmaE4m3Hmma's mmas take them: for each step, B of
// the mma of bytes 0-1 of each word, then of bytes 2-3.
struct Halves4 {
    unsigned int w[4];
};

// One 32-wide step of the D-sum into c: x and y are 8 bytes of query rows g
// and g + 8, z 8 bytes of key g (the lane contract above).
template <int MMA>
__device__ __forceinline__ void mma_step(float (&c)[4], Bytes8 x, Bytes8 y, Bytes8 z) {
    if constexpr (MMA == kMmaE4m3) {
        const unsigned int a[4] = {x.lo, y.lo, x.hi, y.hi};
        const unsigned int b[2] = {z.lo, z.hi};
        kp_mma_e4m3_m16n8k32(c, a, b, c);
    } else {
        // Bytes 0..3 of each word go to one m16n8k16: bytes 0, 1 at k 2t, 2t+1,
        // bytes 2, 3 at k 8+2t, 9+2t, for query and key alike.
        const unsigned int xs[2] = {x.lo, x.hi}, ys[2] = {y.lo, y.hi}, zs[2] = {z.lo, z.hi};
#pragma unroll
        for (int w = 0; w < 2; ++w) {
            const unsigned int a[4] = {e4m3x2_as_f16x2(xs[w]), e4m3x2_as_f16x2(ys[w]), e4m3x2_as_f16x2(xs[w] >> 16),
                                       e4m3x2_as_f16x2(ys[w] >> 16)};
            const unsigned int b[2] = {e4m3x2_as_f16x2(zs[w]), e4m3x2_as_f16x2(zs[w] >> 16)};
            kp_mma_f16_m16n8k16(c, a, b, c);
        }
    }
}

// kMmaE4m3Hmma's step: z as key_operands converted it; x and y converted here
// (a token's rows, once for all its key tiles where the caller unrolls them).
// HALF 0 takes bytes 0-1 of each word, HALF 1 bytes 2-3.
template <int HALF>
__device__ __forceinline__ void hmma_half(float (&c)[4], Bytes8 x, Bytes8 y, const Halves4& z) {
    const unsigned int a[4] = {e4m3x2_to_f16x2<HALF>(x.lo), e4m3x2_to_f16x2<HALF>(y.lo),
                               e4m3x2_to_f16x2<HALF>(x.hi), e4m3x2_to_f16x2<HALF>(y.hi)};
    const unsigned int b[2] = {z.w[2 * HALF], z.w[2 * HALF + 1]};
    kp_mma_f16_m16n8k16(c, a, b, c);
}
template <int MMA>
__device__ __forceinline__ void mma_step(float (&c)[4], Bytes8 x, Bytes8 y, const Halves4& z) {
    static_assert(MMA == kMmaE4m3Hmma, "Halves4 operands are kMmaE4m3Hmma's");
    hmma_half<0>(c, x, y, z);
    hmma_half<1>(c, x, y, z);
}

// A warp's key tiles as score_token takes them: the bytes as loaded, or on
// kMmaE4m3Hmma each step's f16 operands, converted once for every token and
// head the tiles meet.
template <int HEAD_DIM, int MMA, int NT>
struct KeyOperands {
    Bytes8 step[NT][HEAD_DIM / 32];
};
template <int HEAD_DIM, int NT>
struct KeyOperands<HEAD_DIM, kMmaE4m3Hmma, NT> {
    Halves4 step[NT][HEAD_DIM / 32];
};

template <int HEAD_DIM, int MMA, int NT>
__device__ __forceinline__ void key_operands(const Bytes8 (&keys)[NT][HEAD_DIM / 32],
                                             KeyOperands<HEAD_DIM, MMA, NT>& operands) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int s = 0; s < HEAD_DIM / 32; ++s) {
            if constexpr (MMA == kMmaE4m3Hmma) {
                const Bytes8 z = keys[n][s];
                operands.step[n][s] = Halves4{{e4m3x2_to_f16x2<0>(z.lo), e4m3x2_to_f16x2<0>(z.hi),
                                               e4m3x2_to_f16x2<1>(z.lo), e4m3x2_to_f16x2<1>(z.hi)}};
            } else {
                operands.step[n][s] = keys[n][s];
            }
        }
}

// 16 bytes of a row: one 16-byte load where VECTOR says they are 16-byte
// aligned, else byte loads (a query row may sit anywhere).
template <bool VECTOR>
__device__ __forceinline__ uint4 load_piece16(const unsigned char* from) {
    if constexpr (VECTOR) {
        return kp_load16(from);
    } else {
        unsigned int word[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int b = 0; b < 16; ++b) word[b / 4] |= static_cast<unsigned int>(from[b]) << (8 * (b % 4));
        return uint4{word[0], word[1], word[2], word[3]};
    }
}

// Key tiles of 8 pools a warp holds at once, as the scorer and the fused
// select both take them (a pool's place 8 n + g in its tile must agree): the
// keys stay at 32 registers; the f16 path at head_dim 128 takes 2 (with 4,
// ptxas for sm_80 spills: its conversions keep more alive).
template <int HEAD_DIM, int MMA>
__host__ __device__ constexpr int index_key_tiles() {
    return HEAD_DIM > 128 || (MMA == kMmaF16 && HEAD_DIM == 128) ? 2 : 4;
}

// This lane's D/4 bytes of a row as the steps' 8-byte pieces. VECTOR: the
// row's bytes are 16-byte aligned (16-byte loads); else 4-byte aligned
// (cache rows) or not at all (ALIGNED4 false: byte loads).
template <int HEAD_DIM, bool VECTOR, bool ALIGNED4>
__device__ __forceinline__ void load_row_part(const unsigned char* row, int t, Bytes8 (&part)[HEAD_DIM / 32]) {
    constexpr int kBytes = HEAD_DIM / 4;
    const unsigned char* from = row + t * kBytes;
    if constexpr (VECTOR) {
#pragma unroll
        for (int i = 0; i < kBytes / 16; ++i) {
            const uint4 v = kp_load16(from + 16 * i);
            part[2 * i] = Bytes8{v.x, v.y};
            part[2 * i + 1] = Bytes8{v.z, v.w};
        }
    } else if constexpr (ALIGNED4) {
        const unsigned int* words = reinterpret_cast<const unsigned int*>(from);
#pragma unroll
        for (int s = 0; s < HEAD_DIM / 32; ++s) part[s] = Bytes8{words[2 * s], words[2 * s + 1]};
    } else {
#pragma unroll
        for (int s = 0; s < HEAD_DIM / 32; ++s) {
            unsigned int w[2] = {0, 0};
#pragma unroll
            for (int j = 0; j < 8; ++j) w[j / 4] |= static_cast<unsigned int>(from[8 * s + j]) << (8 * (j % 4));
            part[s] = Bytes8{w[0], w[1]};
        }
    }
}

// Where a warp's keys come from, in two steps of loads that do not wait on
// each other's data until the second begins: the page of each of this
// lane's pools (pool first_pool + 8 n + g of key tile n) read from the
// request's table row, then the key rows and scales from those pages. A
// scorer that loads one tile ahead asks for the next tile's pages while the
// rows of this one are on their way.
template <int NT>
struct KeyPages {
    int page[NT];             // the table's entry; -1 where the pool is at or past reach or its column past the table
    unsigned int entry[NT];   // the pool's row in its page
};

// The page size as find_key_pages divides by it: clamped to [1, 2^31] (the
// checks refuse an empty page; a kernel called without them must not divide
// by zero).
__device__ __forceinline__ unsigned int block_size32(long long block_size) {
    return block_size < 1 ? 1u : (block_size < 2147483648LL ? static_cast<unsigned int>(block_size) : 2147483648u);
}

// The page size as find_key_pages divides by it (block_size32's, by a
// multiply: kp::Divisor).
using PageSize = Divisor;

__device__ __forceinline__ PageSize page_size_of(long long block_size) { return divisor_of(block_size32(block_size)); }

// The pages of this lane's pools: first_pool + g + STEP n (n < NT; the
// mma.sync scorer's lane g takes key g of each 8-pool tile). Pools below
// reach (at most 2^31 - 1, every pool id an int32) need 32 bits: one
// division (page's multiply) for the lane's first pool, then steps of STEP
// rows, each STEP / d columns and STEP % d rows with one carry (both below d).
template <int NT, int STEP = 8>
__device__ __forceinline__ void find_key_pages(long long first_pool, long long reach, const int* table_row,
                                               long long table_columns, const PageSize& page, int g,
                                               KeyPages<NT>& at) {
    const long long first = first_pool + g;
    // The lane's pools below reach, reach taken at most 2^31 - 1 (as every caller's is) and none where first is
    // negative (no caller's is), so that the multiply divides exactly (first below 2^31) whatever a kernel is
    // passed and the entry stays below d; 0 where none.
    const long long below = (reach < 2147483647LL ? reach : 2147483647LL) - first;
    const int ahead = below > 0 && first >= 0 ? static_cast<int>(below) : 0;
    unsigned int column = 0u, entry = 0u;
    if (ahead > 0) {
        column = page.quotient(static_cast<unsigned int>(first));
        entry = static_cast<unsigned int>(first) - column * page.size;
    }
    const unsigned int step_columns = page.quotient(static_cast<unsigned int>(STEP));
    const unsigned int step_rows = static_cast<unsigned int>(STEP) - step_columns * page.size;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        at.page[n] = -1;
        at.entry[n] = entry;
        if (STEP * n < ahead && column < table_columns) at.page[n] = table_row[column];
        column += step_columns;  // the next pool of the lane
        entry += step_rows;
        if (entry >= page.size) {
            entry -= page.size;
            ++column;
        }
    }
}

// This lane's part of key g of each tile (kp::load_row_part) and its scale,
// from the pages find_key_pages found; zero where the page is missing or
// outside the cache (have[n] false).
template <int HEAD_DIM, int NT, bool VECTOR_CACHE>
__device__ __forceinline__ void load_key_rows(const KeyPages<NT>& at, const unsigned char* cache,
                                              long long page_stride, long long pages, long long block_size, int t,
                                              Bytes8 (&keys)[NT][HEAD_DIM / 32], float (&scale)[NT],
                                              bool (&have)[NT]) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        have[n] = at.page[n] >= 0 && at.page[n] < pages;
        scale[n] = 0.0f;
        if (have[n]) {
            const unsigned char* base =
                cache + static_cast<unsigned long long>(static_cast<unsigned int>(at.page[n])) * page_stride;
            load_row_part<HEAD_DIM, VECTOR_CACHE, true>(base + static_cast<long long>(at.entry[n]) * HEAD_DIM, t,
                                                        keys[n]);
            scale[n] = reinterpret_cast<const float*>(base + block_size * HEAD_DIM)[at.entry[n]];
        } else {
#pragma unroll
            for (int s = 0; s < HEAD_DIM / 32; ++s) keys[n][s] = Bytes8{0u, 0u};
        }
    }
}

// scales[n][e] and present[n][e]: the scale and presence of key 8 n + 2 t + e,
// from the lanes that read it, as score_token and the writes want them.
// Every lane of the warp calls it together (shuffles).
template <int NT>
__device__ __forceinline__ void share_key_scales(const float (&scale)[NT], const bool (&have)[NT], int t,
                                                 float (&scales)[NT][2], bool (&present)[NT][2]) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            scales[n][e] = __shfl_sync(kIndexWarpLanes, scale[n], 4 * (2 * t + e));
            present[n][e] = __shfl_sync(kIndexWarpLanes, static_cast<int>(have[n]), 4 * (2 * t + e));
        }
}

// A warp's keys for pools first_pool + 8 n + g (n < NT) of `request`, lane
// (g, t) reading its part of key g of each tile: zero where the pool is at or
// past `reach`, its column past the table, or its page missing or outside the
// cache; scales and presence as share_key_scales gives them. The three steps
// above, one after the other. Every lane of the warp calls it together.
template <int HEAD_DIM, int NT, bool VECTOR_CACHE>
__device__ __forceinline__ void load_key_tiles(long long first_pool, long long reach, long long request,
                                               const unsigned char* cache, long long page_stride, long long pages,
                                               long long block_size, const PageSize& page,
                                               const int* cache_block_table, long long table_columns,
                                               long long table_stride, int g, int t,
                                               Bytes8 (&keys)[NT][HEAD_DIM / 32], float (&scales)[NT][2],
                                               bool (&present)[NT][2]) {
    KeyPages<NT> at;
    find_key_pages<NT>(first_pool, reach, cache_block_table + request * table_stride, table_columns, page, g, at);
    float scale[NT];
    bool have[NT];
    load_key_rows<HEAD_DIM, NT, VECTOR_CACHE>(at, cache, page_stride, pages, block_size, t, keys, scale, have);
    share_key_scales<NT>(scale, have, t, scales, present);
}

// kp::find_request's binary search and kp::request_rows, with the offsets
// and lengths of the search's first kTreeLevels steps read by a whole block
// at once into shared memory, so a batch of up to 2^kTreeLevels requests
// costs one round trip to global memory where the search took one per step.
// The tree holds, for each node of the search (heap order: node 1 the first
// step, node 2 n + 1 the step after going right from node n, 2 n after
// going left), the offset and length at that step's mid. Which index a node
// reads does not depend on the data, so every node is read together; the
// walk then takes exactly the search's steps, so garbage offsets (unsorted,
// out of range) land where kp::find_request lands. A batch larger than the
// tree reads its deeper steps from global memory, one step at a time.
constexpr int kTreeLevels = 9;
constexpr int kTreeNodes = 1 << kTreeLevels;  // nodes 1 .. kTreeNodes - 1; node 0: offsets[0], lengths[0]

struct RequestTree {
    long long offset[kTreeNodes];
    long long length[kTreeNodes];
    long long end;  // offsets[batch]
};

// What one thread of THREADS reads for the tree: its nodes' offsets and
// lengths as the arrays hold them, stored (widened, as load_index widens)
// by store_request_tree. Every index is worked out before the first load
// and nothing is widened before the last: a load issues without waiting
// for another's data. Nothing is read with no request (batch 0).
template <int THREADS, typename IO, typename IC>
struct TreePart {
    static constexpr int kNodes = kTreeNodes / THREADS;
    IO offset[kNodes], end;
    IC length[kNodes];
};

template <int THREADS, typename IO, typename IC>
__device__ __forceinline__ void load_request_tree(const IO* offsets, const IC* lengths, long long batch, int thread,
                                                  TreePart<THREADS, IO, IC>& part) {
    static_assert(kTreeNodes % THREADS == 0, "whole nodes a thread");
    constexpr int kNodes = TreePart<THREADS, IO, IC>::kNodes;
    long long at[kNodes];
    bool read[kNodes];
#pragma unroll
    for (int k = 0; k < kNodes; ++k) {
        const int node = thread + k * THREADS;
        at[k] = 0;
        read[k] = batch > 0 && (node == 0 || search_node_mid<long long>(node, 0, batch - 1, &at[k]));
    }
#pragma unroll
    for (int k = 0; k < kNodes; ++k) {
        part.offset[k] = read[k] ? offsets[at[k]] : IO(0);
        part.length[k] = read[k] ? lengths[at[k]] : IC(0);
    }
    part.end = batch > 0 && thread == 0 ? offsets[batch] : IO(0);
}

template <int THREADS, typename IO, typename IC>
__device__ __forceinline__ void store_request_tree(const TreePart<THREADS, IO, IC>& part, int thread,
                                                   RequestTree& tree) {
#pragma unroll
    for (int k = 0; k < TreePart<THREADS, IO, IC>::kNodes; ++k) {
        tree.offset[thread + k * THREADS] = static_cast<long long>(part.offset[k]);
        tree.length[thread + k * THREADS] = static_cast<long long>(part.length[k]);
    }
    if (thread == 0) tree.end = static_cast<long long>(part.end);
}

// kp::find_request then kp::request_rows for `item`, the tree's steps from
// shared memory: the same request, rows and length, the same verdict.
// batch > 0.
template <typename IO, typename IC>
__device__ __forceinline__ bool tree_request_rows(const RequestTree& tree, const IO* offsets, const IC* lengths,
                                                  long long batch, long long total_tokens, long long item,
                                                  long long* request, long long* row_begin, long long* row_end,
                                                  long long* cached) {
    long long lo = 0, hi = batch - 1;
    long long at_lo = tree.offset[0], length_lo = tree.length[0];  // offsets[lo], lengths[lo]
    long long above = tree.end;                                     // offsets[hi + 1]
    int node = 1;
    while (lo < hi) {
        const long long mid = lo + (hi - lo + 1) / 2;
        const bool held = node < kTreeNodes;
        // Past the tree both are read at once: a step is one round trip.
        const long long value = held ? tree.offset[node] : load_index(offsets, mid);
        const long long length = held ? tree.length[node] : load_index(lengths, mid);
        if (value <= item) {
            lo = mid;
            at_lo = value;
            length_lo = length;
            node = held ? 2 * node + 1 : node;  // past the tree it stays past
        } else {
            hi = mid - 1;
            above = value;
            node = held ? 2 * node : node;
        }
    }
    *request = lo;
    *row_begin = at_lo;
    *row_end = above;
    *cached = length_lo;
    return at_lo >= 0 && above <= total_tokens && at_lo <= above && length_lo >= 0;
}

// Each token of a block's tile: its request (-1: it sees nothing), the
// pools it sees (at most max_pools) and its reach, the most pools any token
// of its request in the tile sees (the keys a block loads for a request
// reach that far). One thread a token finds its request (tree_request_rows);
// the whole block calls it once the tree is in shared memory, and meets at
// two barriers. With no request (batch 0) no token is known.
template <typename IO, typename IC>
__device__ __forceinline__ void find_tile_tokens(const RequestTree& tree, const IO* offsets, const IC* lengths,
                                                 long long batch, long long num_tokens, long long kpool,
                                                 long long max_pools, long long token_begin, int tokens, int thread,
                                                 long long* token_request, long long* token_visible,
                                                 long long* token_reach) {
    if (thread < tokens) {
        const long long token = token_begin + thread;
        long long request = 0, row_begin = 0, row_end = 0, cached = 0;
        const bool known = batch > 0 &&
                           tree_request_rows(tree, offsets, lengths, batch, num_tokens, token, &request, &row_begin,
                                             &row_end, &cached) &&
                           token >= row_begin && token < row_end;
        const long long visible = known ? pools_visible(cached, token - row_begin, kpool) : 0;
        token_request[thread] = known ? request : -1;
        token_visible[thread] = visible < max_pools ? visible : max_pools;
    }
    __syncthreads();
    if (thread < tokens) {
        long long reach = 0;
        for (int j = 0; j < tokens; ++j)
            if (token_request[j] == token_request[thread] && token_visible[j] > reach) reach = token_visible[j];
        token_reach[thread] = reach;
    }
    __syncthreads();
}

// The sums of a column's 8 lanes (g = 0..7, one t) of each lane's values
// sums[n][e] (n < NT), lane g left with those of n = g mod NT in own[e]: the
// butterfly xor 4, 8, 16 (g's bits 0, 1, 2) of every value, halved where it
// can be: at g's bit b < log2 NT each lane keeps the values whose n has its
// bit b and adds its partner's partial of them, sending the others. Lane g's
// own[e] is the expression the full butterfly leaves there (at each step the
// lane's partial plus its partner's of the same n: the same operands, in an
// addition that commutes), in 2 NT - 2 + 2 (3 - log2 NT) shuffles where the
// butterfly took 6 NT (8 at NT 4, 24 before; 6 at NT 2, 12).
template <int NT>
__device__ __forceinline__ void own_tile_sums(float (&sums)[NT][2], int g, float (&own)[2]) {
    static_assert(NT == 2 || NT == 4, "two or four key tiles");
    // After the halving steps below, slot k holds n = k * step + g mod step.
    float slot[NT][2];
#pragma unroll
    for (int n = 0; n < NT; ++n) slot[n][0] = sums[n][0], slot[n][1] = sums[n][1];
#pragma unroll
    for (int bit = 0, count = NT; count > 1; ++bit, count /= 2) {
        const bool high = ((g >> bit) & 1) != 0;
#pragma unroll
        for (int k = 0; k < count / 2; ++k)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float low_n = slot[2 * k][e], high_n = slot[2 * k + 1][e];
                const float send = high ? low_n : high_n;
                slot[k][e] = (high ? high_n : low_n) + __shfl_xor_sync(kIndexWarpLanes, send, 4 << bit);
            }
    }
#pragma unroll
    for (int mask = 4 * NT; mask < 32; mask *= 2)
#pragma unroll
        for (int e = 0; e < 2; ++e) slot[0][e] += __shfl_xor_sync(kIndexWarpLanes, slot[0][e], mask);
    own[0] = slot[0][0];
    own[1] = slot[0][1];
}

// Whether keys 2 t and 2 t + 1 of this lane's own tile (n = g, as
// own_tile_sums leaves its logits) are present: present[g][e] for lanes g < NT,
// false on the others (they write nothing).
template <int NT>
__device__ __forceinline__ void own_tile_present(const bool (&present)[NT][2], int g, bool (&own)[2]) {
    own[0] = own[1] = false;
#pragma unroll
    for (int n = 0; n < NT; ++n)
        if (n == g)
#pragma unroll
            for (int e = 0; e < 2; ++e) own[e] = present[n][e];
}

// One warp's sums for one token: the logits of keys 8 g + 2 t + e (e < 2) of
// tile g in own[e], for lanes g < NT (lanes g >= NT hold tile g mod NT's).
// keys: this lane's parts of key g of each tile (zero where there is none);
// scales[n][e]: s of key 8 n + 2 t + e. q_token: the token's [heads,
// HEAD_DIM] rows, head_stride apart; w_token: its heads' weights. Every lane
// of the warp calls it together (mma.sync and the shuffles need the whole
// warp).
template <int HEAD_DIM, int MMA, int NT, bool VECTOR_Q>
__device__ __forceinline__ void score_token(const unsigned char* q_token, long long head_stride, long long heads,
                                            const float* w_token, const KeyOperands<HEAD_DIM, MMA, NT>& keys,
                                            const float (&scales)[NT][2], int lane, float (&own)[2]) {
    constexpr int kSteps = HEAD_DIM / 32;
    const int g = lane / 4, t = lane % 4;
    float sums[NT][2];
#pragma unroll
    for (int n = 0; n < NT; ++n) sums[n][0] = sums[n][1] = 0.0f;
    // Rows g and g + 8 of each tile of 16 heads: pointers stepped a tile at a time (no 64-bit multiply a tile).
    const unsigned char* row0 = q_token + g * head_stride;
    const long long row_step = 8 * head_stride;
    const float* weight0 = w_token + g;
    for (long long first = 0; first < heads; first += 16, row0 += 2 * row_step, weight0 += 16) {
        const long long h0 = first + g, h1 = first + g + 8;
        Bytes8 x[kSteps], y[kSteps];
#pragma unroll
        for (int s = 0; s < kSteps; ++s) x[s] = y[s] = Bytes8{0u, 0u};
        // A missing head's rows are zero and its term is never added.
        if (h0 < heads) load_row_part<HEAD_DIM, VECTOR_Q, false>(row0, t, x);
        if (h1 < heads) load_row_part<HEAD_DIM, VECTOR_Q, false>(row0 + row_step, t, y);
        const float w0 = h0 < heads ? weight0[0] : 0.0f, w1 = h1 < heads ? weight0[8] : 0.0f;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int s = 0; s < kSteps; ++s) mma_step<MMA>(c, x[s], y[s], keys.step[n][s]);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float dot0 = MMA == kMmaF16 ? c[e] * kF16Unscale : c[e];
                const float dot1 = MMA == kMmaF16 ? c[2 + e] * kF16Unscale : c[2 + e];
                if (h0 < heads) sums[n][e] = fmaf(w0, kp_relu_nan(scales[n][e] * dot0), sums[n][e]);
                if (h1 < heads) sums[n][e] = fmaf(w1, kp_relu_nan(scales[n][e] * dot1), sums[n][e]);
            }
        }
    }
    own_tile_sums<NT>(sums, g, own);
}

}  // namespace kp

#endif  // KPOOL_INDEX_CUH
