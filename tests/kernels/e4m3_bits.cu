// Drives kp::e4m3fn_bits (kernels/kpool_fp8.cuh) over an array of float32
// values, one thread each, and kp::e4m3x4_bits (the conversion the epilogue
// runs: the hardware's on sm_89 and newer) four values a thread, so
// tests/test_fp8_epilogue.py and tests/test_gpu_fp8.py can compare every
// byte with the NumPy reference's conversion.
__global__ void e4m3_bits_of(const float* __restrict__ x, long long n, unsigned char* __restrict__ out) {
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = static_cast<unsigned char>(kp::e4m3fn_bits(x[i]));
}

// n a multiple of 4; out[i .. i + 3] from one word, its low byte first.
__global__ void e4m3x4_bits_of(const float* __restrict__ x, long long n, unsigned char* __restrict__ out) {
    const long long i = 4 * (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x);
    if (i >= n) return;
    const unsigned int word = kp::e4m3x4_bits(x[i], x[i + 1], x[i + 2], x[i + 3]);
    for (int b = 0; b < 4; ++b) out[i + b] = static_cast<unsigned char>(word >> (8 * b));
}
