// The CPU emulator: what a host C++ compiler needs to build a kernel of
// kernels/ and run it on the CPU. kpool_cupy/emulator/toolchain.py puts this
// header before every host build's text (a kernel family, a test's kernel,
// the benchmark's baseline); kpool_portability.h refuses a host build
// without it, and NVRTC never sees it.
//
// kpool_builtins.h defines the CUDA built-ins with the same meaning,
// kpool_fibers.h the threads that cooperate and the block's dynamic shared
// memory, kpool_mma.h and kpool_wgmma.h the warp's and the warpgroup's
// matrix instructions, kpool_cp_async.h the asynchronous copies into shared
// memory, and this header the launch:
// kp_emulate_launch runs a grid one thread after another, which is faithful
// for a kernel whose threads never wait for each other. A kernel whose
// threads cooperate (warp shuffles, __syncwarp, __syncthreads, static
// __shared__ arrays) opens with KP_THREADS_COOPERATE(true), and the launch
// then runs each block's threads as fibers that meet at every shuffle and
// barrier (kpool_fibers.h).
#ifndef KPOOL_EMULATOR_H
#define KPOOL_EMULATOR_H

#include <cstddef>
#include <type_traits>
#include <utility>

#include "kpool_builtins.h"
#include "kpool_cp_async.h"
#include "kpool_fibers.h"
#include "kpool_mma.h"
#include "kpool_wgmma.h"

// Runs kernel over grid x block, thread by thread. args follows the CUDA
// driver's convention: args[i] points at the value of parameter i. The
// first thread tells whether the kernel cooperates; if it does, it has done
// nothing yet and the launch runs as fibers instead. Built with
// -DKP_FIBERS_ALWAYS every launch runs as fibers (for tests: the fibers
// must give a kernel that never cooperates the same bits).
template <typename... Params, std::size_t... I>
void kp_emulate_grid(void (*kernel)(Params...), dim3 grid, dim3 block, void** args,
                     std::index_sequence<I...>) {
    gridDim = grid;
    blockDim = block;
    kp_fibers_wanted = nullptr;
    kp_launch_cooperated = false;
    using Thread = KpThreadCall<std::index_sequence<I...>, Params...>;
#ifdef KP_FIBERS_ALWAYS
    kp_fibers_wanted = &kp_emulate_grid_fibers;
    kp_launch_cooperated = true;
    void* launch_args[] = {reinterpret_cast<void*>(kernel), args[I]...};
    kp_fibers_wanted(&Thread::run, launch_args, grid, block);
    return;
#endif
    bool first = true;
    for (unsigned int bz = 0; bz < grid.z; ++bz)
        for (unsigned int by = 0; by < grid.y; ++by)
            for (unsigned int bx = 0; bx < grid.x; ++bx) {
                blockIdx = dim3{kp_block_at(bx, grid.x), kp_block_at(by, grid.y), kp_block_at(bz, grid.z)};
                kp_dynamic_shared_block_start();
                for (unsigned int tz = 0; tz < block.z; ++tz)
                    for (unsigned int ty = 0; ty < block.y; ++ty)
                        for (unsigned int tx = 0; tx < block.x; ++tx) {
                            threadIdx = dim3{tx, ty, tz};
                            kernel(*static_cast<std::remove_cv_t<Params>*>(args[I])...);
                            if (first) {
                                first = false;
                                if (kp_fibers_wanted != nullptr) {
                                    kp_launch_cooperated = true;
                                    void* launch_args[] = {reinterpret_cast<void*>(kernel), args[I]...};
                                    kp_fibers_wanted(&Thread::run, launch_args, grid, block);
                                    return;
                                }
                            }
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

// Runs the launch, each block with shared_bytes of dynamic shared memory
// (KP_DYNAMIC_SHARED: kpool_fibers.h), and returns how many 16-byte accesses
// it made.
template <typename... Params>
unsigned long long kp_emulate_launch(void (*kernel)(Params...), dim3 grid, dim3 block, void** args,
                                     std::size_t shared_bytes = 0) {
    const KpFlushSubnormals flush;
    const KpDynamicSharedLaunch dynamic_shared(shared_bytes);
    kp_vector_accesses = 0;
    kp_barriers_passed = 0;
    kp_wgmmas_issued = 0;
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

#endif  // KPOOL_EMULATOR_H
