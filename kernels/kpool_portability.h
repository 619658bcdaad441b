// What the kernels need from the compiler beyond C++, named once, so the
// same kernel text compiles with NVRTC for the GPU and with a host C++
// compiler for the CPU emulator.
//
// Under NVRTC (__CUDACC__) this header names the bit casts, the 16-byte and
// 8-byte accesses, the softmax's approximate exp2 and reciprocal, a relu
// that keeps NaN, the
// correctly rounded divisions and the block's dynamic shared memory;
// everything else is NVRTC's own. A host build gets the same names, and the
// CUDA built-ins, from the emulator's headers in kernels/emulator/
// (kpool_emulator.h: the launch; kpool_builtins.h: the built-ins;
// kpool_fibers.h: threads that cooperate, and shared memory), which
// kpool_cupy/emulator/toolchain.py puts before the kernel text. NVRTC's
// text holds none of them.
#ifndef KPOOL_PORTABILITY_H
#define KPOOL_PORTABILITY_H

#if defined(__CUDACC__)

#define KP_DEVICE_CODE 1

__device__ __forceinline__ float kp_bits_to_float(unsigned int bits) { return __uint_as_float(bits); }
__device__ __forceinline__ unsigned int kp_float_to_bits(float value) { return __float_as_uint(value); }
__device__ __forceinline__ uint4 kp_load16(const void* address) {
    return *reinterpret_cast<const uint4*>(address);
}
// A 16-byte load issued where the program says, even when its value is used
// only under a later branch: ptxas sinks an ordinary load (ld.global.nc too)
// into that branch, where it waits for the branch's condition (the decode
// step's tokens behind their positions). A volatile load stays; it skips L1
// (LDG.E.128.STRONG.SYS), which a row read once never reuses.
__device__ __forceinline__ uint4 kp_load16_now(const void* address) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(address));
    return v;
}
// One 16-byte store (STG.E.128). Through a uint4 lvalue NVVM splits a copy
// whose value came from another 16-byte access into four 4-byte stores.
__device__ __forceinline__ void kp_store16(void* address, uint4 value) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(address), "r"(value.x), "r"(value.y),
                 "r"(value.z), "r"(value.w)
                 : "memory");
}
// A load that bypasses L1 (ld.global.cg): data another block wrote during
// this launch, seen after a __threadfence and an atomic said it is there.
__device__ __forceinline__ unsigned int kp_load_cg(const unsigned int* address) { return __ldcg(address); }
__device__ __forceinline__ int kp_load_cg(const int* address) { return __ldcg(address); }
// Two 32-bit words as one 8-byte store (8 e4m3fn bytes of a row).
__device__ __forceinline__ void kp_store8(void* address, unsigned int low, unsigned int high) {
    uint2 words;
    words.x = low;
    words.y = high;
    *reinterpret_cast<uint2*>(address) = words;
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
// a / b correctly rounded (IEEE division, whatever --prec-div says): the FP8
// epilogue's y / s.
__device__ __forceinline__ float kp_div_rn(float a, float b) { return __fdiv_rn(a, b); }
// x rounded to the nearest int, ties to even (one F2I on the GPU).
__device__ __forceinline__ int kp_round_to_int(float x) { return __float2int_rn(x); }
// relu that keeps a NaN, in one instruction (FMNMX.FTZ.NAN, sm_80 and newer): max.NaN gives a NaN where x is
// one (the canonical NaN) and max(x, +0) elsewhere, a subnormal x flushed first like the rest of the build.
// Which zero it gives for -0 the PTX ISA leaves open; the emulator gives +0 (IEEE 754's maximum), and
// tests/test_relu_nan.py holds a GPU to it.
__device__ __forceinline__ float kp_relu_nan(float x) {
    float y;
    asm("max.ftz.NaN.f32 %0, %1, 0f00000000;" : "=f"(y) : "f"(x));
    return y;
}
// The warp-level matrix instructions (every lane of the warp, converged):
// D = A B + C on 16 x 8 tiles, float32 accumulators, fragments as the PTX
// ISA lays them out (kernels/emulator/kpool_mma.h spells the layouts and
// runs them on the host). e4m3 inputs need sm_89 or newer, f16 sm_80.
// Static, so NVRTC emits neither unless a kernel calls it.
// The one mma.sync shape both take: D (4 floats), A (4 words), B (2 words), C (4 floats).
#define KP_MMA_M16N8(shape_and_types)                                                                           \
    asm volatile("mma.sync.aligned." shape_and_types " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "          \
                 "{%10, %11, %12, %13};"                                                                       \
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                              \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),     \
                   "f"(c[2]), "f"(c[3]))
static __device__ __forceinline__ void kp_mma_e4m3_m16n8k32(float (&d)[4], const unsigned int (&a)[4],
                                                            const unsigned int (&b)[2], const float (&c)[4]) {
    KP_MMA_M16N8("m16n8k32.row.col.f32.e4m3.e4m3.f32");
}
static __device__ __forceinline__ void kp_mma_f16_m16n8k16(float (&d)[4], const unsigned int (&a)[4],
                                                           const unsigned int (&b)[2], const float (&c)[4]) {
    KP_MMA_M16N8("m16n8k16.row.col.f32.f16.f16.f32");
}
// Only the emulator needs telling that a kernel's threads cooperate.
#define KP_THREADS_COOPERATE(when) \
    do {                           \
    } while (0)
// KP_DYNAMIC_SHARED(name); declares the block's dynamic shared memory (the
// launch's shared_mem bytes) as unsigned char name[], 1024-byte aligned:
// wgmma's 128-byte swizzle reads address bits 7-9, so a tile there starts on
// a 1024-byte boundary. Every declaration names the same bytes. Above 48 KB
// the launch needs the function's opt-in (backends/cupy_launch.py).
#define KP_DYNAMIC_SHARED(name) extern __shared__ __align__(1024) unsigned char name[]

#else  // host compiler: the emulator defines all of the above

#ifndef KPOOL_EMULATOR_H
// kpool_cupy/emulator/toolchain.py puts the emulator first in every host build.
#error "kpool: a host build must include kernels/emulator/kpool_emulator.h before the kernel"
#endif

#endif  // __CUDACC__

#endif  // KPOOL_PORTABILITY_H
