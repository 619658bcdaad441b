// Threads that cooperate, on the host: fibers, warp shuffles, __syncwarp,
// __syncthreads, static __shared__ arrays, the block's dynamic shared memory
// (KP_DYNAMIC_SHARED) and KP_THREADS_COOPERATE. Host builds only;
// kpool_emulator.h includes it.
//
// A kernel whose threads cooperate opens with KP_THREADS_COOPERATE(true);
// every other kernel runs kp_emulate_grid's plain loop (kpool_emulator.h),
// one thread after another.
// A cooperating launch runs each block's threads as fibers on one host
// thread: a fiber runs until it reaches a shuffle or a barrier, and when
// every fiber of the block waits, the scheduler releases whatever is
// complete. A shuffle completes when every lane its mask names has left the
// kernel or waits at the same shuffle (the same call, kind and mask), as
// CUDA waits for the non-exited lanes of a mask; then each lane reads the
// value its source lane deposited (a source that has left is undefined in
// CUDA, and refused). __any_sync and __ballot_sync are such shuffles that
// read every waiting lane's predicate (__all_sync is __any_sync of the
// negation). A warp-wide instruction (mma.sync: kpool_mma.h) is a
// shuffle that must find all 32 lanes at the same call, none of them gone;
// then the instruction is computed once from every lane's operands. A
// warpgroup-wide one (wgmma: kpool_wgmma.h) is the same over the 128
// threads of a warpgroup. A barrier completes when every thread of
// the block waits at the same __syncthreads. Anything else is a deadlock
// on the emulator and undefined on a GPU, and the emulator aborts naming
// the threads and where each waits.
//
// Why the marker and not detection: the first thread of a launch runs on
// the host's own stack and cannot be moved onto a fiber once it has
// started, so the kernel says so before it does anything: the marker's
// thread returns at once, and the launch restarts as fibers. The condition
// is a constant, so one template can cooperate in one instantiation only.
//
// __shared__ is static thread_local: one array per instantiation and host
// thread, which every fiber of the running block sees, and which the next
// block finds as this one left it (a GPU's is undefined there too).
// AddressSanitizer gives thread-local arrays no redzones.
//
// KP_DYNAMIC_SHARED(name) (kpool_portability.h spells it for NVRTC) gives
// name as an unsigned char* to the launch's dynamic shared memory: one heap
// buffer of exactly the launch's bytes (kp_emulate_launch's shared_bytes),
// 1024-byte aligned, the same for every thread of the block, wherever it is
// declared. Each block finds it filled with kp_dynamic_shared_poison, not
// as the block before left it: a GPU leaves it undefined, and poison makes
// a read before a write show. AddressSanitizer sees a read or write past
// its end. A launch of 0 bytes points it at a page nobody may touch, so a
// thread that touches it faults in any build (an illegal address on a GPU);
// declaring it there and not touching it is fine, as on a GPU.
#ifndef KPOOL_FIBERS_H
#define KPOOL_FIBERS_H

#include <sys/mman.h>
#include <unistd.h>

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kpool_builtins.h"

#define __shared__ static thread_local
#define KP_DYNAMIC_SHARED(name) unsigned char* const name = kp_dynamic_shared()
#define KP_THREADS_COOPERATE(when)                                       \
    do {                                                                 \
        if constexpr (static_cast<bool>(when)) {                         \
            if (kp_fiber_current == nullptr) {                           \
                kp_fibers_wanted = &kp_emulate_grid_fibers;              \
                return;                                                  \
            }                                                            \
        }                                                                \
    } while (0)

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KP_ASAN 1
#endif
#endif
#if !defined(KP_ASAN) && defined(__SANITIZE_ADDRESS__)
#define KP_ASAN 1
#endif
#ifndef KP_ASAN
#define KP_ASAN 0
#endif
#if KP_ASAN
extern "C" {
void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, std::size_t size);
void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old, std::size_t* size_old);
void __asan_unpoison_memory_region(void const volatile* addr, std::size_t size);
}
#endif

// x86-64 switches stacks with the eight instructions below (no system
// call); elsewhere, or built with -DKP_FIBERS_UCONTEXT, swapcontext does
// it (one sigprocmask system call per switch).
#if defined(__x86_64__) && !defined(KP_FIBERS_UCONTEXT)
#define KP_FIBERS_ASM 1
// Saves the callee-saved registers on the running stack and its stack
// pointer in *save, then resumes the stack at load. MXCSR and the x87
// control word are not switched: every fiber of a launch runs under the
// launch's flush-to-zero settings.
extern "C" __attribute__((visibility("hidden"))) void kp_fiber_switch(void** save, void* load);
__asm__(
    ".pushsection .text\n"
    ".weak kp_fiber_switch\n"
    ".hidden kp_fiber_switch\n"
    ".type kp_fiber_switch,@function\n"
    "kp_fiber_switch:\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size kp_fiber_switch,.-kp_fiber_switch\n"
    ".popsection\n");
struct KpContext {
    void* sp = nullptr;
};
#else
#define KP_FIBERS_ASM 0
#include <ucontext.h>
struct KpContext {
    ucontext_t uc;
};
#endif

enum class KpWait : unsigned char { running, shuffle, barrier, exited };
// PTX's shfl.sync modes, plus __syncwarp (a shuffle that moves nothing),
// __any_sync and __ballot_sync (vote.sync), a warp-wide instruction (kp_warp_collective)
// and a warpgroup-wide one (kp_warpgroup_collective).
enum class KpShuffleMode : unsigned char { idx, up, down, bfly, sync, any, ballot, collective, warpgroup };

// A warp-wide instruction, computed once its 32 lanes have arrived: lanes[i]
// is what lane i passed (its operands and where its results go). A
// warpgroup-wide one gets its 128 threads' pointers the same way.
using KpWarpCompute = void (*)(void* const* lanes);

// The threads of a warpgroup (wgmma's unit): 128 consecutive threads of the
// block, starting at a multiple of 128.
constexpr unsigned int kp_warpgroup_threads = 128;

struct KpFiber {
    KpContext context;
    char* stack = nullptr;  // lowest usable byte; a guard page lies below
    void* fake_stack = nullptr;  // AddressSanitizer's, while switched out
    dim3 thread;
    unsigned int rank = 0;  // x + y * blockDim.x + z * blockDim.x * blockDim.y; lane = rank % 32
    KpWait wait = KpWait::running;
    KpShuffleMode mode = KpShuffleMode::sync;
    unsigned int mask = 0;
    int operand = 0;  // srcLane, delta or laneMask
    int width = 32;
    unsigned long long value = 0, result = 0;
    KpWarpCompute compute = nullptr;  // a collective's instruction
    const char* what = "";  // the built-in it waits in, and where it was called
    const char* file = "";
    int line = 0;
};

// Each fiber's stack: 128 KiB above a guard page. A kernel keeps up to
// ~2 KB of locals, a few times that under AddressSanitizer's redzones; a
// failure message (vfprintf) or an AddressSanitizer report with its
// unwinder runs on the fiber's stack too and takes tens of KB. Pages are
// committed when first touched, so a 1024-thread block reserves 132 MiB of
// address space but uses a few pages a fiber.
constexpr std::size_t kp_fiber_stack_bytes = std::size_t{128} << 10;

// The most threads a CUDA block has.
constexpr unsigned int kp_max_block_threads = 1024;

// This host thread's fibers, kept from launch to launch, and their stacks,
// mapped for a launch.
struct KpFiberPool {
    KpFiber* fibers = nullptr;
    char* maps[kp_max_block_threads] = {};  // each a guard page, then the stack
    std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    char* stack(unsigned int i) {
        if (maps[i] == nullptr) {
            void* map = mmap(nullptr, page + kp_fiber_stack_bytes, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (map == MAP_FAILED || mprotect(map, page, PROT_NONE) != 0) {
                std::fprintf(stderr, "kpool emulator: cannot map a fiber stack\n");
                std::abort();
            }
            maps[i] = static_cast<char*>(map);
        }
        return maps[i] + page;
    }
    // Unmaps the stacks. Each is two mappings (guard and stack) and every
    // kernel library keeps a pool of its own, so stacks kept from launch to
    // launch would add up, over a process that runs many cooperating
    // variants, to the kernel's limit on mappings (vm.max_map_count):
    // the launch returns them instead.
    void release() {
        for (char*& map : maps) {
            if (map == nullptr) continue;
#if KP_ASAN
            __asan_unpoison_memory_region(map + page, kp_fiber_stack_bytes);
#endif
            munmap(map, page + kp_fiber_stack_bytes);
            map = nullptr;
        }
    }
    ~KpFiberPool() {
        delete[] fibers;
        release();
    }
};

// Internal linkage: GCC makes one process-wide copy of a thread_local that
// is an inline variable or a static local of an inline function (a
// STB_GNU_UNIQUE symbol, even across libraries loaded RTLD_LOCAL), and two
// kernel libraries built with other flags or another header lay out
// KpFiber differently. Each library keeps its own fibers and stacks.
static thread_local KpFiberPool kp_fiber_pool;

struct KpBlockRun {
    KpFiber* fibers = nullptr;
    unsigned int count = 0;
    KpFiber* current = nullptr;
    KpContext main;
    void* main_fake_stack = nullptr;
    const void* main_bottom = nullptr;  // the host thread's stack, as AddressSanitizer knows it
    std::size_t main_size = 0;
    void (*run_thread)(void* const* args) = nullptr;  // one thread of the kernel, on the launch's arguments
    void* const* args = nullptr;
};

inline thread_local KpBlockRun* kp_block_run = nullptr;
inline thread_local KpFiber* kp_fiber_current = nullptr;  // null outside fibers
// Set by KP_THREADS_COOPERATE. Only a kernel with the marker names the
// fiber runner, so no other kernel's build compiles it.
using KpThreadRunner = void (*)(void* const* args);
inline void kp_emulate_grid_fibers(KpThreadRunner run_thread, void* const* args, dim3 grid, dim3 block);
inline thread_local void (*kp_fibers_wanted)(KpThreadRunner, void* const*, dim3, dim3) = nullptr;
inline thread_local bool kp_launch_cooperated = false;    // how the last launch on this host thread ran
// The block-wide barriers (__syncthreads) the last launch's blocks passed, summed over its blocks: a count of
// work a test can compare between inputs (kpool_cupy.emulator.launch's EmulatedLaunch.barriers).
inline thread_local unsigned long long kp_barriers_passed = 0;
// The wgmma.mma_async the last launch's warpgroups issued, one a warpgroup's instruction, summed over its blocks
// (kpool_wgmma.h counts them; EmulatedLaunch.wgmmas).
inline thread_local unsigned long long kp_wgmmas_issued = 0;
// Counts the blocks this host thread has started as fibers, so state kept per
// block (kpool_wgmma.h's) can tell a new block from the one it belongs to.
inline thread_local unsigned long long kp_block_serial = 0;

[[noreturn]] inline void kp_fail(const char* format, ...) {
    std::va_list list;
    va_start(list, format);
    std::fputs("kpool emulator: ", stderr);
    std::vfprintf(stderr, format, list);
    std::fputc('\n', stderr);
    va_end(list);
    std::fflush(stderr);
    std::abort();
}

// Every byte of a block's dynamic shared memory at the block's start: NaN
// in float32, bf16, fp16 and e4m3fn, -1 as a signed integer and the largest
// value as an unsigned one.
constexpr unsigned char kp_dynamic_shared_poison = 0xff;
// The alignment KP_DYNAMIC_SHARED declares: wgmma's 128-byte swizzle XORs
// address bits 4-6 with bits 7-9, so its tiles start on 1024 bytes.
constexpr std::size_t kp_dynamic_shared_align = 1024;

// The running launch's dynamic shared memory. Internal linkage, like
// kp_fiber_pool: each kernel library its own.
struct KpDynamicShared {
    unsigned char* data = nullptr;  // exactly `bytes` bytes; null when the launch has none
    std::size_t bytes = 0;
};
static thread_local KpDynamicShared kp_dynamic_shared_memory;

// Where KP_DYNAMIC_SHARED points in a launch of 0 bytes: a page without
// access (page-aligned, so 1024-aligned too), mapped once per library the
// first time such a launch declares it, and kept.
static inline unsigned char* kp_no_dynamic_shared() {
    static unsigned char* const page = [] {
        const std::size_t size = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
        void* map = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (map == MAP_FAILED) kp_fail("cannot map the page that stands for no dynamic shared memory");
        return static_cast<unsigned char*>(map);
    }();
    return page;
}

static inline unsigned char* kp_dynamic_shared() {
    return kp_dynamic_shared_memory.bytes > 0 ? kp_dynamic_shared_memory.data : kp_no_dynamic_shared();
}

// A launch's dynamic shared memory, allocated for the length of the launch.
struct KpDynamicSharedLaunch {
    explicit KpDynamicSharedLaunch(std::size_t bytes) {
        void* data = nullptr;
        if (bytes > 0 && posix_memalign(&data, kp_dynamic_shared_align, bytes) != 0)
            kp_fail("cannot allocate %zu bytes of dynamic shared memory", bytes);
        kp_dynamic_shared_memory.data = static_cast<unsigned char*>(data);
        kp_dynamic_shared_memory.bytes = bytes;
    }
    ~KpDynamicSharedLaunch() {
        std::free(kp_dynamic_shared_memory.data);
        kp_dynamic_shared_memory = KpDynamicShared{};
    }
    KpDynamicSharedLaunch(const KpDynamicSharedLaunch&) = delete;
    KpDynamicSharedLaunch& operator=(const KpDynamicSharedLaunch&) = delete;
};

// A block starts: its dynamic shared memory holds poison, whatever the
// block before wrote.
static inline void kp_dynamic_shared_block_start() {
    if (kp_dynamic_shared_memory.bytes > 0)
        std::memset(kp_dynamic_shared_memory.data, kp_dynamic_shared_poison, kp_dynamic_shared_memory.bytes);
}

inline void kp_switch(KpContext& from, KpContext& to) {
#if KP_FIBERS_ASM
    kp_fiber_switch(&from.sp, to.sp);
#else
    swapcontext(&from.uc, &to.uc);
#endif
}

// From the scheduler into fiber f, until f waits or exits.
inline void kp_enter(KpBlockRun& run, KpFiber& f) {
    run.current = &f;
    kp_fiber_current = &f;
    threadIdx = f.thread;
#if KP_ASAN
    __sanitizer_start_switch_fiber(&run.main_fake_stack, f.stack, kp_fiber_stack_bytes);
#endif
    kp_switch(run.main, f.context);
#if KP_ASAN
    __sanitizer_finish_switch_fiber(run.main_fake_stack, nullptr, nullptr);
#endif
    kp_fiber_current = nullptr;
}

// From fiber f back to the scheduler; returns when the scheduler resumes f.
inline void kp_leave(KpFiber& f, bool exiting) {
    KpBlockRun& run = *kp_block_run;
#if KP_ASAN
    __sanitizer_start_switch_fiber(exiting ? nullptr : &f.fake_stack, run.main_bottom, run.main_size);
#else
    (void)exiting;
#endif
    kp_switch(f.context, run.main);
#if KP_ASAN
    __sanitizer_finish_switch_fiber(f.fake_stack, &run.main_bottom, &run.main_size);
#endif
}

// Run as each fiber leaves the kernel, when set: what a thread must not take
// out of it (kpool_cp_async.h sets it at a cp.async: copies not completed).
// Internal linkage, like kp_fiber_pool, and one per host thread.
static thread_local void (*kp_fiber_exit_check)(const KpFiber& f) = nullptr;

[[noreturn]] inline void kp_fiber_main() {
    KpBlockRun& run = *kp_block_run;
    KpFiber& f = *run.current;
#if KP_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &run.main_bottom, &run.main_size);
#endif
    run.run_thread(run.args);
    if (kp_fiber_exit_check != nullptr) kp_fiber_exit_check(f);
    f.wait = KpWait::exited;
    kp_leave(f, true);
    kp_fail("an exited fiber was resumed");
}

// A fresh context that starts kp_fiber_main on f's stack.
inline void kp_start_fiber(KpFiber& f) {
#if KP_ASAN
    // Frames that never returned (the last switch out of a fiber) leave
    // redzones poisoned; the next fiber on this stack must not trip on them.
    __asan_unpoison_memory_region(f.stack, kp_fiber_stack_bytes);
#endif
#if KP_FIBERS_ASM
    // kp_fiber_switch pops six registers and returns: the return address is
    // kp_fiber_main, entered with the stack pointer 8 below a 16-byte
    // boundary as after a call, above it a null return address.
    void** top = reinterpret_cast<void**>(f.stack + kp_fiber_stack_bytes);
    top[-1] = nullptr;
    top[-2] = reinterpret_cast<void*>(&kp_fiber_main);
    for (int i = 3; i <= 8; ++i) top[-i] = nullptr;
    f.context.sp = top - 8;
#else
    getcontext(&f.context.uc);
    f.context.uc.uc_stack.ss_sp = f.stack;
    f.context.uc.uc_stack.ss_size = kp_fiber_stack_bytes;
    f.context.uc.uc_link = nullptr;
    makecontext(&f.context.uc, &kp_fiber_main, 0);
#endif
}

// The lane a shuffle reads, exactly as PTX's shfl.sync defines it for the
// operand c = ((32 - width) << 8) | clamp that CUDA's __shfl*_sync pass
// (clamp 0 for up, 31 otherwise): a source outside the lane's segment of
// `width` lanes (above it for down and xor, below it for up) reads the
// lane's own value; idx wraps srcLane into the segment.
inline unsigned int kp_shuffle_source(KpShuffleMode mode, unsigned int lane, int operand, int width) {
    const int segmask = (32 - width) & 31;
    const int b = operand & 31;
    const int self = static_cast<int>(lane);
    const int low = self & segmask;
    const int high = low | ((mode == KpShuffleMode::up ? 0 : 31) & ~segmask);
    int j = self;
    bool inside = false;
    switch (mode) {
        case KpShuffleMode::up: j = self - b; inside = j >= high; break;
        case KpShuffleMode::down: j = self + b; inside = j <= high; break;
        case KpShuffleMode::bfly: j = self ^ b; inside = j <= high; break;
        case KpShuffleMode::idx: j = low | (b & ~segmask); inside = j <= high; break;
        case KpShuffleMode::sync:
        case KpShuffleMode::any:
        case KpShuffleMode::ballot:
        case KpShuffleMode::collective:
        case KpShuffleMode::warpgroup: break;
    }
    return static_cast<unsigned int>(inside ? j : self);
}

// The fiber of the calling thread, for an instruction that waits for other
// threads (`what`, at file:line); refused in a kernel run one thread after
// another.
inline KpFiber* kp_cooperating_fiber(const char* what, const char* file, int line) {
    KpFiber* f = kp_fiber_current;
    if (f == nullptr)
        kp_fail("%s:%d: %s in a kernel that does not open with KP_THREADS_COOPERATE(true); the emulator runs such "
                "kernels one thread after another, where no thread can wait for another",
                file, line, what);
    return f;
}

// Deposits this lane's value, waits until every lane of `mask` has, and
// returns what the lane reads.
inline unsigned long long kp_shuffle(KpShuffleMode mode, const char* what, unsigned int mask,
                                     unsigned long long value, int operand, int width, const char* file,
                                     int line) {
    KpFiber* f = kp_cooperating_fiber(what, file, line);
    const unsigned int lane = f->rank % 32, warp_base = f->rank - lane;
    const unsigned int lanes = kp_block_run->count - warp_base < 32 ? kp_block_run->count - warp_base : 32;
    const unsigned int present = lanes == 32 ? ~0u : (1u << lanes) - 1;
    if (width < 1 || width > 32 || (width & (width - 1)) != 0)
        kp_fail("%s:%d: %s with width %d; CUDA defines only 1, 2, 4, 8, 16 and 32", file, line, what, width);
    if (!((mask >> lane) & 1u))
        kp_fail("%s:%d: %s: lane %u of warp %u calls it with mask 0x%08x, which leaves out its own lane", file,
                line, what, lane, warp_base / 32, mask);
    if (mask & ~present)
        kp_fail("%s:%d: %s with mask 0x%08x, but warp %u of this block has only lanes 0x%08x (block of %u threads)",
                file, line, what, mask, warp_base / 32, present, kp_block_run->count);
    f->wait = KpWait::shuffle;
    f->mode = mode;
    f->what = what;
    f->mask = mask;
    f->value = value;
    f->operand = operand;
    f->width = width;
    f->file = file;
    f->line = line;
    kp_leave(*f, false);
    return f->result;
}

template <typename T>
unsigned long long kp_shuffle_bits(T value) {
    static_assert(std::is_trivially_copyable_v<T> && (sizeof(T) == 4 || sizeof(T) == 8),
                  "the emulator shuffles 4- and 8-byte values");
    unsigned long long bits = 0;
    std::memcpy(&bits, &value, sizeof value);
    return bits;
}
template <typename T>
T kp_shuffle_value(unsigned long long bits) {
    T value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

template <typename T>
T __shfl_sync(unsigned int mask, T var, int srcLane, int width = 32, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
    return kp_shuffle_value<T>(kp_shuffle(KpShuffleMode::idx, "__shfl_sync", mask, kp_shuffle_bits(var), srcLane,
                                          width, file, line));
}
template <typename T>
T __shfl_up_sync(unsigned int mask, T var, unsigned int delta, int width = 32, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
    return kp_shuffle_value<T>(kp_shuffle(KpShuffleMode::up, "__shfl_up_sync", mask, kp_shuffle_bits(var),
                                          static_cast<int>(delta), width, file, line));
}
template <typename T>
T __shfl_down_sync(unsigned int mask, T var, unsigned int delta, int width = 32, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
    return kp_shuffle_value<T>(kp_shuffle(KpShuffleMode::down, "__shfl_down_sync", mask, kp_shuffle_bits(var),
                                          static_cast<int>(delta), width, file, line));
}
template <typename T>
T __shfl_xor_sync(unsigned int mask, T var, int laneMask, int width = 32, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
    return kp_shuffle_value<T>(kp_shuffle(KpShuffleMode::bfly, "__shfl_xor_sync", mask, kp_shuffle_bits(var),
                                          laneMask, width, file, line));
}
inline void __syncwarp(unsigned int mask = 0xffffffffu, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
    kp_shuffle(KpShuffleMode::sync, "__syncwarp", mask, 0, 0, 32, file, line);
}
inline int __any_sync(unsigned int mask, int predicate, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
    return static_cast<int>(kp_shuffle(KpShuffleMode::any, "__any_sync", mask, predicate != 0, 0, 32, file, line));
}
inline int __all_sync(unsigned int mask, int predicate, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
    return static_cast<int>(kp_shuffle(KpShuffleMode::any, "__all_sync", mask, predicate == 0, 0, 32, file, line)) == 0;
}
// The mask's waiting lanes whose predicate holds, as bits (vote.sync.ballot;
// a lane that has left the kernel contributes 0).
inline unsigned int __ballot_sync(unsigned int mask, int predicate, const char* file = __builtin_FILE(),
                                  int line = __builtin_LINE()) {
    return static_cast<unsigned int>(
        kp_shuffle(KpShuffleMode::ballot, "__ballot_sync", mask, predicate != 0, 0, 32, file, line));
}

// A warp-wide instruction (every lane of a full warp, as mma.sync.aligned
// requires): each lane passes `lane_data`; once all 32 wait here, `compute`
// runs once over the 32 pointers, and every lane goes on.
inline void kp_warp_collective(const char* what, KpWarpCompute compute, void* lane_data, const char* file, int line) {
    KpFiber* f = kp_fiber_current;
    if (f != nullptr) f->compute = compute;
    kp_shuffle(KpShuffleMode::collective, what, 0xffffffffu,
               static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(lane_data)), 0, 32, file, line);
}

// A warpgroup-wide instruction (wgmma's .sync.aligned: every thread of the
// warpgroup executes it): each thread passes `thread_data`; once all 128 of
// its warpgroup wait at the same call, `compute` runs once over their 128
// pointers (thread rank % 128 at index rank % 128), and every thread goes on.
inline void kp_warpgroup_collective(const char* what, KpWarpCompute compute, void* thread_data, const char* file,
                                    int line) {
    KpFiber* f = kp_cooperating_fiber(what, file, line);
    const unsigned int base = f->rank - f->rank % kp_warpgroup_threads;
    if (base + kp_warpgroup_threads > kp_block_run->count)
        kp_fail("%s:%d: %s needs the 128 threads of warpgroup %u (threads %u-%u), but the block has %u threads", file,
                line, what, base / kp_warpgroup_threads, base, base + kp_warpgroup_threads - 1, kp_block_run->count);
    f->wait = KpWait::shuffle;
    f->mode = KpShuffleMode::warpgroup;
    f->what = what;
    f->mask = 0xffffffffu;
    f->value = static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(thread_data));
    f->compute = compute;
    f->file = file;
    f->line = line;
    kp_leave(*f, false);
}

// Releases warpgroup f's collective if its 128 threads have all arrived;
// false if some have not (yet).
inline bool kp_release_warpgroup(KpBlockRun& run, const KpFiber& f) {
    KpFiber* group = run.fibers + (f.rank - f.rank % kp_warpgroup_threads);
    for (unsigned int t = 0; t < kp_warpgroup_threads; ++t) {
        const KpFiber& other = group[t];
        if (other.wait == KpWait::exited) continue;
        if (other.wait != KpWait::shuffle || other.mode != f.mode || other.line != f.line ||
            std::strcmp(other.file, f.file) != 0)
            return false;
    }
    void* threads[kp_warpgroup_threads];
    for (unsigned int t = 0; t < kp_warpgroup_threads; ++t) {
        if (group[t].wait != KpWait::shuffle)
            kp_fail("%s:%d: %s: thread %u of warpgroup %u has left the kernel; the instruction needs all 128 threads "
                    "(undefined in CUDA)",
                    f.file, f.line, f.what, group[t].rank, f.rank / kp_warpgroup_threads);
        threads[t] = reinterpret_cast<void*>(static_cast<std::uintptr_t>(group[t].value));
    }
    const KpWarpCompute compute = f.compute;
    compute(threads);
    for (unsigned int t = 0; t < kp_warpgroup_threads; ++t) group[t].wait = KpWait::running;
    return true;
}

// Integer atomics: a fiber runs until it waits at a shuffle or a barrier,
// so a read-modify-write between two of those is atomic. Which thread comes
// first follows the schedule (rank order, or reversed with
// -DKP_FIBERS_REVERSED): a kernel whose result depends on that order gives
// different results under the two, as it would on a GPU from run to run.
inline unsigned int atomicAdd(unsigned int* address, unsigned int value) {
    const unsigned int old = *address;
    *address = old + value;
    return old;
}
inline int atomicAdd(int* address, int value) {
    const int old = *address;
    *address = static_cast<int>(static_cast<unsigned int>(old) + static_cast<unsigned int>(value));
    return old;
}

inline unsigned int atomicAnd(unsigned int* address, unsigned int value) {
    const unsigned int old = *address;
    *address = old & value;
    return old;
}
inline unsigned int atomicOr(unsigned int* address, unsigned int value) {
    const unsigned int old = *address;
    *address = old | value;
    return old;
}

// atomicInc as CUDA defines it: old >= limit ? 0 : old + 1, the old value
// returned.
inline unsigned int atomicInc(unsigned int* address, unsigned int limit) {
    const unsigned int old = *address;
    *address = old >= limit ? 0u : old + 1u;
    return old;
}
// Blocks run one after another and a block's fibers on one host thread:
// every write is seen by every later read.
inline void __threadfence() {}

inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    KpFiber* f = kp_cooperating_fiber("__syncthreads", file, line);
    f->wait = KpWait::barrier;
    f->what = "__syncthreads";
    f->file = file;
    f->line = line;
    kp_leave(*f, false);
}

[[noreturn]] inline void kp_deadlock(const KpBlockRun& run, const char* headline);

// Releases every shuffle whose lanes have all arrived, or the barrier if the
// whole block waits at one __syncthreads; false if nothing could go on.
inline bool kp_release(KpBlockRun& run) {
    bool released = false;
    unsigned int at_barrier = 0;
    for (unsigned int i = 0; i < run.count; ++i) {
        KpFiber& f = run.fibers[i];
        if (f.wait == KpWait::barrier) ++at_barrier;
        if (f.wait != KpWait::shuffle) continue;
        if (f.mode == KpShuffleMode::warpgroup) {
            released = kp_release_warpgroup(run, f) || released;
            continue;
        }
        KpFiber* warp = run.fibers + (f.rank - f.rank % 32);
        bool complete = true;
        unsigned long long any = 0, ballot = 0;
        for (unsigned int lane = 0; lane < 32 && complete; ++lane) {
            if (!((f.mask >> lane) & 1u) || warp[lane].wait == KpWait::exited) continue;
            const KpFiber& other = warp[lane];
            complete = other.wait == KpWait::shuffle && other.mask == f.mask && other.mode == f.mode &&
                       other.line == f.line && std::strcmp(other.file, f.file) == 0;
            any |= other.value != 0;
            ballot |= static_cast<unsigned long long>(other.value != 0) << lane;
        }
        if (!complete) continue;
        if (f.mode == KpShuffleMode::collective) {
            void* lanes[32];
            for (unsigned int lane = 0; lane < 32; ++lane) {
                if (warp[lane].wait != KpWait::shuffle)
                    kp_fail("%s:%d: %s: lane %u of warp %u has left the kernel; the instruction needs all 32 lanes "
                            "(undefined in CUDA)",
                            f.file, f.line, f.what, lane, f.rank / 32);
                lanes[lane] = reinterpret_cast<void*>(static_cast<std::uintptr_t>(warp[lane].value));
            }
            f.compute(lanes);
        }
        for (unsigned int lane = 0; lane < 32; ++lane) {
            if (!((f.mask >> lane) & 1u) || warp[lane].wait == KpWait::exited || f.mode == KpShuffleMode::sync ||
                f.mode == KpShuffleMode::collective)
                continue;
            KpFiber& reader = warp[lane];
            if (f.mode == KpShuffleMode::any || f.mode == KpShuffleMode::ballot) {
                reader.result = f.mode == KpShuffleMode::any ? any : ballot;
                continue;
            }
            const unsigned int source = kp_shuffle_source(f.mode, lane, reader.operand, reader.width);
            if (!((f.mask >> source) & 1u))
                kp_fail("%s:%d: %s: lane %u of warp %u reads lane %u, outside the mask 0x%08x (undefined in CUDA)",
                        reader.file, reader.line, reader.what, lane, f.rank / 32, source, f.mask);
            if (warp[source].wait == KpWait::exited)
                kp_fail("%s:%d: %s: lane %u of warp %u reads lane %u, which has left the kernel (undefined in CUDA)",
                        reader.file, reader.line, reader.what, lane, f.rank / 32, source);
            reader.result = warp[source].value;
        }
        for (unsigned int lane = 0; lane < 32; ++lane)
            if ((f.mask >> lane) & 1u && warp[lane].wait == KpWait::shuffle) warp[lane].wait = KpWait::running;
        released = true;
    }
    if (!released && at_barrier == run.count) {
        const KpFiber& first = run.fibers[0];
        for (unsigned int i = 1; i < run.count; ++i)
            if (run.fibers[i].line != first.line || std::strcmp(run.fibers[i].file, first.file) != 0)
                kp_deadlock(run, "divergent __syncthreads");
        for (unsigned int i = 0; i < run.count; ++i) run.fibers[i].wait = KpWait::running;
        ++kp_barriers_passed;
        released = true;
    }
    return released;
}

// Lists what each thread of a stuck block waits for, runs of equal waits
// together, and aborts.
[[noreturn]] inline void kp_deadlock(const KpBlockRun& run, const char* headline) {
    std::fprintf(stderr,
                 "kpool emulator: %s: the threads of block (%u, %u, %u) %s (threads that diverge at a shuffle or "
                 "__syncthreads are undefined behaviour in CUDA; the emulator refuses them):\n",
                 headline, blockIdx.x, blockIdx.y, blockIdx.z,
                 std::strcmp(headline, "deadlock") == 0 ? "can never all continue" : "wait at different barriers");
    unsigned int start = 0;
    for (unsigned int i = 1; i <= run.count; ++i) {
        const KpFiber& a = run.fibers[start];
        if (i < run.count) {
            const KpFiber& b = run.fibers[i];
            const bool same = a.wait == b.wait &&
                              (a.wait == KpWait::exited ||
                               (a.mask == b.mask && a.mode == b.mode && a.line == b.line &&
                                std::strcmp(a.file, b.file) == 0 && (a.wait == KpWait::barrier || i / 32 == start / 32)));
            if (same) continue;
        }
        std::fprintf(stderr, "  threads %u-%u ", start, i - 1);
        if (a.wait == KpWait::exited)
            std::fprintf(stderr, "have exited\n");
        else if (a.wait == KpWait::barrier)
            std::fprintf(stderr, "wait at __syncthreads (%s:%d)\n", a.file, a.line);
        else
            std::fprintf(stderr, "(warp %u) wait at %s with mask 0x%08x (%s:%d)\n", start / 32, a.what, a.mask, a.file,
                         a.line);
        start = i;
    }
    std::fflush(stderr);
    std::abort();
}

// One thread of the kernel: args[0] is the kernel, args[1 + i] parameter i's value.
template <typename Indices, typename... Params>
struct KpThreadCall;
template <std::size_t... I, typename... Params>
struct KpThreadCall<std::index_sequence<I...>, Params...> {
    static void run(void* const* args) {
        const auto kernel = reinterpret_cast<void (*)(Params...)>(args[0]);
        kernel(*static_cast<std::remove_cv_t<Params>*>(args[1 + I])...);
    }
};

// The order fibers run in between two waits: rank order, or the reverse
// (-DKP_FIBERS_REVERSED). A kernel that reads shared memory another thread
// writes without a barrier between gets one answer under one order and
// may get another under the other, so a test that runs both can see the missing
// barrier.
#ifdef KP_FIBERS_REVERSED
constexpr bool kp_schedule_reversed = true;
#else
constexpr bool kp_schedule_reversed = false;
#endif

// The order blocks run in: ascending index, or the reverse (-DKP_BLOCKS_REVERSED).
// A grid's blocks run one after another here, so the last block of a split
// row to finish (the one that merges the others' lists) is always its
// highest; a test that runs both orders lets another block merge, and would
// see a result that depends on which one does, or on a fence or a load of
// another block's data that only the in-order run gets away without.
#ifdef KP_BLOCKS_REVERSED
constexpr bool kp_blocks_reversed = true;
#else
constexpr bool kp_blocks_reversed = false;
#endif

// Index ``i`` of ``n`` blocks along one grid dimension, in the order above.
inline unsigned int kp_block_at(unsigned int i, unsigned int n) { return kp_blocks_reversed ? n - 1 - i : i; }

// Runs the grid block by block, each block's threads as fibers. args[0] is
// the kernel, args[1 + i] points at parameter i's value.
inline void kp_emulate_grid_fibers(KpThreadRunner run_thread, void* const* args, dim3 grid, dim3 block) {
    KpFiberPool& pool = kp_fiber_pool;
    const unsigned long long threads = 1ull * block.x * block.y * block.z;
    if (threads > kp_max_block_threads)
        kp_fail("a block of %llu threads; CUDA allows at most %u", threads, kp_max_block_threads);
    const unsigned int count = static_cast<unsigned int>(threads);
    if (pool.fibers == nullptr) pool.fibers = new KpFiber[kp_max_block_threads];
    KpBlockRun run;
    run.fibers = pool.fibers;
    run.count = count;
    run.run_thread = run_thread;
    run.args = args;
    KpBlockRun* const outer = kp_block_run;
    kp_block_run = &run;
    for (unsigned int bz = 0; bz < grid.z; ++bz)
        for (unsigned int by = 0; by < grid.y; ++by)
            for (unsigned int bx = 0; bx < grid.x; ++bx) {
                blockIdx = dim3{kp_block_at(bx, grid.x), kp_block_at(by, grid.y), kp_block_at(bz, grid.z)};
                ++kp_block_serial;
                kp_dynamic_shared_block_start();
                for (unsigned int rank = 0; rank < count; ++rank) {
                    KpFiber& f = run.fibers[rank];
                    f = KpFiber{};
                    f.rank = rank;
                    f.thread = dim3{rank % block.x, rank / block.x % block.y, rank / (block.x * block.y)};
                    f.stack = pool.stack(rank);
                    kp_start_fiber(f);
                }
                for (;;) {
                    unsigned int exited = 0;
                    for (unsigned int turn = 0; turn < count; ++turn) {
                        KpFiber& f = run.fibers[kp_schedule_reversed ? count - 1 - turn : turn];
                        if (f.wait == KpWait::running) kp_enter(run, f);
                        exited += f.wait == KpWait::exited;
                    }
                    if (exited == count) break;
                    if (!kp_release(run)) kp_deadlock(run, "deadlock");
                }
            }
    kp_block_run = outer;
    pool.release();
}

#endif  // KPOOL_FIBERS_H
