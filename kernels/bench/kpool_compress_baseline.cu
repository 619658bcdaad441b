// kpool_compress_baseline: the upstream kernel's geometry, for `kpool-cupy bench` only.
//
//     pooled[p, c] = sum_m softmax_m(gate[member m, c] + ape[m, c]) * k[member m, c]
//
// One block per pool, one thread per channel (blockDim.x == HEAD_DIM), scalar
// loads, and the pool's request found by a linear scan of pool_row_offsets,
// as Modular MAX's compress kernel does. The arithmetic is PoolChannel's, so
// the benchmark compares geometry and memory path, not numerics. Inputs are
// contiguous [total_tokens, HEAD_DIM] rows and int64 offsets.
#include "../kpool_common.cuh"

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

    kp::PoolChannel acc;
    acc.first(kp::to_float(gate[first * HEAD_DIM + channel]) + ape[channel],
              kp::to_float(k[first * HEAD_DIM + channel]));
    for (int m = 1; m < KPOOL; ++m) {
        const long long row = first + m;
        acc.push(kp::to_float(gate[row * HEAD_DIM + channel]) + ape[m * HEAD_DIM + channel],
                 kp::to_float(k[row * HEAD_DIM + channel]));
    }
    pooled[pool * HEAD_DIM + channel] = kp::from_float<T>(acc.value());
}
