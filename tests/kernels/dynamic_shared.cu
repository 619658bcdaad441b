// Kernels that use the block's dynamic shared memory (KP_DYNAMIC_SHARED,
// kernels/kpool_portability.h), for tests/test_emulator_dynamic_shared.py:
// on the emulator, compiled by NVRTC, and on a GPU.
//
// The test prepends kernels/kpool_portability.h (this file lives outside
// kernels/, where the source finder inlines includes). A block's dynamic
// shared memory is `words` 32-bit words here; thread t of a block of
// `threads` owns words t, t + threads, t + 2 threads, ...

// Every byte of a word the emulator poisons (kp_dynamic_shared_poison).
constexpr unsigned int kPoisonWord = 0xffffffffu;

// The block's dynamic shared memory as words, declared under another name in
// a device function: every declaration names the same bytes.
__device__ __forceinline__ unsigned int* shared_words() {
    KP_DYNAMIC_SHARED(helper_bytes);
    return reinterpret_cast<unsigned int*>(helper_bytes);
}

// Each thread counts its words that do not hold the poison (unpoisoned[block][t]),
// writes each word w of its own the value block * words + w, and after the
// barrier copies the words of thread threads - 1 - t (written by another
// thread, in a block of more than one) to out[block][w]. address[block][t]
// holds where the kernel's declaration and the helper's point.
extern "C" __global__ void dynamic_shared_exchange(unsigned int* out, unsigned int* unpoisoned,
                                                   unsigned long long* address, int words) {
    KP_THREADS_COOPERATE(true);
    KP_DYNAMIC_SHARED(block_bytes);
    unsigned int* const mine = reinterpret_cast<unsigned int*>(block_bytes);
    const int threads = static_cast<int>(blockDim.x), t = static_cast<int>(threadIdx.x);
    const int block = static_cast<int>(blockIdx.x);
    unsigned int seen = 0;
    for (int w = t; w < words; w += threads) seen += mine[w] != kPoisonWord;
    unpoisoned[block * threads + t] = seen;
    for (int w = t; w < words; w += threads) mine[w] = static_cast<unsigned int>(block * words + w);
    __syncthreads();
    const unsigned int* const theirs = shared_words();
    for (int w = threads - 1 - t; w < words; w += threads) out[block * words + w] = theirs[w];
    address[2 * (block * threads + t)] = reinterpret_cast<unsigned long long>(block_bytes);
    address[2 * (block * threads + t) + 1] = reinterpret_cast<unsigned long long>(theirs);
}

// The same without a barrier (threads that never wait for each other, which
// the emulator runs one after another): each thread counts its words that do
// not hold the poison, writes them and copies them back to out.
extern "C" __global__ void dynamic_shared_own_words(unsigned int* out, unsigned int* unpoisoned, int words) {
    KP_DYNAMIC_SHARED(block_bytes);
    unsigned int* const mine = reinterpret_cast<unsigned int*>(block_bytes);
    const int threads = static_cast<int>(blockDim.x), t = static_cast<int>(threadIdx.x);
    const int block = static_cast<int>(blockIdx.x);
    unsigned int seen = 0;
    for (int w = t; w < words; w += threads) seen += mine[w] != kPoisonWord;
    unpoisoned[block * threads + t] = seen;
    for (int w = t; w < words; w += threads) mine[w] = static_cast<unsigned int>(block * words + w);
    for (int w = t; w < words; w += threads) out[block * words + w] = mine[w];
}

// Declares the dynamic shared memory and, when `touch` is set, copies its
// byte `offset` to out[0]: past the launch's bytes that is a fault (0 bytes)
// or AddressSanitizer's report.
extern "C" __global__ void dynamic_shared_touch(unsigned char* out, int offset, int touch) {
    KP_DYNAMIC_SHARED(block_bytes);
    if (touch) out[0] = block_bytes[offset];
}
