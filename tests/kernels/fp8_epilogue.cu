// Drives kp::fp8_epilogue (kernels/kpool_fp8.cuh) over rows of float32 input,
// one group of D / 8 lanes per row, so tests/test_fp8_epilogue.py can compare
// its bytes with the NumPy reference. KEY: round x to bfloat16 first (the
// pooled key's side), else take x as it is (the query side).
template <int D, bool ROUND_SCALE, bool KEY>
__global__ void fp8_epilogue_rows(const float* __restrict__ x, long long rows, unsigned char* __restrict__ values,
                                  float* __restrict__ scales) {
    KP_THREADS_COOPERATE(true);
    long long row;
    int channel;
    // Surplus threads stay and run the epilogue on zeros: a whole warp of
    // groups, whichever have rows.
    const bool active = kp::thread_group<D>(&row, &channel) && row < rows;
    float v[kp::kChannelsPerThread];
    for (int i = 0; i < kp::kChannelsPerThread; ++i) {
        const float value = active ? x[row * D + channel + i] : 0.0f;
        v[i] = KEY ? kp::to_float(kp::from_float<kp::bf16>(value)) : value;
    }
    kp::Fp8Bytes q;
    const float scale = kp::fp8_epilogue<D / kp::kChannelsPerThread, ROUND_SCALE>(v, channel / 8, q);
    if (!active) return;
    for (int i = 0; i < kp::kChannelsPerThread; ++i)
        values[row * D + channel + i] = static_cast<unsigned char>(q[i / 4] >> (8 * (i % 4)));
    if (channel == 0) scales[row] = scale;
}
