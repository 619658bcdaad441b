// The host's stand-ins for the CUDA built-ins a kernel names: the
// qualifiers, dim3, uint4, float2, the index variables, the bit casts, the
// softmax's exp2 and reciprocal, relu, and the 16-byte loads and stores, each
// with the meaning it has on the GPU. Host builds only; kpool_emulator.h
// includes it.
#ifndef KPOOL_BUILTINS_H
#define KPOOL_BUILTINS_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define KP_DEVICE_CODE 0
#define __global__
#define __device__
#define __host__
// Plain inline: GCC's own choice compiles a selection kernel in half the time
// always_inline took (1.7 s against 3.6 s), for about a tenth more run time.
// Where a call is inlined does not change a value (-ffp-contract=off).
#define __forceinline__ inline
#define __launch_bounds__(...)
// __restrict__ is spelled the same by g++ and clang++.

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};

// One emulated thread runs at a time per host thread, so these are the
// indices of "the current CUDA thread" exactly as a kernel reads them.
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

// The bit counts CUDA names as intrinsics (POPC, FLO on a GPU; __clz of 0 is 32).
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned int>(x)); }

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
inline float kp_div_rn(float a, float b) { return a / b; }
inline float kp_rcp(float x) { return kp_nudge_ulps(1.0f / x, kp_float_to_bits(x), KP_APPROX_WORST_ULPS / 2); }
// Ties to even, as __float2int_rn: the emulator never changes the rounding mode.
inline int kp_round_to_int(float x) { return static_cast<int>(std::nearbyint(x)); }
// max.ftz.NaN.f32 x, +0: x where it is a NaN (the GPU gives its canonical NaN, the host keeps x's payload:
// NaNs are compared by place), x where it is above zero (a subnormal reads as zero: the launch's
// denormals-are-zero), +0 otherwise (-0 included, as IEEE 754's maximum orders them).
inline float kp_relu_nan(float x) { return x > 0.0f || x != x ? x : 0.0f; }

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
// Where the program says on the host too: the emulator runs it in order.
inline uint4 kp_load16_now(const void* address) { return kp_load16(address); }
inline void kp_store16(void* address, uint4 value) {
    kp_require_aligned16(address);
    ++kp_vector_accesses;
    std::memcpy(address, &value, sizeof value);
}
// Blocks run one after another on the emulator: what an earlier block wrote
// is there.
inline unsigned int kp_load_cg(const unsigned int* address) { return *address; }
inline int kp_load_cg(const int* address) { return *address; }
// An 8-byte store: aligned like the GPU's, or the emulator stops. Not
// counted with the 16-byte accesses.
inline void kp_store8(void* address, unsigned int low, unsigned int high) {
    if (reinterpret_cast<std::uintptr_t>(address) % 8 != 0) {
        std::fprintf(stderr, "kpool emulator: misaligned 8-byte store at %p\n", address);
        std::abort();
    }
    const unsigned int words[2] = {low, high};
    std::memcpy(address, words, sizeof words);
}

#endif  // KPOOL_BUILTINS_H
