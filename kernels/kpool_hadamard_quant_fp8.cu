// kpool_hadamard_quant_fp8: the query side of the FP8 epilogue. Each row of x
// [rows, HEAD_DIM] (bf16, fp16 or fp32, converted to float32 exactly, with
// no bf16 rounding first) is rotated and quantized as a pooled key is
// (kp::fp8_epilogue in kernels/kpool_fp8.cuh), so a query's scores against
// the FP8 cache are those of the unrotated bf16 query against the keys:
//
//     y = bf16(B(x) * fl32(1/sqrt(D)));  s = ue8m0(max|y| / 448);  q = e4m3fn(y / s)
//
// One group of HEAD_DIM / 8 threads per row, as kpool_compress's pools.
#include "kpool_fp8.cuh"

// VECTOR: kp::VectorAccess bits, kVectorK for 16-byte loads of x and
// kVectorOut for 8-byte stores of values. HEAD_DIM: a power of two, 8 to 256.
// ROUND_SCALE: power-of-two scales (kp::fp8_quantize).
template <typename T, int HEAD_DIM, int VECTOR, bool ROUND_SCALE>
__global__ void __launch_bounds__(kp::kMaxThreadsPerBlock, 1)
    kpool_hadamard_quant_fp8(const T* __restrict__ x, long long x_row_stride, long long rows,
                         unsigned char* __restrict__ values, long long values_row_stride, float* __restrict__ scales) {
    KP_THREADS_COOPERATE(true);
    long long row;
    int channel;
    // A group leaves as a whole (the shuffles wait for the warp's lanes that
    // have not left).
    if (!kp::thread_group<HEAD_DIM>(&row, &channel) || row >= rows) return;
    kp::Row8<T, kp::vector_bits(VECTOR, kp::kVectorK)> input;
    input.load(x + row * x_row_stride + channel);
    float v[kp::kChannelsPerThread];
#pragma unroll
    for (int i = 0; i < kp::kChannelsPerThread; ++i) v[i] = input[i];
    kp::Fp8Bytes q;
    const float scale =
        kp::fp8_epilogue<HEAD_DIM / kp::kChannelsPerThread, ROUND_SCALE>(v, channel / kp::kChannelsPerThread, q);
    kp::store_fp8<kp::vector_bits(VECTOR, kp::kVectorOut)>(values + row * values_row_stride, scales + row, channel, q,
                                                           scale);
}
