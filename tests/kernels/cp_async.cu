// Kernels that copy global memory into shared memory with cp.async
// (kernels/kpool_cp_async.cuh), for tests/test_emulator_cp_async.py: on the
// emulator, compiled for sm_80 and sm_90a, and on a GPU.
//
// The test prepends kernels/kpool_portability.h and kernels/kpool_cp_async.cuh
// (this file lives outside kernels/, where the source finder inlines
// includes).
//
// The ring: a block of 128 threads reads `tiles` tiles of its own, each 128
// rows of 16 bytes (four words, the keys) and 128 words (the scales),
// through a ring of kStages stages in shared memory, kStages - 1 tiles
// ahead: thread t copies row t and scale t of each tile (16-byte copies into
// the dynamic shared memory, 4-byte copies into a static __shared__ array),
// commits one group per tile, and before tile i waits until at most
// kStages - 2 groups are pending (tile i's has landed) and meets the block
// at a barrier (every thread's copies of tile i have landed). It then reads
// row t + 1 and scale t + 1, which thread t + 1 copied. A tile whose
// present[i] is 0 is not read: its copies pass read false and an address one
// past the keys' and the scales' ends, and land zeros.
//
//   out[block][t] = fold over tiles i of acc * 31 + (k0 ^ k1) + k2 + k3 * s,
//   (k0..k3, s) = tile i's row and scale (t + 1) % 128, uint32 arithmetic

constexpr int kStages = 3;
constexpr int kThreads = 128;
constexpr int kRowWords = 4;  // 16 bytes

enum Misuse : int {
    kNone = 0,
    kWaitTooLittle = 1,   // waits until kStages - 1 groups are pending: tile i's may not have landed
    kNoBarrier = 2,       // waits, but reads thread t + 1's row without the barrier
    kLeave = 3,             // thread 5 issues and commits one more copy and leaves without waiting
    kLeaveUncommitted = 4,  // thread 5 issues one more copy and leaves after a wait<0>, without committing it
    kMisalignedDst = 5,   // thread 7's first 16-byte copy 4 bytes into its row
    kMisalignedSrc = 6,   // thread 7's first 16-byte copy from 4 bytes into its row
    kGlobalDst = 7,       // thread 7's first 16-byte copy into out (global memory)
    kWriteDst = 8,        // thread 7 writes its row of tile 0 between the copy and the wait
    kWriteSrc = 9,        // thread 7 changes its source row of tile 0 between the copy and the wait
    kSameDst = 10,        // thread 7 copies tile 0's row twice into the same bytes, two groups in flight
};

// The tile's copies of thread t into ring stage `stage`.
__device__ __forceinline__ void copy_tile(unsigned int* keys_ring, unsigned int* scales_ring, const unsigned int* keys,
                                          const unsigned int* scales, const int* present, unsigned int* out,
                                          int block, int tiles, int tile, int stage, int misuse) {
    const int t = static_cast<int>(threadIdx.x);
    const bool read = present[tile] != 0;
    const long long row = (static_cast<long long>(block) * tiles + tile) * kThreads + t;
    // A missing tile's copies name one past the arrays' ends: read false must read nothing there.
    const long long end = static_cast<long long>(gridDim.x) * tiles * kThreads;
    unsigned int* dst = keys_ring + (stage * kThreads + t) * kRowWords;
    const unsigned int* src = keys + (read ? row : end) * kRowWords;
    if (t == 7 && tile == 0) {
        if (misuse == kMisalignedDst) dst += 1;
        if (misuse == kMisalignedSrc) src += 1;
        if (misuse == kGlobalDst) dst = out;
    }
    kp_cp_async16(dst, src, read);
    kp_cp_async4(scales_ring + stage * kThreads + t, scales + (read ? row : end), read);
    if (t == 7 && tile == 0) {
        if (misuse == kWriteDst) dst[0] = 0;
        if (misuse == kWriteSrc) const_cast<unsigned int*>(src)[0] ^= 1u;
        if (misuse == kSameDst) {
            kp_cp_async_commit();
            kp_cp_async16(dst, src, read);  // the same bytes, in a second group
        }
    }
}

__device__ __forceinline__ void ring(const unsigned int* keys, const unsigned int* scales, const int* present,
                                     unsigned int* out, int tiles, int misuse) {
    KP_DYNAMIC_SHARED(keys_bytes);  // [kStages][kThreads][kRowWords] words
    __shared__ unsigned int scales_ring[kStages * kThreads];
    unsigned int* const keys_ring = reinterpret_cast<unsigned int*>(keys_bytes);
    const int t = static_cast<int>(threadIdx.x), block = static_cast<int>(blockIdx.x);
    const int partner = (t + 1) % kThreads;
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < tiles) copy_tile(keys_ring, scales_ring, keys, scales, present, out, block, tiles, s, s, misuse);
        kp_cp_async_commit();
    }
    unsigned int acc = 0;
    for (int i = 0; i < tiles; ++i) {
        if (misuse == kWaitTooLittle)
            kp_cp_async_wait<kStages - 1>();
        else
            kp_cp_async_wait<kStages - 2>();  // tile i's group has landed
        if (misuse != kNoBarrier) __syncthreads();  // every thread's copies of tile i have; tile i - 1 is read
        const int ahead = i + kStages - 1;  // into the stage tile i - 1 left
        if (ahead < tiles)
            copy_tile(keys_ring, scales_ring, keys, scales, present, out, block, tiles, ahead, ahead % kStages, misuse);
        kp_cp_async_commit();
        const unsigned int* k = keys_ring + (i % kStages * kThreads + partner) * kRowWords;
        const unsigned int s = scales_ring[i % kStages * kThreads + partner];
        acc = acc * 31u + (k[0] ^ k[1]) + k[2] + k[3] * s;
    }
    kp_cp_async_wait<0>();  // the trailing groups are empty, except under kWaitTooLittle
    if (t == 5 && (misuse == kLeave || misuse == kLeaveUncommitted)) {
        kp_cp_async16(keys_ring + t * kRowWords, keys + t * kRowWords, true);
        if (misuse == kLeave) kp_cp_async_commit();
        else kp_cp_async_wait<0>();  // completes every committed group; the uncommitted copy stays in flight
    }
    out[block * kThreads + t] = acc;
}

// The ring with kStages * kThreads * 16 bytes of dynamic shared memory.
extern "C" __global__ void cp_async_ring(const unsigned int* keys, const unsigned int* scales, const int* present,
                                         unsigned int* out, int tiles, int misuse) {
    KP_THREADS_COOPERATE(true);
    ring(keys, scales, present, out, tiles, misuse);
}

// The ring without its misuses, for the SASS tests.
extern "C" __global__ void cp_async_ring_probe(const unsigned int* keys, const unsigned int* scales,
                                               const int* present, unsigned int* out, int tiles) {
    KP_THREADS_COOPERATE(true);
    ring(keys, scales, present, out, tiles, kNone);
}

// One copy in a kernel without KP_THREADS_COOPERATE: the emulator refuses it.
extern "C" __global__ void cp_async_alone(const unsigned int* keys, unsigned int* out) {
    alignas(16) __shared__ unsigned int rows[kThreads * kRowWords];
    const int t = static_cast<int>(threadIdx.x);
    kp_cp_async16(rows + t * kRowWords, keys + t * kRowWords, true);
    kp_cp_async_commit();
    kp_cp_async_wait<0>();
    out[t] = rows[t * kRowWords];
}

// The group rules, one thread's copies at a time (emulator only: it reads
// destinations whose copies may be in flight, which is undefined on a GPU).
// Each of the block's threads copies five 16-byte rows of `rows`
// [threads][5][4] words into its slots and records, after each wait, which
// slots already hold their row (bit j for slot j):
//   copy 0, commit (group 1), copy 1, commit (2), copy 2, commit (3), copy 3
//   wait<2>  -> observed[0]  group 1 complete
//   wait<1>  -> observed[1]  groups 1-2
//   wait<0>  -> observed[2]  groups 1-3; copy 3 is not committed
//   commit (4: copy 3), commit (5: empty), copy 4
//   wait<1>  -> observed[3]  group 4; the empty group 5 may stay pending, copy 4 is not committed
//   commit (6: copy 4), wait<0> -> observed[4]
extern "C" __global__ void cp_async_groups(const unsigned int* rows, unsigned int* observed) {
    KP_THREADS_COOPERATE(true);
    alignas(16) __shared__ unsigned int slots[32 * 5 * kRowWords];
    const int t = static_cast<int>(threadIdx.x);
    unsigned int* const mine = slots + t * 5 * kRowWords;
    const unsigned int* const from = rows + t * 5 * kRowWords;
    auto landed = [&]() {
        unsigned int bits = 0;
        for (int j = 0; j < 5; ++j) {
            bool same = true;
            for (int w = 0; w < kRowWords; ++w) same = same && mine[j * kRowWords + w] == from[j * kRowWords + w];
            bits |= static_cast<unsigned int>(same) << j;
        }
        return bits;
    };
    // The slots are static: a launch before this one left rows there.
    for (int w = 0; w < 5 * kRowWords; ++w) mine[w] = 0;
    for (int j = 0; j < 4; ++j) {
        kp_cp_async16(mine + j * kRowWords, from + j * kRowWords, true);
        if (j < 3) kp_cp_async_commit();
    }
    kp_cp_async_wait<2>();
    observed[t * 5 + 0] = landed();
    kp_cp_async_wait<1>();
    observed[t * 5 + 1] = landed();
    kp_cp_async_wait<0>();
    observed[t * 5 + 2] = landed();
    kp_cp_async_commit();
    kp_cp_async_commit();
    kp_cp_async16(mine + 4 * kRowWords, from + 4 * kRowWords, true);
    kp_cp_async_wait<1>();
    observed[t * 5 + 3] = landed();
    kp_cp_async_commit();
    kp_cp_async_wait<0>();
    observed[t * 5 + 4] = landed();
}
