// Drives kp::store8 of bfloat16 (kernels/kpool_common.cuh: kp::pack_bf16x8)
// over float32 values, eight a thread, as 16-byte words (VECTOR) or as
// elements, so tests/test_bf16_store.py can compare every stored bfloat16
// with from_float<bf16>'s rule: on the emulator, and on a GPU, where a group
// of eight without a NaN takes the hardware's conversion.
template <bool VECTOR>
__global__ void bf16_store8_of(const float* __restrict__ x, long long n, kp::bf16* __restrict__ out) {
    const long long i = 8 * (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x);
    if (i >= n) return;
    float v[kp::kChannelsPerThread];
    for (int c = 0; c < kp::kChannelsPerThread; ++c) v[c] = x[i + c];
    kp::store8<VECTOR>(out + i, v);
}
