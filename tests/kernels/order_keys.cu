// Drives kp::order_key (kernels/kpool_select.cuh) over an array of logits,
// one thread each, so tests/test_selection_trace.py can hold its keys against
// the selection rule and against tools/selection_trace.py's twin.
__global__ void order_keys(const float* __restrict__ logits, long long count, unsigned int* __restrict__ keys) {
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < count) keys[i] = kp::order_key(logits[i]);
}
