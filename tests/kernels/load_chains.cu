// Kernels whose dependent global-load depth is known by construction, for
// tests/test_load_depth.py to read back off their SASS. Templates, so that a
// compile holds only the instance named.

// Pointer chasing: each load's address is the previous load's value. Depth
// DEPTH.
template <int DEPTH>
__global__ void chase(const long long* __restrict__ next, long long* __restrict__ out) {
    long long at = threadIdx.x;
#pragma unroll
    for (int i = 0; i < DEPTH; ++i) at = next[at];
    out[threadIdx.x] = at;
}

// The decode step as it was before issue 21 (one token a request, a ring of
// ROWS rows): the slot (1) guards the position's load (2), the position
// guards the token's (3), and the pool reads back the ring row it has just
// stored the token in (4).
template <int ROWS>
__global__ void decode_step_before(const int* __restrict__ slots, const int* __restrict__ positions,
                                   const float* __restrict__ k, float* ring, float* out) {
    const int r = threadIdx.x;
    const int slot = slots[r];
    if (slot < 0) return;
    const int position = positions[r];
    if (position < 0) return;
    float* const row = ring + slot * ROWS;
    row[position % ROWS] = k[r];
    if (position % 4 != 3) return;
    float sum = 0.0f;
    for (int m = 0; m < 4; ++m) sum += row[(position - m) % ROWS];
    out[r] = sum;
}
