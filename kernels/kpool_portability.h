// Host definitions of the CUDA built-ins the kernels use, so the same kernel
// text compiles with NVRTC for the GPU and with a host C++ compiler for the
// CPU emulator.
//
// Under NVRTC (__CUDACC__) this header only names the bit casts and the
// 16-byte load/store; everything else is NVRTC's own. On the host it defines
// the qualifiers, dim3, uint4 and the index variables with the same meaning,
// and kp_emulate_launch runs a grid one thread after another. That is faithful
// only because no kernel lets its threads communicate: there is no
// __syncthreads, no shared memory and no warp shuffle to emulate.
#ifndef KPOOL_PORTABILITY_H
#define KPOOL_PORTABILITY_H

#if defined(__CUDACC__)

#define KP_DEVICE_CODE 1

__device__ __forceinline__ float kp_bits_to_float(unsigned int bits) { return __uint_as_float(bits); }
__device__ __forceinline__ unsigned int kp_float_to_bits(float value) { return __float_as_uint(value); }
__device__ __forceinline__ uint4 kp_load16(const void* address) {
    return *reinterpret_cast<const uint4*>(address);
}
__device__ __forceinline__ void kp_store16(void* address, uint4 value) {
    *reinterpret_cast<uint4*>(address) = value;
}
// The softmax's two approximations: one MUFU instruction each, flushing
// subnormals like the rest of the build (-ftz=true). ex2.approx errs by at
// most 2 ulp, rcp.approx by at most 1 (PTX ISA); the README's error bound
// covers both.
__device__ __forceinline__ float kp_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float kp_rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// 1 / x correctly rounded: reproducible on the host, for index arithmetic.
__device__ __forceinline__ float kp_rcp_rn(float x) { return __frcp_rn(x); }

#else  // host compiler: the emulator

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#define KP_DEVICE_CODE 0
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
// __restrict__ is spelled the same by g++ and clang++.

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};

// One emulated thread runs at a time per host thread, so these are the
// indices of "the current CUDA thread" exactly as a kernel reads them.
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

inline float kp_bits_to_float(unsigned int bits) {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}
inline unsigned int kp_float_to_bits(float value) {
    unsigned int bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
}
// exp2 and the reciprocal, correctly rounded (glibc) where the GPU's
// instructions are approximate. Built with -DKP_APPROX_WORST_ULPS=N they err
// on purpose by N ulp (2 for exp2, N / 2 for the reciprocal), in a sign
// that alternates with the input's last bit, so a test can check that the
// error bound still holds when the GPU's approximations err their most.
#ifndef KP_APPROX_WORST_ULPS
#define KP_APPROX_WORST_ULPS 0
#endif
inline float kp_nudge_ulps(float value, unsigned int input_bits, int ulps) {
    if (ulps == 0 || !std::isfinite(value) || value == 0.0f) return value;
    const float toward = (input_bits & 1u) ? INFINITY : 0.0f;
    for (int i = 0; i < ulps; ++i) value = std::nextafter(value, toward);
    return value;
}
inline float kp_exp2(float x) {
    return kp_nudge_ulps(std::exp2(x), kp_float_to_bits(x), KP_APPROX_WORST_ULPS);
}
inline float kp_rcp_rn(float x) { return 1.0f / x; }
inline float kp_rcp(float x) { return kp_nudge_ulps(1.0f / x, kp_float_to_bits(x), KP_APPROX_WORST_ULPS / 2); }

// A GPU faults on a misaligned 16-byte access; memcpy would not, so the
// emulator stops here instead, and a wrong vector_mask cannot pass unseen.
inline void kp_require_aligned16(const void* address) {
    if (reinterpret_cast<std::uintptr_t>(address) % 16 != 0) {
        std::fprintf(stderr, "kpool emulator: misaligned 16-byte access at %p\n", address);
        std::abort();
    }
}
// 16-byte accesses of the launch running on this host thread, so a test can
// tell that the vector path ran where alignment allows it.
inline thread_local unsigned long long kp_vector_accesses = 0;
inline uint4 kp_load16(const void* address) {
    kp_require_aligned16(address);
    ++kp_vector_accesses;
    uint4 value;
    std::memcpy(&value, address, sizeof value);
    return value;
}
inline void kp_store16(void* address, uint4 value) {
    kp_require_aligned16(address);
    ++kp_vector_accesses;
    std::memcpy(address, &value, sizeof value);
}

// Runs kernel over grid x block, thread by thread. args follows the CUDA
// driver's convention: args[i] points at the value of parameter i.
template <typename... Params, std::size_t... I>
void kp_emulate_grid(void (*kernel)(Params...), dim3 grid, dim3 block, void** args,
                     std::index_sequence<I...>) {
    gridDim = grid;
    blockDim = block;
    for (unsigned int bz = 0; bz < grid.z; ++bz)
        for (unsigned int by = 0; by < grid.y; ++by)
            for (unsigned int bx = 0; bx < grid.x; ++bx) {
                blockIdx = dim3{bx, by, bz};
                for (unsigned int tz = 0; tz < block.z; ++tz)
                    for (unsigned int ty = 0; ty < block.y; ++ty)
                        for (unsigned int tx = 0; tx < block.x; ++tx) {
                            threadIdx = dim3{tx, ty, tz};
                            kernel(*static_cast<std::remove_cv_t<Params>*>(args[I])...);
                        }
            }
}

// CuPy compiles every kernel with -ftz=true, so on the device float32
// subnormal inputs and results of arithmetic are zero. For the length of a
// launch the emulator sets the host's own flush-to-zero controls to match:
// FTZ and DAZ in MXCSR (x86 SSE arithmetic), FZ in FPCR (AArch64).
#if defined(__x86_64__)
#include <xmmintrin.h>
struct KpFlushSubnormals {
    unsigned int saved = _mm_getcsr();
    KpFlushSubnormals() { _mm_setcsr(saved | 0x8040u); }  // FTZ (bit 15) and DAZ (bit 6)
    ~KpFlushSubnormals() { _mm_setcsr(saved); }
};
#elif defined(__aarch64__)
struct KpFlushSubnormals {
    unsigned long saved;
    KpFlushSubnormals() {
        asm volatile("mrs %0, fpcr" : "=r"(saved));
        asm volatile("msr fpcr, %0" : : "r"(saved | (1ul << 24)));  // FZ
    }
    ~KpFlushSubnormals() { asm volatile("msr fpcr, %0" : : "r"(saved)); }
};
#else
#error "kpool emulator: no flush-to-zero control known for this CPU; the emulator would not predict the GPU"
#endif

// Runs the launch and returns how many 16-byte accesses it made.
template <typename... Params>
unsigned long long kp_emulate_launch(void (*kernel)(Params...), dim3 grid, dim3 block, void** args) {
    const KpFlushSubnormals flush;
    kp_vector_accesses = 0;
    kp_emulate_grid(kernel, grid, block, args, std::index_sequence_for<Params...>{});
    return kp_vector_accesses;
}

// The byte size of each kernel parameter, so the launcher can refuse an
// argument of the wrong width: the emulator would read it anyway, a GPU
// launch would shift every argument after it.
template <typename... Params>
int kp_param_sizes(void (*)(Params...), unsigned long long* sizes, int capacity) {
    const unsigned long long all[] = {sizeof(Params)...};
    const int count = static_cast<int>(sizeof...(Params));
    for (int i = 0; i < count && i < capacity; ++i) sizes[i] = all[i];
    return count;
}

#endif  // __CUDACC__

#endif  // KPOOL_PORTABILITY_H
