// Drives kp_relu_nan (kernels/kpool_portability.h: max.ftz.NaN.f32 on the
// GPU) over an array of float32 values, one thread each, so
// tests/test_relu_nan.py can compare every result's bits with its rule on the
// emulator and on a GPU.
__global__ void relu_nan_of(const float* __restrict__ x, long long n, float* __restrict__ out) {
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = kp_relu_nan(x[i]);
}
