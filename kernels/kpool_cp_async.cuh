// Ampere's asynchronous copies from global to shared memory (cp.async,
// sm_80 and newer), for a kernel that includes this header after
// kpool_portability.h.
//
//   kp_cp_async16(dst, src, read):  shared dst[0..16) <- read ? global src[0..16) : 16 zero bytes
//   kp_cp_async4(dst, src, read):   the same for 4 bytes
//
// Each thread issues its own copies; kp_cp_async_commit() closes the
// thread's copies issued since its last commit into a group, and
// kp_cp_async_wait<N>() waits until at most the N newest of the thread's
// groups are pending: every older group has landed. Copies not yet
// committed are not waited for. A missing row is a copy with read false: it
// reads nothing at src (which must still be an aligned address inside an
// array) and lands zeros.
//
// Not a shared-memory store the other threads see: a copy's bytes are
// visible to the issuing thread after the wait that completes its group,
// to the block's other threads only after that wait and then a barrier
// (__syncthreads), and to wgmma (the async proxy) only after
// kp_fence_proxy_async() as well (kpool_wgmma.cuh): cp.async writes in the
// generic proxy. Reading a destination, or writing a source, before the
// wait that completes the copy is undefined.
//
// PTX ISA 9.0, "Data Movement and Conversion Instructions: cp.async",
// "cp.async.commit_group" and "cp.async.wait_group / cp.async.wait_all":
//   cp.async.cg.shared{::cta}.global [dst], [src], 16{, src-size};  (.cg: 16 bytes only, cached in L2 alone)
//   cp.async.ca.shared{::cta}.global [dst], [src], cp-size{, src-size};  (cp-size 4, 8 or 16)
// "src-size represents the size of the data in bytes to be copied from src
// to dst ... remaining bytes in destination dst are filled with zeros", so
// src-size 0 reads nothing and fills all of them. The ISA says src-size
// "must be less than cp-size" and that one larger is undefined; cp-size
// itself is the whole copy (CUTLASS's SM80_CP_ASYNC_CACHEGLOBAL_ZFILL passes
// 16 or 0 the same way, and ptxas turns it into LDGSTS's zero-fill
// predicate). "wait till only N or fewer of the most
// recent cp.async-groups are pending and all the prior cp.async-groups
// committed by the executing threads are complete"; "Writes performed by
// cp.async operations are made visible to the executing thread only after
// ... the completion of cp.async.wait_group on the cp.async-group in which
// the cp.async belongs"; "cp.async is treated as a weak memory operation
// performed in the generic proxy"; dst and src aligned to cp-size
// ("Addresses as Operands").
//
// Only the NVRTC half is here: a host build takes the same names from the
// emulator (kernels/emulator/kpool_cp_async.h, which defers each copy to
// its wait and refuses the misuses above). Static, so nothing is emitted
// unless a kernel calls it; compile for sm_80 or newer.
#ifndef KPOOL_CP_ASYNC_CUH
#define KPOOL_CP_ASYNC_CUH

#if defined(__CUDACC__)

// src is a generic address of global memory, which PTX's global window
// takes as it is (identity on every CUDA target).
static __device__ __forceinline__ void kp_cp_async16(void* shared_dst, const void* global_src, bool read) {
    const unsigned int dst = static_cast<unsigned int>(__cvta_generic_to_shared(shared_dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(global_src), "r"(read ? 16 : 0)
                 : "memory");
}
static __device__ __forceinline__ void kp_cp_async4(void* shared_dst, const void* global_src, bool read) {
    const unsigned int dst = static_cast<unsigned int>(__cvta_generic_to_shared(shared_dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(global_src), "r"(read ? 4 : 0)
                 : "memory");
}
static __device__ __forceinline__ void kp_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void kp_cp_async_wait() {
    static_assert(N >= 0 && N <= 7, "kp_cp_async_wait: at most 7 groups left pending");
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

#else  // host compiler: the emulator defines all of the above

#ifndef KPOOL_CP_ASYNC_H
#error "kpool: a host build must include kernels/emulator/kpool_emulator.h (with kpool_cp_async.h) before the kernel"
#endif

#endif  // __CUDACC__

#endif  // KPOOL_CP_ASYNC_CUH
