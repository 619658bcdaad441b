// Ampere's asynchronous copies on the host: cp.async of 16 bytes (.cg) and
// 4 bytes (.ca) from global to shared memory, each reading its source or
// (read false, src-size 0) filling zeros, and cp.async.commit_group and
// cp.async.wait_group; the names of kernels/kpool_cp_async.cuh, whose NVRTC
// half issues the instructions. Host builds only; kpool_emulator.h
// includes it.
//
// Each thread (fiber) keeps its copies in flight and its groups, as the
// PTX ISA keeps them per thread: commit_group puts every copy the thread
// issued since its last commit into a new group (none: an empty group,
// trivially complete), and wait_group N completes the thread's oldest
// groups until at most N are pending. Copies not yet committed stay in
// flight, whatever N.
//
// A copy is deferred. At issue it reads its 16 or 4 source bytes (nothing
// when read is false: zeros), and fills its destination with
// kp_dynamic_shared_poison (0xff, NaN in every float format the kernels
// use); the bytes land at the wait_group that completes its group. So a
// thread that reads a destination before that wait reads poison, and so
// does a thread that reads another thread's copy without the barrier
// after that thread's wait (both undefined in PTX: "reading from the
// destination memory location before the asynchronous operation
// completes"). The emulator refuses, with where the kernel issued or
// waited:
//   - a copy in a kernel that does not open with KP_THREADS_COOPERATE
//     (the emulator tracks copies per fiber; a kernel that copies for other
//     threads needs __syncthreads anyway);
//   - a destination or source not aligned to the copy's size;
//   - a destination outside shared memory: not inside the launch's dynamic
//     shared memory nor inside a static __shared__ array. On the host those
//     are thread-local, so the emulator accepts any thread-local block of a
//     loaded library (dl_iterate_phdr; where <link.h> is missing it accepts
//     any address): a global array or a local variable is refused, a copy
//     into the wrong __shared__ array is not;
//   - at the completing wait, a source that changed since the copy read it
//     ("modifying the source memory location ... before the asynchronous
//     operation completes" is undefined), or a destination that no longer
//     holds what the emulator left there at issue (the kernel wrote it, or
//     another copy in flight to the same bytes landed first: unordered in
//     PTX);
//   - a thread that leaves the kernel with copies not completed (checked
//     as its fiber exits: kp_fiber_exit_check).
// A read of another thread's copy without the barrier shows only when the
// reader runs before the copying thread's wait: tests run both fiber orders.
// Not checked: the fence.proxy.async a wgmma reading the copies needs after
// that barrier (kp_fence_proxy_async is nothing on the host). A 16-byte
// copy that reads counts as a 16-byte access (kp_vector_accesses).
//
// Tests only: -DKP_CP_ASYNC_EAGER lands every copy at issue (what a GPU
// whose copies finish at once would show) instead of poisoning it, so
// tests/test_emulator_cp_async.py can show a kernel's results do not
// depend on when copies land, and that reading before the wait is caught
// only by the deferral.
#ifndef KPOOL_CP_ASYNC_H
#define KPOOL_CP_ASYNC_H

#if __has_include(<link.h>)
#include <link.h>
#define KP_CP_ASYNC_TLS_BLOCKS 1  // dl_iterate_phdr lists the thread-local blocks
#else
#define KP_CP_ASYNC_TLS_BLOCKS 0
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "kpool_fibers.h"

// One cp.async in flight: the bytes it lands, where, and where it was issued.
struct KpCpAsyncCopy {
    unsigned char* dst;
    const unsigned char* src;  // read again at completion when `read`, never otherwise
    unsigned char bytes[16];  // the source as read at issue, or zeros
    int size;
    bool read;
    long long group;  // the thread's commit group, -1 until committed
    const char* file;
    int line;
};

struct KpCpAsyncThread {
    std::vector<KpCpAsyncCopy> inflight;  // in issue order
    long long committed = 0, completed = 0;  // groups
};

// A block's copies, reset when the block changes (kp_block_serial).
// Internal linkage, like kp_fiber_pool: each kernel library keeps its own.
struct KpCpAsyncBlock {
    unsigned long long serial = 0;
    KpCpAsyncThread threads[kp_max_block_threads];
};
static thread_local KpCpAsyncBlock kp_cp_async_block;

inline KpCpAsyncThread& kp_cp_async_thread(const KpFiber& f) {
    KpCpAsyncBlock& block = kp_cp_async_block;
    if (block.serial != kp_block_serial) {
        for (unsigned int t = 0; t < kp_block_run->count; ++t) {
            block.threads[t].inflight.clear();  // keeps its capacity for the next block
            block.threads[t].committed = block.threads[t].completed = 0;
        }
        block.serial = kp_block_serial;
    }
    return block.threads[f.rank];
}

#if KP_CP_ASYNC_TLS_BLOCKS
// Where static __shared__ arrays live on the host: the calling thread's
// thread-local blocks of the loaded libraries (a __shared__ array of a
// template or inline function may be another library's copy: GCC makes it
// one process-wide STB_GNU_UNIQUE symbol). Listed with dl_iterate_phdr when
// an address is not found in the list, and kept per host thread.
struct KpTlsBlocks {
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;  // [begin, end)
    std::size_t last = 0;  // the range the last lookup found
};
static thread_local KpTlsBlocks kp_tls_blocks;

inline int kp_list_tls_block(dl_phdr_info* info, std::size_t, void* data) {
    if (info->dlpi_tls_data == nullptr) return 0;  // none, or not allocated in this thread (so not in use)
    for (int i = 0; i < info->dlpi_phnum; ++i)
        if (info->dlpi_phdr[i].p_type == PT_TLS) {
            const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(info->dlpi_tls_data);
            static_cast<KpTlsBlocks*>(data)->ranges.emplace_back(begin, begin + info->dlpi_phdr[i].p_memsz);
        }
    return 0;
}

inline bool kp_in_tls_block(std::uintptr_t begin, std::uintptr_t end) {
    KpTlsBlocks& blocks = kp_tls_blocks;
    for (int attempt = 0; attempt < 2; ++attempt) {
        if (blocks.last < blocks.ranges.size() && blocks.ranges[blocks.last].first <= begin &&
            end <= blocks.ranges[blocks.last].second)
            return true;
        for (std::size_t i = 0; i < blocks.ranges.size(); ++i)
            if (blocks.ranges[i].first <= begin && end <= blocks.ranges[i].second) {
                blocks.last = i;
                return true;
            }
        if (attempt == 0) {  // a library loaded since the list was made, or the list's first use
            blocks.ranges.clear();
            dl_iterate_phdr(&kp_list_tls_block, &blocks);
        }
    }
    return false;
}
#else
// Without dl_iterate_phdr the emulator cannot tell a static __shared__ array
// from other memory, and takes every destination outside the dynamic
// shared memory for one.
inline bool kp_in_tls_block(std::uintptr_t, std::uintptr_t) { return true; }
#endif

// Whether [address, address + size) lies in the block's shared memory.
inline bool kp_in_shared_memory(const void* address, int size) {
    const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(address), end = begin + size;
    const KpDynamicShared& dynamic = kp_dynamic_shared_memory;
    const std::uintptr_t data = reinterpret_cast<std::uintptr_t>(dynamic.data);
    if (dynamic.bytes > 0 && data <= begin && end <= data + dynamic.bytes) return true;
    return kp_in_tls_block(begin, end);
}

// The fiber of the calling thread; refused in a kernel run one thread after another.
inline KpFiber& kp_cp_async_fiber(const char* what, const char* file, int line) {
    KpFiber* f = kp_fiber_current;
    if (f == nullptr)
        kp_fail("%s:%d: %s in a kernel that does not open with KP_THREADS_COOPERATE(true); the emulator tracks "
                "copies per thread as fibers (a kernel whose threads read each other's copies needs "
                "__syncthreads, and so the marker, anyway)",
                file, line, what);
    return *f;
}

// The bytes an in-flight copy left in its destination at issue.
inline void kp_cp_async_placed(const KpCpAsyncCopy& copy, unsigned char* placed) {
#ifdef KP_CP_ASYNC_EAGER
    std::memcpy(placed, copy.bytes, copy.size);
#else
    std::memset(placed, kp_dynamic_shared_poison, copy.size);
#endif
}

inline void kp_fiber_exits_with_copies(const KpFiber& f);

inline void kp_cp_async(void* shared_dst, const void* global_src, bool read, int size, const char* what,
                        const char* file, int line) {
    const KpFiber& f = kp_cp_async_fiber(what, file, line);
    const std::uintptr_t dst = reinterpret_cast<std::uintptr_t>(shared_dst);
    const std::uintptr_t src = reinterpret_cast<std::uintptr_t>(global_src);
    if (dst % size != 0 || src % size != 0)
        kp_fail("%s:%d: %s: thread %u of block (%u, %u, %u): destination %p and source %p must both be aligned to %d "
                "bytes (PTX ISA, Addresses as Operands)",
                file, line, what, f.rank, blockIdx.x, blockIdx.y, blockIdx.z, shared_dst, global_src, size);
    if (!kp_in_shared_memory(shared_dst, size))
        kp_fail("%s:%d: %s: thread %u of block (%u, %u, %u): destination %p is not in shared memory (neither the "
                "launch's dynamic shared memory nor a __shared__ array); were the destination and source swapped?",
                file, line, what, f.rank, blockIdx.x, blockIdx.y, blockIdx.z, shared_dst);
    KpCpAsyncCopy copy{};
    copy.dst = static_cast<unsigned char*>(shared_dst);
    copy.src = static_cast<const unsigned char*>(global_src);
    copy.size = size;
    copy.read = read;
    copy.group = -1;
    copy.file = file;
    copy.line = line;
    if (read) {
        std::memcpy(copy.bytes, copy.src, size);  // src-size = cp-size: every byte read
        if (size == 16) ++kp_vector_accesses;
    }  // src-size 0: nothing read, zeros land
    unsigned char placed[16];
    kp_cp_async_placed(copy, placed);
    std::memcpy(copy.dst, placed, size);
    kp_cp_async_thread(f).inflight.push_back(copy);
    kp_fiber_exit_check = &kp_fiber_exits_with_copies;
}

inline void kp_cp_async16(void* shared_dst, const void* global_src, bool read, const char* file = __builtin_FILE(),
                          int line = __builtin_LINE()) {
    kp_cp_async(shared_dst, global_src, read, 16, "cp.async.cg.shared.global (16 bytes)", file, line);
}
inline void kp_cp_async4(void* shared_dst, const void* global_src, bool read, const char* file = __builtin_FILE(),
                         int line = __builtin_LINE()) {
    kp_cp_async(shared_dst, global_src, read, 4, "cp.async.ca.shared.global (4 bytes)", file, line);
}

// Every copy the thread issued since its last commit joins a new group (none: an empty group).
inline void kp_cp_async_commit(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    KpCpAsyncThread& thread = kp_cp_async_thread(kp_cp_async_fiber("cp.async.commit_group", file, line));
    ++thread.committed;
    for (KpCpAsyncCopy& copy : thread.inflight)
        if (copy.group < 0) copy.group = thread.committed;
}

// Lands one copy at the wait (file:line) that completes its group, after
// checking that neither its source nor its destination changed in flight.
inline void kp_cp_async_land(const KpFiber& f, const KpCpAsyncCopy& copy, const char* file, int line) {
    if (copy.read && std::memcmp(copy.src, copy.bytes, copy.size) != 0)
        kp_fail("%s:%d: cp.async.wait_group: thread %u of block (%u, %u, %u): the source %p of the copy issued at "
                "%s:%d changed while the copy was in flight; PTX leaves undefined which bytes land",
                file, line, f.rank, blockIdx.x, blockIdx.y, blockIdx.z, static_cast<const void*>(copy.src), copy.file,
                copy.line);
    unsigned char placed[16];
    kp_cp_async_placed(copy, placed);
    if (std::memcmp(copy.dst, placed, copy.size) != 0)
        kp_fail("%s:%d: cp.async.wait_group: thread %u of block (%u, %u, %u): the destination %p of the copy issued "
                "at %s:%d was written while the copy was in flight (by the kernel, or by another copy to the same "
                "bytes); PTX orders neither before the copy",
                file, line, f.rank, blockIdx.x, blockIdx.y, blockIdx.z, static_cast<void*>(copy.dst), copy.file,
                copy.line);
    std::memcpy(copy.dst, copy.bytes, copy.size);
}

// Completes the thread's oldest groups until at most PENDING are pending.
template <int PENDING>
void kp_cp_async_wait(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    static_assert(PENDING >= 0 && PENDING <= 7, "kp_cp_async_wait: at most 7 groups left pending");
    const KpFiber& f = kp_cp_async_fiber("cp.async.wait_group", file, line);
    KpCpAsyncThread& thread = kp_cp_async_thread(f);
    if (thread.committed - thread.completed <= PENDING) return;
    thread.completed = thread.committed - PENDING;
    std::size_t kept = 0;
    for (std::size_t i = 0; i < thread.inflight.size(); ++i) {
        const KpCpAsyncCopy& copy = thread.inflight[i];
        if (copy.group >= 0 && copy.group <= thread.completed)
            kp_cp_async_land(f, copy, file, line);
        else
            thread.inflight[kept++] = copy;
    }
    thread.inflight.resize(kept);
}

// A thread leaves the kernel: every copy it issued must have completed.
inline void kp_fiber_exits_with_copies(const KpFiber& f) {
    if (kp_cp_async_block.serial != kp_block_serial) return;  // no copy in this block
    const std::vector<KpCpAsyncCopy>& inflight = kp_cp_async_block.threads[f.rank].inflight;
    if (inflight.empty()) return;
    const KpCpAsyncCopy& first = inflight.front();
    kp_fail("thread %u of block (%u, %u, %u) left the kernel with cp.async copies in flight (%zu, the first issued at "
            "%s:%d, %s); a cp.async.wait_group must complete them before the thread exits",
            f.rank, blockIdx.x, blockIdx.y, blockIdx.z, inflight.size(), first.file, first.line,
            first.group < 0 ? "never committed" : "committed, its group not waited for");
}

#endif  // KPOOL_CP_ASYNC_H
