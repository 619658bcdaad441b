// Hopper's warpgroup MMA on the host: wgmma.mma_async m64nNk32 with e4m3
// operands in shared memory (N = 8, 16, 32, 64, 128), accumulating into
// float32, and wgmma.fence, commit_group and wait_group; the names of
// kernels/kpool_wgmma.cuh, whose NVRTC half issues the instructions. Host
// builds only; kpool_emulator.h includes it.
//
// Every instruction is a collective of the warpgroup's 128 threads
// (kpool_fibers.h: kp_warpgroup_collective): once all have arrived it is
// carried out once, with the threads' operands side by side, and each
// instruction checks that the threads agree on what must be uniform.
//
// The operands (PTX ISA, "Shared Memory Matrix Layout" and "Matrix
// Descriptor Format"). A and B are K-major: row r (of A's 64, of B's N) holds
// its 32 k bytes. A descriptor gives the start address, the leading-dimension
// byte offset LBO, the stride-dimension byte offset SBO and the swizzle;
// rows come in groups of 8, SBO bytes apart. With start address s, row r,
// k byte k:
//
//   no swizzle    core matrices of 8 rows x 16 bytes, 128 bytes each, LBO
//                 apart along k:  s + 16 (r % 8) + SBO (r / 8) + LBO (k / 16) + k % 16
//   W-byte swizzle (W = 128, 64, 32; LBO unused)  rows of W bytes:
//                 L = s + W (r % 8) + SBO (r / 8) + k, at L ^ (((L >> 7) & (W / 16 - 1)) << 4)
//
// The swizzle exchanges 16-byte chunks within each W-byte row by the row's
// address bits 7-9 (Swizzle<3,4,3> for 128 bytes): it reads the address, so
// a descriptor advanced along k within a row (s + 32, s + 64, ...) finds the
// chunks where a 1024-byte aligned tile put them (512 and 256 bytes for 64B
// and 32B). The emulator reads the host address of the same shared array,
// so a swizzled tile must be aligned in the kernel (alignas(1024)), as on
// the GPU. Base offset (bits 49-51) other than 0 is refused, not emulated.
//
// D's fragments (PTX ISA, "Register Fragments" for wgmma .m64nNk32): thread
// t of warp w of the warpgroup holds, as element i of its KpWgmmaAccum<N>,
//
//   D[16 w + t / 4 + 8 ((i / 2) % 2)][8 (i / 4) + 2 (t % 4) + i % 2]
//
// The arithmetic: each product of two e4m3 values is exact in float32; the
// 32 products of D[m][n] are added one after another in k order, in float32
// (from the first product, with the launch's flush-to-zero), and the sum
// then added to the accumulator when scale_d is nonzero (D = sum otherwise).
// The tensor cores' own order and internal width are undocumented (narrower
// than float32 for FP8 on Hopper by public measurements), so results agree
// with a GPU within a bound, not bit for bit.
//
// Asynchrony. The product is computed when the warpgroup issues it, from the
// operand bytes as they are then, into a pending result; the threads'
// accumulators take it when a wgmma.wait_group completes its group. PTX
// leaves undefined when, between issue and completion, the operands are
// read and the accumulators written, so the emulator refuses what would
// make that matter:
//   - an accumulator element read or written (KpWgmmaAccum's operator[],
//     a copy, leaving its scope) while a wgmma that writes it is in flight;
//   - a wgmma on an accumulator the thread accessed after the warpgroup's
//     last wgmma.fence (PTX: a fence between a register access and the
//     wgmma that uses the register; a chain of wgmma on one accumulator
//     needs none);
//   - operand shared memory that changed between the issue and the
//     wgmma.wait_group that completes the group: the bytes read at issue are
//     kept and compared there. A write that restores the same bytes is not
//     seen; one that changes them would have given a GPU either value.
// Not checked: fence.proxy.async between the threads' own stores and the
// wgmma that reads them (kp_fence_proxy_async is nothing on the host).
//
// Tests only: -DKP_WGMMA_MISPLACED_LANE=t gives thread t of each warpgroup
// the rows of thread t ^ 4 (the next row group), and
// -DKP_WGMMA_MISPLACED_SWIZZLE_BIT=b leaves row bit b out of the swizzle, so
// tests/test_emulator_wgmma.py can show that either layout slip fails them.
#ifndef KPOOL_WGMMA_H
#define KPOOL_WGMMA_H

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "kpool_fibers.h"
#include "kpool_mma.h"

// The descriptor's swizzle field (bits 62-63).
enum KpSwizzle : unsigned int { kp_swizzle_none = 0, kp_swizzle_128b = 1, kp_swizzle_64b = 2, kp_swizzle_32b = 3 };

struct KpWgmmaOp;

// What the emulator keeps with each accumulator: the wgmma in flight that
// writes it, and the warpgroup's fence count when the thread last touched it.
struct KpWgmmaAccumState {
    KpWgmmaOp* pending = nullptr;
    unsigned long long touched = 0;
};

// 16 operand bytes as a wgmma read them at issue, and where they sit in
// the operand, for the message if they change.
struct KpWgmmaChunk {
    const unsigned char* address;
    unsigned char bytes[16];
    char operand;  // 'A' or 'B'
    unsigned char row, k;
};

// One issued wgmma.mma_async of a warpgroup.
struct KpWgmmaOp {
    const char* file = "";
    int line = 0;
    int elements = 0;  // N / 2 a thread
    long long group = -1;  // the commit group, -1 until committed
    KpWgmmaAccumState* state[kp_warpgroup_threads] = {};
    float* registers[kp_warpgroup_threads] = {};
    std::vector<float> result;  // [128][N / 2]
    std::vector<KpWgmmaChunk> chunks;
};

struct KpWarpgroupState {
    unsigned long long fences = 0;
    long long committed = 0, completed = 0;  // commit groups
    std::vector<std::unique_ptr<KpWgmmaOp>> inflight;  // in issue order
};

// A block's wgmma state, reset when the block changes (kp_block_serial).
// Internal linkage, like kp_fiber_pool: each kernel library keeps its own.
struct KpWgmmaBlock {
    unsigned long long serial = 0;
    KpWarpgroupState warpgroups[kp_max_block_threads / kp_warpgroup_threads];
    std::vector<std::uintptr_t> pointers;  // what kp_wgmma_desc was given, for its descriptors' addresses
    float a[64][32], b[128][32];  // the operands of the wgmma being issued
};
static thread_local KpWgmmaBlock kp_wgmma_block;

inline KpWgmmaBlock& kp_wgmma_state() {
    KpWgmmaBlock& block = kp_wgmma_block;
    if (block.serial != kp_block_serial) {
        for (KpWarpgroupState& w : block.warpgroups) w = KpWarpgroupState{};
        block.pointers.clear();
        block.serial = kp_block_serial;
    }
    return block;
}

// The warpgroup of the running fiber (null outside fibers).
inline KpWarpgroupState* kp_wgmma_warpgroup() {
    const KpFiber* f = kp_fiber_current;
    return f == nullptr ? nullptr : &kp_wgmma_state().warpgroups[f->rank / kp_warpgroup_threads];
}

// An accumulator index, with where the kernel wrote it (the implicit
// conversion from int takes the subscript's file and line).
struct KpAccumIndex {
    int i;
    const char* file;
    int line;
    KpAccumIndex(int index, const char* f = __builtin_FILE(), int l = __builtin_LINE()) : i(index), file(f), line(l) {}
};

// A thread's access to its accumulator: refused while a wgmma writes it.
inline void kp_wgmma_touch(KpWgmmaAccumState& state, const char* access, int element, const char* file, int line) {
    if (state.pending != nullptr) {
        const KpFiber* f = kp_fiber_current;
        kp_fail("%s:%d: thread %u of block (%u, %u, %u) %s element %d of an accumulator that the wgmma.mma_async "
                "issued at %s:%d is still writing; a wgmma.wait_group must complete its group first (undefined in PTX)",
                file, line, f != nullptr ? f->rank : 0u, blockIdx.x, blockIdx.y, blockIdx.z, access, element,
                state.pending->file, state.pending->line);
    }
    if (const KpWarpgroupState* w = kp_wgmma_warpgroup()) state.touched = w->fences;
}

template <int N>
class KpWgmmaAccum;
template <int N>
void kp_wgmma_e4m3(KpWgmmaAccum<N>& d, unsigned long long desc_a, unsigned long long desc_b, int scale_d,
                   const char* file = __builtin_FILE(), int line = __builtin_LINE());

// A thread's D fragment: N / 2 floats, element i as the header says.
template <int N>
class KpWgmmaAccum {
    static_assert(N == 8 || N == 16 || N == 32 || N == 64 || N == 128, "KpWgmmaAccum: N is 8, 16, 32, 64 or 128");

  public:
    explicit KpWgmmaAccum(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
        kp_wgmma_touch(state_, "declares", 0, file, line);
    }
    KpWgmmaAccum(const KpWgmmaAccum& other) {
        kp_wgmma_touch(const_cast<KpWgmmaAccumState&>(other.state_), "copies", 0, "(copy)", 0);
        kp_wgmma_touch(state_, "copies into", 0, "(copy)", 0);
        std::memcpy(v_, other.v_, sizeof v_);
    }
    KpWgmmaAccum& operator=(const KpWgmmaAccum& other) {
        kp_wgmma_touch(const_cast<KpWgmmaAccumState&>(other.state_), "copies", 0, "(assignment)", 0);
        kp_wgmma_touch(state_, "assigns", 0, "(assignment)", 0);
        std::memcpy(v_, other.v_, sizeof v_);
        return *this;
    }
    ~KpWgmmaAccum() {
        if (state_.pending != nullptr)
            kp_fail("an accumulator left its scope while the wgmma.mma_async issued at %s:%d was writing it "
                    "(no wgmma.wait_group completed its group)",
                    state_.pending->file, state_.pending->line);
    }
    float& operator[](KpAccumIndex at) {
        if (at.i < 0 || at.i >= N / 2)
            kp_fail("%s:%d: element %d of a KpWgmmaAccum<%d>, which has %d", at.file, at.line, at.i, N, N / 2);
        kp_wgmma_touch(state_, "accesses", at.i, at.file, at.line);
        return v_[at.i];
    }

  private:
    float v_[N / 2];
    KpWgmmaAccumState state_;
    friend void kp_wgmma_e4m3<N>(KpWgmmaAccum<N>&, unsigned long long, unsigned long long, int, const char*, int);
};

// The descriptor (same bits as on the GPU; the start address is the low 18
// bits of the host address). The emulator keeps the pointer, so a
// descriptor made from it, or advanced from it by up to 256 KiB, finds the
// host address again (the nearest kept pointer at or below it).
inline unsigned long long kp_wgmma_desc(const void* smem, unsigned int leading_bytes, unsigned int stride_bytes,
                                        KpSwizzle swizzle, const char* file = __builtin_FILE(),
                                        int line = __builtin_LINE()) {
    const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(smem);
    if (address % 16 != 0 || leading_bytes % 16 != 0 || stride_bytes % 16 != 0 || leading_bytes >= (1u << 18) ||
        stride_bytes >= (1u << 18) || swizzle > kp_swizzle_32b)
        kp_fail("%s:%d: kp_wgmma_desc(%p, %u, %u, %u): the address and both byte offsets must be multiples of 16, the "
                "offsets below 256 KiB, the swizzle 0-3 (PTX ISA, Matrix Descriptor Format)",
                file, line, smem, leading_bytes, stride_bytes, static_cast<unsigned int>(swizzle));
    std::vector<std::uintptr_t>& pointers = kp_wgmma_state().pointers;
    bool known = false;
    for (const std::uintptr_t p : pointers) known = known || p == address;
    if (!known) pointers.push_back(address);
    return ((address & 0x3ffffu) >> 4) | static_cast<unsigned long long>(leading_bytes >> 4) << 16 |
           static_cast<unsigned long long>(stride_bytes >> 4) << 32 | static_cast<unsigned long long>(swizzle) << 62;
}

// Reads one operand (rows x 32 e4m3 bytes) by its descriptor into values,
// and keeps the 16-byte chunks it read.
inline void kp_wgmma_operand(unsigned long long desc, char operand, int rows, float (*values)[32],
                             std::vector<KpWgmmaChunk>& chunks, const char* file, int line) {
    const unsigned int reserved = static_cast<unsigned int>((desc >> 14) & 3u) | ((desc >> 30) & 3u) |
                                  ((desc >> 46) & 7u) | ((desc >> 52) & 0x3ffu);
    if (reserved != 0 || ((desc >> 49) & 7u) != 0)
        kp_fail("%s:%d: wgmma.mma_async: %c's descriptor 0x%016llx sets reserved bits or a base offset (bits 49-51), "
                "which the emulator does not model",
                file, line, operand, desc);
    const unsigned int start = static_cast<unsigned int>(desc & 0x3fffu) << 4;
    const unsigned int leading = static_cast<unsigned int>((desc >> 16) & 0x3fffu) << 4;
    const unsigned int stride = static_cast<unsigned int>((desc >> 32) & 0x3fffu) << 4;
    const unsigned int swizzle = static_cast<unsigned int>(desc >> 62);
    // The host address: the nearest pointer kp_wgmma_desc was given at or below it, within 256 KiB.
    const std::vector<std::uintptr_t>& pointers = kp_wgmma_state().pointers;
    if (pointers.empty())
        kp_fail("%s:%d: wgmma.mma_async: %c's descriptor 0x%016llx, but no kp_wgmma_desc ran in this block", file,
                line, operand, desc);
    std::uintptr_t origin = 0, nearest = ~std::uintptr_t{0};
    for (const std::uintptr_t p : pointers) {
        const std::uintptr_t delta = (start - (p & 0x3ffffu)) & 0x3ffffu;
        if (delta < nearest) nearest = delta, origin = p + delta;
    }
    const unsigned int width = swizzle == kp_swizzle_none ? 16u : 128u >> (swizzle - 1);
    if (swizzle != kp_swizzle_none && (origin % width) + 32 > width)
        kp_fail("%s:%d: wgmma.mma_async: %c's 32 k bytes start %u bytes into a %u-byte swizzled row", file, line,
                operand, static_cast<unsigned int>(origin % width), width);
    unsigned int rows_mask = width / 16 - 1;  // the row bits the swizzle XORs into the chunk index
#ifdef KP_WGMMA_MISPLACED_SWIZZLE_BIT
    rows_mask &= ~(1u << KP_WGMMA_MISPLACED_SWIZZLE_BIT);  // tests only: one row bit left out
#endif
    for (int r = 0; r < rows; ++r)
        for (int half = 0; half < 2; ++half) {
            std::uintptr_t at;
            if (swizzle == kp_swizzle_none) {
                at = origin + 16u * (r % 8) + std::uintptr_t{stride} * (r / 8) + std::uintptr_t{leading} * half;
            } else {
                const std::uintptr_t logical = origin + width * (r % 8) + std::uintptr_t{stride} * (r / 8) + 16u * half;
                at = logical ^ (((logical >> 7) & rows_mask) << 4);
            }
            KpWgmmaChunk chunk;
            chunk.address = reinterpret_cast<const unsigned char*>(at);
            std::memcpy(chunk.bytes, chunk.address, 16);
            chunk.operand = operand;
            chunk.row = static_cast<unsigned char>(r);
            chunk.k = static_cast<unsigned char>(16 * half);
            for (int j = 0; j < 16; ++j) values[r][16 * half + j] = kp_e4m3_value(chunk.bytes[j]);
            chunks.push_back(chunk);
        }
}

// What each thread brings to a wgmma.mma_async.
struct KpWgmmaIssue {
    unsigned int rank;
    int n;
    unsigned long long desc_a, desc_b;
    int scale_d;
    KpWgmmaAccumState* state;
    float* registers;
    const char* file;
    int line;
};

[[noreturn]] inline void kp_wgmma_disagree(const KpWgmmaIssue& first, const KpWgmmaIssue& other, const char* what,
                                           unsigned long long a, unsigned long long b) {
    kp_fail("%s:%d: wgmma.mma_async: threads %u and %u of a warpgroup disagree on %s (0x%llx and 0x%llx); it must be "
            "the same in all 128 (undefined in PTX)",
            first.file, first.line, first.rank, other.rank, what, a, b);
}

inline void kp_wgmma_issue(void* const* threads) {
    const KpWgmmaIssue& first = *static_cast<const KpWgmmaIssue*>(threads[0]);
    KpWarpgroupState& group = kp_wgmma_state().warpgroups[first.rank / kp_warpgroup_threads];
    ++kp_wgmmas_issued;
    for (unsigned int t = 0; t < kp_warpgroup_threads; ++t) {
        const KpWgmmaIssue& mine = *static_cast<const KpWgmmaIssue*>(threads[t]);
        if (mine.desc_a != first.desc_a) kp_wgmma_disagree(first, mine, "A's descriptor", first.desc_a, mine.desc_a);
        if (mine.desc_b != first.desc_b) kp_wgmma_disagree(first, mine, "B's descriptor", first.desc_b, mine.desc_b);
        if ((mine.scale_d != 0) != (first.scale_d != 0))
            kp_wgmma_disagree(first, mine, "scale-d", first.scale_d != 0, mine.scale_d != 0);
        if (mine.state->pending == nullptr && mine.state->touched >= group.fences)
            kp_fail("%s:%d: wgmma.mma_async: thread %u accessed this accumulator after the warpgroup's last "
                    "wgmma.fence (or there was none); PTX requires wgmma.fence between a thread's access to a register "
                    "and a wgmma that uses it",
                    first.file, first.line, mine.rank);
    }
    const int n = first.n, elements = n / 2;
    float(&a)[64][32] = kp_wgmma_block.a;
    float(&b)[128][32] = kp_wgmma_block.b;
    auto op = std::make_unique<KpWgmmaOp>();
    op->file = first.file;
    op->line = first.line;
    op->elements = elements;
    op->result.resize(static_cast<std::size_t>(kp_warpgroup_threads) * elements);
    kp_wgmma_operand(first.desc_a, 'A', 64, a, op->chunks, first.file, first.line);
    kp_wgmma_operand(first.desc_b, 'B', n, b, op->chunks, first.file, first.line);
    for (unsigned int t = 0; t < kp_warpgroup_threads; ++t) {
        const KpWgmmaIssue& mine = *static_cast<const KpWgmmaIssue*>(threads[t]);
        const unsigned int warp = t / 32;
#ifdef KP_WGMMA_MISPLACED_LANE
        // Tests only: this thread takes the rows of thread t ^ 4, a wrong layout the tests must see.
        const unsigned int lane = (t % 32) ^ (t == KP_WGMMA_MISPLACED_LANE ? 4u : 0u);
#else
        const unsigned int lane = t % 32;
#endif
        const float* previous = mine.state->pending != nullptr
                                    ? mine.state->pending->result.data() + static_cast<std::size_t>(t) * elements
                                    : mine.registers;
        float* out = op->result.data() + static_cast<std::size_t>(t) * elements;
        for (int i = 0; i < elements; ++i) {
            const int row = 16 * warp + lane / 4 + 8 * ((i / 2) % 2), column = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
            float sum = a[row][0] * b[column][0];  // each product exact
            for (int k = 1; k < 32; ++k) sum += a[row][k] * b[column][k];
            out[i] = first.scale_d != 0 ? previous[i] + sum : sum;
        }
        op->state[t] = mine.state;
        op->registers[t] = mine.registers;
    }
    for (unsigned int t = 0; t < kp_warpgroup_threads; ++t) op->state[t]->pending = op.get();
    group.inflight.push_back(std::move(op));
}

template <int N>
void kp_wgmma_e4m3(KpWgmmaAccum<N>& d, unsigned long long desc_a, unsigned long long desc_b, int scale_d,
                   const char* file, int line) {
    static constexpr const char* names[] = {"wgmma.mma_async.m64n8k32.e4m3", "wgmma.mma_async.m64n16k32.e4m3",
                                            "wgmma.mma_async.m64n32k32.e4m3", "wgmma.mma_async.m64n64k32.e4m3",
                                            "wgmma.mma_async.m64n128k32.e4m3"};
    const KpFiber* f = kp_fiber_current;
    KpWgmmaIssue issue{f != nullptr ? f->rank : 0u, N, desc_a, desc_b, scale_d, &d.state_, d.v_, file, line};
    kp_warpgroup_collective(names[N == 8 ? 0 : N == 16 ? 1 : N == 32 ? 2 : N == 64 ? 3 : 4], &kp_wgmma_issue, &issue,
                            file, line);
}

// wgmma.fence, commit_group and wait_group: what each thread brings.
struct KpWgmmaStep {
    unsigned int rank;
    int pending;  // wait_group's N
    const char* file;
    int line;
};

inline KpWarpgroupState& kp_wgmma_step_group(void* const* threads) {
    return kp_wgmma_state().warpgroups[static_cast<const KpWgmmaStep*>(threads[0])->rank / kp_warpgroup_threads];
}

inline void kp_wgmma_fence_compute(void* const* threads) { ++kp_wgmma_step_group(threads).fences; }

// Every wgmma issued since the last commit joins a new group (none: an empty group).
inline void kp_wgmma_commit_compute(void* const* threads) {
    KpWarpgroupState& group = kp_wgmma_step_group(threads);
    ++group.committed;
    for (const std::unique_ptr<KpWgmmaOp>& op : group.inflight)
        if (op->group < 0) op->group = group.committed;
}

// Completes the oldest groups until at most N are pending: checks each
// wgmma's operand bytes against what it read at issue, then hands each
// thread its result (unless a later wgmma in flight writes the same
// accumulator, chained on this one: that one hands it over).
inline void kp_wgmma_wait_compute(void* const* threads) {
    const KpWgmmaStep& step = *static_cast<const KpWgmmaStep*>(threads[0]);
    KpWarpgroupState& group = kp_wgmma_step_group(threads);
    while (group.committed - group.completed > step.pending) {
        const long long completing = ++group.completed;
        std::vector<std::unique_ptr<KpWgmmaOp>> still;
        for (std::unique_ptr<KpWgmmaOp>& op : group.inflight) {
            if (op->group != completing) {
                still.push_back(std::move(op));
                continue;
            }
            for (const KpWgmmaChunk& chunk : op->chunks)
                for (int j = 0; j < 16; ++j)
                    if (chunk.address[j] != chunk.bytes[j])
                        kp_fail("%s:%d: wgmma.wait_group: %c[%u][%u] (an e4m3 byte in shared memory) that the "
                                "wgmma.mma_async issued at %s:%d reads changed while it was in flight (0x%02x at "
                                "issue, 0x%02x now); PTX forbids writing a wgmma's operands before the "
                                "wgmma.wait_group that completes it",
                                step.file, step.line, chunk.operand, chunk.row, chunk.k + j, op->file, op->line,
                                chunk.bytes[j], chunk.address[j]);
            for (unsigned int t = 0; t < kp_warpgroup_threads; ++t) {
                if (op->state[t]->pending != op.get()) continue;
                std::memcpy(op->registers[t], op->result.data() + static_cast<std::size_t>(t) * op->elements,
                            sizeof(float) * op->elements);
                op->state[t]->pending = nullptr;
            }
        }
        group.inflight = std::move(still);
    }
}

inline void kp_wgmma_step(const char* what, KpWarpCompute compute, int pending, const char* file, int line) {
    const KpFiber* f = kp_fiber_current;
    KpWgmmaStep step{f != nullptr ? f->rank : 0u, pending, file, line};
    kp_warpgroup_collective(what, compute, &step, file, line);
}

inline void kp_wgmma_fence(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    kp_wgmma_step("wgmma.fence", &kp_wgmma_fence_compute, 0, file, line);
}
inline void kp_wgmma_commit(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    kp_wgmma_step("wgmma.commit_group", &kp_wgmma_commit_compute, 0, file, line);
}
template <int PENDING>
void kp_wgmma_wait(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    static_assert(PENDING >= 0 && PENDING <= 7, "kp_wgmma_wait: wgmma.wait_group takes 0 to 7");
    kp_wgmma_step("wgmma.wait_group", &kp_wgmma_wait_compute, PENDING, file, line);
}
// Orders the threads' stores before the async proxy's reads on the GPU; the
// emulator's wgmma reads shared memory when issued, after every store before it.
inline void kp_fence_proxy_async() {}

#endif  // KPOOL_WGMMA_H
