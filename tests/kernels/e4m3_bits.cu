// Drives kp::e4m3fn_bits (kernels/kpool_fp8.cuh) over an array of float32
// values, one thread each, so tests/test_fp8_epilogue.py can compare every
// byte with the NumPy reference's conversion.
__global__ void e4m3_bits_of(const float* __restrict__ x, long long n, unsigned char* __restrict__ out) {
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = static_cast<unsigned char>(kp::e4m3fn_bits(x[i]));
}
