// Kernels whose threads cooperate, for tests/test_emulator_cooperation.py.
//
// The test prepends kernels/kpool_portability.h (this file lives outside
// kernels/, where the source finder inlines includes) and builds it with
// the emulator's toolchain. Each kernel opens with KP_THREADS_COOPERATE.

// Butterfly reduction across each warp: every lane ends with the warp's sum
// and maximum. [blocks * blockDim.x] in, the same out.
__global__ void warp_sum_max(const float* in, float* sum, float* max) {
    KP_THREADS_COOPERATE(true);
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    float s = in[i], m = in[i];
    for (int offset = 16; offset >= 1; offset /= 2) {
        s += __shfl_xor_sync(0xffffffffu, s, offset);
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    }
    sum[i] = s;
    max[i] = m;
}

// Integer sum with __shfl_down_sync (lane 0 ends with the total), broadcast
// from lane 0 by __shfl_sync, and each lane's left neighbour by
// __shfl_up_sync (lane 0 keeps its own). [n] in; total and left out.
__global__ void warp_int_down_idx_up(const int* in, int* total, unsigned int* left) {
    KP_THREADS_COOPERATE(true);
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = in[i];
    for (unsigned int delta = 16; delta >= 1; delta /= 2) v += __shfl_down_sync(0xffffffffu, v, delta);
    total[i] = __shfl_sync(0xffffffffu, v, 0);
    left[i] = __shfl_up_sync(0xffffffffu, static_cast<unsigned int>(in[i]), 1u);
}

// Block sum in two steps: each warp reduces by shuffles, lane 0 parks the
// warp's sum in shared memory, and after the barrier warp 0 reduces those.
// blockDim.x is a multiple of 32, at most 1024. [blocks * blockDim.x] in,
// [blocks] out.
__global__ void block_sum(const float* in, float* out) {
    KP_THREADS_COOPERATE(true);
    __shared__ float warp_sums[32];
    const unsigned int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float s = in[blockIdx.x * blockDim.x + threadIdx.x];
    for (int offset = 16; offset >= 1; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (lane == 0) warp_sums[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = lane < blockDim.x / 32 ? warp_sums[lane] : 0.0f;
        for (int offset = 16; offset >= 1; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
        if (lane == 0) out[blockIdx.x] = s;
    }
    // The next block's warps overwrite warp_sums only after this block's
    // warp 0 read them: on a GPU another block has its own copy, on the
    // emulator the blocks run one after another.
}

// Walsh-Hadamard butterflies over rows of 128: 16 consecutive lanes own a
// row, lane l holding values 8l..8l+7. Strides 1, 2 and 4 pair values in
// one lane's registers; strides 8..64 pair lane l with lane l ^ (stride / 8)
// of the same 16 (width 16). Rows past `rows` load zeros and store nothing,
// but their lanes still take part in the shuffles. [rows, 128] in place.
__global__ void fwht128(float* x, int rows) {
    KP_THREADS_COOPERATE(true);
    const unsigned int lane = threadIdx.x % 16;
    const int row = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 16);
    float v[8];
    for (int i = 0; i < 8; ++i) v[i] = row < rows ? x[row * 128 + lane * 8 + i] : 0.0f;
    for (int h = 1; h < 8; h *= 2)
        for (int i = 0; i < 8; ++i)
            if ((i & h) == 0) {
                const float a = v[i], b = v[i + h];
                v[i] = a + b;
                v[i + h] = a - b;
            }
    for (int m = 1; m < 16; m *= 2)
        for (int i = 0; i < 8; ++i) {
            const float other = __shfl_xor_sync(0xffffffffu, v[i], m, 16);
            v[i] = (lane & m) == 0 ? v[i] + other : other - v[i];
        }
    if (row < rows)
        for (int i = 0; i < 8; ++i) x[row * 128 + lane * 8 + i] = v[i];
}

// width below 32 splits the warp into segments: a source past the lane's
// segment (xor, down) or before it (up) gives the lane its own value, and
// __shfl_sync's srcLane wraps into the segment. One full warp; out
// [4, 32]: xor 16 at width 16, srcLane 17 at width 16, down 3 and up 3 at
// width 8, each lane's value its lane number times 10.
__global__ void width_segments(int* out) {
    KP_THREADS_COOPERATE(true);
    const int lane = static_cast<int>(threadIdx.x);
    out[lane] = __shfl_xor_sync(0xffffffffu, lane * 10, 16, 16);
    out[32 + lane] = __shfl_sync(0xffffffffu, lane * 10, 17, 16);
    out[64 + lane] = __shfl_down_sync(0xffffffffu, lane * 10, 3u, 8);
    out[96 + lane] = __shfl_up_sync(0xffffffffu, lane * 10, 3u, 8);
}

// Warp sums in blocks whose last warp is partial: the mask names the lanes
// the warp has, a power of two here, and offsets stay below that count.
// [blocks * blockDim.x] in and out.
__global__ void partial_warp_sum(const float* in, float* out) {
    KP_THREADS_COOPERATE(true);
    const unsigned int warp_base = threadIdx.x / 32 * 32;
    const unsigned int lanes = blockDim.x - warp_base < 32 ? blockDim.x - warp_base : 32;
    const unsigned int mask = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    float s = in[i];
    for (unsigned int offset = 16; offset >= 1; offset /= 2)
        if (offset < lanes) s += __shfl_xor_sync(mask, s, static_cast<int>(offset));
    out[i] = __shfl_sync(mask, s, 0);
}

// The same with the full mask whatever the warp has: lanes past the block's
// end are named, which the emulator refuses.
__global__ void partial_warp_full_mask(const float* in, float* out) {
    KP_THREADS_COOPERATE(true);
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = __shfl_xor_sync(0xffffffffu, in[i], 1);
}

// Thread 0 skips the barrier the others wait at and exits.
__global__ void skip_barrier(float* out) {
    KP_THREADS_COOPERATE(true);
    if (threadIdx.x != 0) __syncthreads();
    out[threadIdx.x] = 1.0f;
}

// Thread 0 skips the first barrier and arrives at the second: on a GPU it
// would release the others' first barrier.
__global__ void skip_one_of_two_barriers(float* out) {
    KP_THREADS_COOPERATE(true);
    if (threadIdx.x != 0) __syncthreads();
    out[threadIdx.x] = 1.0f;
    __syncthreads();
}

// Lane 0 skips a shuffle whose mask names it.
__global__ void skip_shuffle(float* out) {
    KP_THREADS_COOPERATE(true);
    float v = static_cast<float>(threadIdx.x);
    if (threadIdx.x % 32 != 0) v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}

// Lane 0 skips a shuffle and waits at another: the two calls never meet.
__global__ void skip_shuffle_then_wait(float* out) {
    KP_THREADS_COOPERATE(true);
    float v = static_cast<float>(threadIdx.x);
    if (threadIdx.x % 32 != 0) v = __shfl_xor_sync(0xffffffffu, v, 1);
    v = __shfl_xor_sync(0xffffffffu, v, 2);
    out[threadIdx.x] = v;
}

// Groups of `width` lanes that leave as a whole while the warp's other groups
// shuffle within their own segments under the full mask (CUDA waits for the
// non-exited lanes a mask names): a group whose index in[g] is negative
// leaves; the others sum their segment by butterflies. __any_sync then tells
// every staying lane whether any staying lane of its warp has an odd value,
// __all_sync whether all have, and __ballot_sync which do.
__global__ void groups_leave_full_mask(const float* in, const int* keep, float* sum, int* any_odd, int* all_odd,
                                       unsigned int* odd_lanes, int width) {
    KP_THREADS_COOPERATE(true);
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (keep[i / width] == 0) return;
    float s = in[i];
    for (int offset = 1; offset < width; offset *= 2) s += __shfl_xor_sync(0xffffffffu, s, offset, width);
    sum[i] = s;
    const bool odd = static_cast<int>(in[i]) % 2 != 0;
    any_odd[i] = __any_sync(0xffffffffu, odd);
    all_odd[i] = __all_sync(0xffffffffu, odd);
    odd_lanes[i] = __ballot_sync(0xffffffffu, odd);
}

// A barrier in a kernel that does not say its threads cooperate.
__global__ void unmarked_barrier(float* out) {
    out[threadIdx.x] = 1.0f;
    __syncthreads();
}

// Overruns for the AddressSanitizer runs: a local array on a fiber's stack
// read at `index` after a shuffle, and out[threadIdx.x + past] written.
__global__ void overrun_stack(const int* index, float* out) {
    KP_THREADS_COOPERATE(true);
    float local[8];
    for (int i = 0; i < 8; ++i) local[i] = static_cast<float>(i + threadIdx.x);
    const float v = __shfl_xor_sync(0xffffffffu, local[threadIdx.x % 8], 1);
    out[threadIdx.x] = v + local[*index];
}
__global__ void overrun_heap(const float* in, float* out, int past) {
    KP_THREADS_COOPERATE(true);
    const float v = __shfl_xor_sync(0xffffffffu, in[threadIdx.x], 1);
    __syncthreads();
    out[threadIdx.x + past] = v;
}

// The order the emulator runs blocks in: thread 0 of each block takes the
// next ticket; block_order_synced's threads cooperate (fibers), block_order
// runs the plain loop. [blocks] tickets out.
__global__ void block_order(unsigned int* counter, unsigned int* ticket) {
    if (threadIdx.x == 0) ticket[blockIdx.x] = atomicAdd(counter, 1u);
}
__global__ void block_order_synced(unsigned int* counter, unsigned int* ticket) {
    KP_THREADS_COOPERATE(true);
    __syncthreads();
    if (threadIdx.x == 0) ticket[blockIdx.x] = atomicAdd(counter, 1u);
}
