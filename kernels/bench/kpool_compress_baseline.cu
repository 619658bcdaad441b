// kpool_compress_baseline: the upstream kernel's geometry, for `kpool-cupy bench` only.
//
//     pooled[p, c] = sum_m softmax_m(gate[member m, c] + ape[m, c]) * k[member m, c]
//
// One block per pool, one thread per channel (blockDim.x == HEAD_DIM), scalar
// loads, and the pool's request found by a linear scan of pool_row_offsets,
// as Modular MAX's compress kernel does. The arithmetic is PoolChannel's over
// pool8's chunks, so the benchmark compares geometry and memory path, not
// numerics. Inputs are
// contiguous [total_tokens, HEAD_DIM] rows and int64 offsets.
#include "../kpool_common.cuh"

// Feeds one chunk of members, this thread's channel only, to PoolChannel.
template <typename T, int HEAD_DIM>
struct BaselineChunks {
    kp::PoolChannel& acc;
    const T* k;
    const T* gate;
    const float* ape;
    long long first;
    int channel;

    template <int COUNT, bool FIRST>
    __device__ __forceinline__ void operator()(kp::Chunk<COUNT, FIRST>, int m0) const {
        float logits[COUNT], keys[COUNT];
        for (int j = 0; j < COUNT; ++j) {
            const long long row = first + m0 + j;
            logits[j] = kp::to_float(gate[row * HEAD_DIM + channel]) + ape[(m0 + j) * HEAD_DIM + channel];
            keys[j] = kp::to_float(k[row * HEAD_DIM + channel]);
        }
        acc.template add<COUNT, FIRST>(logits, keys);
    }
};

template <typename T, int HEAD_DIM, int KPOOL>
__global__ void kpool_compress_baseline(const T* __restrict__ k, const T* __restrict__ gate,
                                        const float* __restrict__ ape, const long long* __restrict__ input_row_offsets,
                                        const long long* __restrict__ cache_lengths,
                                        const long long* __restrict__ pool_row_offsets, long long batch,
                                        T* __restrict__ pooled) {
    const long long pool = blockIdx.x;
    const int channel = threadIdx.x;
    if (batch <= 0 || channel >= HEAD_DIM || pool >= pool_row_offsets[batch]) return;
    long long request = 0;
    while (request + 1 < batch && pool_row_offsets[request + 1] <= pool) ++request;
    const long long phase = cache_lengths[request] % KPOOL;
    const long long first = input_row_offsets[request] + (phase == 0 ? 0 : KPOOL - phase) +
                            (pool - pool_row_offsets[request]) * KPOOL;

    // PoolChannel over the chunks pool8 uses, one channel per thread.
    kp::PoolChannel acc;
    kp::for_each_chunk<KPOOL, kp::chunk_members<KPOOL, T, T>()>(
        BaselineChunks<T, HEAD_DIM>{acc, k, gate, ape, first, channel});
    pooled[pool * HEAD_DIM + channel] = kp::from_float<T>(acc.value());
}
