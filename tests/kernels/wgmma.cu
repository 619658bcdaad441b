// Kernels that run Hopper's e4m3 wgmma (kernels/kpool_wgmma.cuh), for
// tests/test_emulator_wgmma.py: on the emulator, and compiled for sm_90a.
//
// The test prepends kernels/kpool_portability.h and kernels/kpool_wgmma.cuh
// (this file lives outside kernels/, where the source finder inlines
// includes).
//
// A K-major operand tile [rows x kbytes] (rows a multiple of 8, kbytes of
// k-steps of 32) is staged in one of the PTX ISA's canonical layouts:
//
//   no swizzle   one slab of rows x 32 bytes per k-step, made of core
//                matrices (8 rows x 16 bytes, 128 contiguous bytes), either
//                k-adjacent (A: LBO 128, SBO 256) or row-adjacent
//                (B: SBO 128, LBO 16 rows)
//   W-byte swizzle (W = 128, 64, 32)  blocks of W k bytes, each rows x W
//                bytes row after row, from a tile aligned to 8 W bytes; in
//                each row the 16-byte chunk c sits at chunk
//                  c ^ (r % 8)        for 128 bytes (8 chunks a row)
//                  c ^ (r / 2 % 4)    for 64 bytes (4 chunks, 2 rows a 128-byte line)
//                  c ^ (r / 4 % 2)    for 32 bytes (2 chunks, 4 rows a 128-byte line)
//                and the descriptor of k-step s starts 32 s bytes along
//                (block 32 s / W, offset 32 s % W), SBO 8 W.

enum Misuse : int {
    kNone = 0,
    kReadInFlight = 1,     // reads an accumulator element between commit and wait
    kWriteInFlight = 2,    // thread 0 of the block changes a byte of A between commit and wait
    kNoFence = 3,          // no wgmma.fence before the first wgmma
    kTouchAfterFence = 4,  // writes the accumulator after the fence, before the wgmma
    kSecondGroup = 5,      // a second group in flight: wait<1> completes the first, whose D is written
    kReadSecondEarly = 6,  // as kSecondGroup, but reads the second group's accumulator after wait<1>
    kDisagree = 7,         // thread 5 passes another B descriptor
    kLeaveInFlight = 8,    // returns without waiting
    kStaggered = 9,        // right, but warps 1-3 meet at a __syncwarp first: the warpgroup arrives in two rounds
};

constexpr int kMaxKBytes = 256;
constexpr int kBBytes = 32768;

__device__ __forceinline__ int swizzle_width(int swizzle) { return swizzle == kp_swizzle_none ? 0 : 128 >> (swizzle - 1); }

// The k bytes a row of the tile spans: kbytes, rounded up to whole W-byte blocks.
__device__ __forceinline__ int padded_kbytes(int kbytes, int swizzle) {
    const int w = swizzle_width(swizzle);
    return w == 0 ? kbytes : (kbytes + w - 1) / w * w;
}

// The byte offset of chunk (row r, k bytes k..k+15) in a tile of `rows` rows.
__device__ __forceinline__ int tile_offset(int r, int k, int rows, int kbytes, int swizzle, bool k_adjacent) {
    if (swizzle == kp_swizzle_none) {
        const int slab = k / 32 * rows * 32, half = k % 32 / 16;
        return slab + (r % 8) * 16 + (k_adjacent ? r / 8 * 256 + half * 128 : r / 8 * 128 + half * rows * 16);
    }
    const int w = swizzle_width(swizzle), chunk = k % w / 16;
    const int row_bits = swizzle == kp_swizzle_128b ? r % 8 : swizzle == kp_swizzle_64b ? r / 2 % 4 : r / 4 % 2;
    (void)kbytes;
    return k / w * rows * w + r * w + 16 * (chunk ^ row_bits);
}

__device__ __forceinline__ unsigned long long tile_desc(const unsigned char* tile, int rows, int step, int swizzle,
                                                       bool k_adjacent) {
    if (swizzle == kp_swizzle_none)
        return kp_wgmma_desc(tile + step * rows * 32, k_adjacent ? 128 : rows * 16, k_adjacent ? 256 : 128,
                             kp_swizzle_none);
    const int w = swizzle_width(swizzle);
    return kp_wgmma_desc(tile + 32 * step / w * rows * w + 32 * step % w, 16, 8 * w, static_cast<KpSwizzle>(swizzle));
}

__device__ __forceinline__ void stage(unsigned char* tile, const unsigned char* rows_in, int rows, int kbytes,
                                      int swizzle, bool k_adjacent) {
    for (int i = threadIdx.x; i < rows * kbytes / 16; i += blockDim.x) {
        const int r = i / (kbytes / 16), k = 16 * (i % (kbytes / 16));
        const uint4 v = kp_load16(rows_in + static_cast<long long>(r) * kbytes + k);
        *reinterpret_cast<uint4*>(tile + tile_offset(r, k, rows, kbytes, swizzle, k_adjacent)) = v;
    }
}

// D fragment element i of this thread: row and column in the warpgroup's [64 x N].
__device__ __forceinline__ int fragment_row(int i) { return threadIdx.x % 128 / 32 * 16 + threadIdx.x % 32 / 4 + 8 * (i / 2 % 2); }
__device__ __forceinline__ int fragment_column(int i) { return 8 * (i / 4) + 2 * (threadIdx.x % 4) + i % 2; }

template <int N>
__device__ void product(unsigned char* sa, unsigned char* sb, float* d, int ksteps, int swizzle, int misuse) {
    const int g = threadIdx.x / 128, t = threadIdx.x % 128, width = N * (blockDim.x / 128);
    unsigned char* b_tile = sb + g * N * padded_kbytes(32 * ksteps, swizzle);
    KpWgmmaAccum<N> acc;
    if (misuse == kStaggered && t >= 32) __syncwarp();
    if (misuse != kNoFence) kp_wgmma_fence();
    if (misuse == kTouchAfterFence) acc[0] = 0.0f;
#pragma unroll 1
    for (int s = 0; s < ksteps; ++s) {
        unsigned long long db = tile_desc(b_tile, N, s, swizzle, false);
        if (misuse == kDisagree && t == 5) db += 2;
        kp_wgmma_e4m3(acc, tile_desc(sa, 64, s, swizzle, true), db, s > 0);
    }
    kp_wgmma_commit();
    if (misuse == kReadInFlight) d[0] = acc[0];
    if (misuse == kWriteInFlight && threadIdx.x == 0) sa[tile_offset(0, 32 * (ksteps - 1), 64, 32 * ksteps, swizzle, true)] ^= 1;
    if (misuse == kLeaveInFlight) return;
    if (misuse == kSecondGroup || misuse == kReadSecondEarly) {
        KpWgmmaAccum<N> other;
        kp_wgmma_fence();
        kp_wgmma_e4m3(other, tile_desc(sa, 64, 0, swizzle, true), tile_desc(b_tile, N, 0, swizzle, false), 0);
        kp_wgmma_commit();
        kp_wgmma_wait<1>();
        if (misuse == kReadSecondEarly) d[0] = other[0];
        for (int i = 0; i < N / 2; ++i) d[fragment_row(i) * width + g * N + fragment_column(i)] = acc[i];
        kp_wgmma_wait<0>();
        return;
    }
    kp_wgmma_wait<0>();  // completes the k-steps' group
    for (int i = 0; i < N / 2; ++i) d[fragment_row(i) * width + g * N + fragment_column(i)] = acc[i];
}

// D = A B^T per block: a [blocks][64][32 ksteps], b [blocks][G n][32 ksteps]
// and d [blocks][64][G n] (G = blockDim.x / 128 warpgroups, warpgroup g
// taking B's rows g n .. g n + n - 1), e4m3 bytes in, float32 out.
// `swizzle` is the descriptor's field, `misuse` one of the mistakes above.
extern "C" __global__ void wgmma_product(const unsigned char* a, const unsigned char* b, float* d, int n, int ksteps,
                                         int swizzle, int misuse) {
    KP_THREADS_COOPERATE(true);
    alignas(1024) __shared__ unsigned char sa[64 * kMaxKBytes];
    alignas(1024) __shared__ unsigned char sb[kBBytes];
    const int kbytes = 32 * ksteps, width = n * (blockDim.x / 128);
    a += static_cast<long long>(blockIdx.x) * 64 * kbytes;
    b += static_cast<long long>(blockIdx.x) * width * kbytes;
    d += static_cast<long long>(blockIdx.x) * 64 * width;
    stage(sa, a, 64, kbytes, swizzle, true);
    const int b_tile = n * padded_kbytes(kbytes, swizzle);
    for (int g = 0; g < static_cast<int>(blockDim.x / 128); ++g)
        stage(sb + g * b_tile, b + static_cast<long long>(g) * n * kbytes, n, kbytes, swizzle, false);
    kp_fence_proxy_async();
    __syncthreads();
    switch (n) {
        case 8: product<8>(sa, sb, d, ksteps, swizzle, misuse); break;
        case 16: product<16>(sa, sb, d, ksteps, swizzle, misuse); break;
        case 32: product<32>(sa, sb, d, ksteps, swizzle, misuse); break;
        case 64: product<64>(sa, sb, d, ksteps, swizzle, misuse); break;
        default: product<128>(sa, sb, d, ksteps, swizzle, misuse); break;
    }
}

// kp_wgmma_desc's bits for a few arguments (the first gives the address's).
extern "C" __global__ void wgmma_descriptors(unsigned long long* out) {
    alignas(1024) __shared__ unsigned char s[4096];
    if (threadIdx.x != 0) return;
    out[0] = kp_wgmma_desc(s, 0, 0, kp_swizzle_none);
    out[1] = kp_wgmma_desc(s + 48, 128, 2048, kp_swizzle_none);
    out[2] = kp_wgmma_desc(s + 1056, 16, 1024, kp_swizzle_128b);
    out[3] = kp_wgmma_desc(s + 512, 4080, 512, kp_swizzle_64b);
    out[4] = kp_wgmma_desc(s + 3840, 262128, 256, kp_swizzle_32b);
}

// What ptxas makes of the wrappers: four k-steps of m64nNk32 from 128-byte
// swizzled tiles, one group, one wait. [64 x 128] and [N x 128] e4m3 in,
// [64 x N] out, one warpgroup.
template <int N>
__global__ void wgmma_probe(const unsigned char* a, const unsigned char* b, float* d) {
    KP_THREADS_COOPERATE(true);
    alignas(1024) __shared__ unsigned char sa[64 * 128];
    alignas(1024) __shared__ unsigned char sb[N * 128];
    stage(sa, a, 64, 128, kp_swizzle_128b, true);
    stage(sb, b, N, 128, kp_swizzle_128b, false);
    kp_fence_proxy_async();
    __syncthreads();
    KpWgmmaAccum<N> acc;
    kp_wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s)
        kp_wgmma_e4m3(acc, tile_desc(sa, 64, s, kp_swizzle_128b, true), tile_desc(sb, N, s, kp_swizzle_128b, false),
                      s > 0);
    kp_wgmma_commit();
    kp_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < N / 2; ++i) d[fragment_row(i) * N + fragment_column(i)] = acc[i];
}
