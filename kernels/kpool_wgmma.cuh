// Hopper's warpgroup MMA (wgmma, sm_90a) with e4m3 operands, for a kernel
// that includes this header after kpool_portability.h.
//
//   D [64 x N] = A [64 x 32] B [N x 32]^T  (+ D when scale_d),  N in {8, 16, 32, 64, 128}
//
// The 128 threads of a warpgroup (threads 128 g .. 128 g + 127 of the block)
// issue it together. A and B are e4m3 bytes in shared memory, both K-major,
// each named by a 64-bit matrix descriptor (kp_wgmma_desc); D is float32 in
// the threads' registers, a KpWgmmaAccum<N> each: thread t of warp w of the
// warpgroup holds, as element 4 j + 2 h + c, D[16 w + t / 4 + 8 h][8 j + 2 (t % 4) + c].
// The instruction is asynchronous: kp_wgmma_fence() before the first one (and
// after the threads touch an accumulator), kp_wgmma_commit() to close a group,
// kp_wgmma_wait<G>() (at most G groups still pending) before an accumulator
// is read or an operand's shared memory written. Shared memory the threads
// wrote with ordinary stores needs kp_fence_proxy_async() before a wgmma
// reads it.
//
// Only the NVRTC half is here: a host build takes the same names from the
// emulator (kernels/emulator/kpool_wgmma.h, which also spells the layouts
// and refuses the misuses above). Static, so nothing is emitted unless a
// kernel calls it; compile for sm_90a (compute_90a): plain sm_90 has no wgmma.
#ifndef KPOOL_WGMMA_CUH
#define KPOOL_WGMMA_CUH

#if defined(__CUDACC__)

// The descriptor's swizzle field (bits 62-63).
enum KpSwizzle : unsigned int { kp_swizzle_none = 0, kp_swizzle_128b = 1, kp_swizzle_64b = 2, kp_swizzle_32b = 3 };

template <int N>
struct KpWgmmaAccum {
    static_assert(N == 8 || N == 16 || N == 32 || N == 64 || N == 128, "KpWgmmaAccum: N is 8, 16, 32, 64 or 128");
    float v[N / 2];
    __device__ __forceinline__ float& operator[](int i) { return v[i]; }
};

// PTX's matrix descriptor ("Matrix Descriptor Format"): bits 0-13 the start
// address, 16-29 the leading-dimension byte offset, 32-45 the
// stride-dimension byte offset, each encoded as (x & 0x3ffff) >> 4; bits
// 49-51 the base offset, 0 here (the swizzle pattern starts on its own
// boundary: 1024 bytes for 128B); bits 62-63 the swizzle.
static __device__ __forceinline__ unsigned long long kp_wgmma_desc(const void* smem, unsigned int leading_bytes,
                                                                   unsigned int stride_bytes, KpSwizzle swizzle) {
    const unsigned int address = static_cast<unsigned int>(__cvta_generic_to_shared(smem));
    return ((address & 0x3ffffu) >> 4) | static_cast<unsigned long long>((leading_bytes & 0x3ffffu) >> 4) << 16 |
           static_cast<unsigned long long>((stride_bytes & 0x3ffffu) >> 4) << 32 |
           static_cast<unsigned long long>(swizzle) << 62;
}

static __device__ __forceinline__ void kp_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void kp_wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int PENDING>
static __device__ __forceinline__ void kp_wgmma_wait() {
    static_assert(PENDING >= 0 && PENDING <= 7, "kp_wgmma_wait: wgmma.wait_group takes 0 to 7");
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(PENDING) : "memory");
}
static __device__ __forceinline__ void kp_fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// One asm per N: D's N / 2 registers are operands %0 on, then the two
// descriptors and scale_d (a predicate; A and B are not negated).
#define KP_WGMMA_D4 "%0, %1, %2, %3"
#define KP_WGMMA_D8 KP_WGMMA_D4 ", %4, %5, %6, %7"
#define KP_WGMMA_D16 KP_WGMMA_D8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define KP_WGMMA_D32 KP_WGMMA_D16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define KP_WGMMA_D64                                                                                             \
    KP_WGMMA_D32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, " \
                 "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define KP_WGMMA_F4(i) "+f"(d.v[i]), "+f"(d.v[i + 1]), "+f"(d.v[i + 2]), "+f"(d.v[i + 3])
#define KP_WGMMA_F8(i) KP_WGMMA_F4(i), KP_WGMMA_F4(i + 4)
#define KP_WGMMA_F16(i) KP_WGMMA_F8(i), KP_WGMMA_F8(i + 8)
#define KP_WGMMA_F32(i) KP_WGMMA_F16(i), KP_WGMMA_F16(i + 16)
#define KP_WGMMA_F64(i) KP_WGMMA_F32(i), KP_WGMMA_F32(i + 32)
#define KP_WGMMA_E4M3(n, regs, a, b, s)                                                                    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #s ", 0;\nwgmma.mma_async.sync.aligned.m64n" #n      \
                 "k32.f32.e4m3.e4m3 {" KP_WGMMA_D##regs "}, %" #a ", %" #b ", p, 1, 1;\n}"              \
                 : KP_WGMMA_F##regs(0)                                                                  \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d)                                               \
                 : "memory")

template <int N>
static __device__ __forceinline__ void kp_wgmma_e4m3(KpWgmmaAccum<N>& d, unsigned long long desc_a,
                                                     unsigned long long desc_b, int scale_d) {
    if constexpr (N == 8) KP_WGMMA_E4M3(8, 4, 4, 5, 6);
    else if constexpr (N == 16) KP_WGMMA_E4M3(16, 8, 8, 9, 10);
    else if constexpr (N == 32) KP_WGMMA_E4M3(32, 16, 16, 17, 18);
    else if constexpr (N == 64) KP_WGMMA_E4M3(64, 32, 32, 33, 34);
    else KP_WGMMA_E4M3(128, 64, 64, 65, 66);
}

#else  // host compiler: the emulator defines all of the above

#ifndef KPOOL_WGMMA_H
#error "kpool: a host build must include kernels/emulator/kpool_emulator.h (with kpool_wgmma.h) before the kernel"
#endif

#endif  // __CUDACC__

#endif  // KPOOL_WGMMA_CUH
