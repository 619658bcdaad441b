// Shared device code of the k-pool kernels: element conversions, 8-channel
// loads and stores, index loads, and PoolChannel (one pooled channel) with
// pool8 (one pool over a thread's 8 channels), the helpers every kernel pools
// through so that all paths agree bit for bit.
//
//     logits[m] = gate[m] + ape[m]
//     pooled    = sum_m exp(logits[m] - max) * k[m] / sum_m exp(logits[m] - max)
//
// One PoolChannel is one channel c of one pool: the softmax runs per channel,
// not per member. One weight per member would be a different function.
#ifndef KPOOL_COMMON_CUH
#define KPOOL_COMMON_CUH

#include "kpool_portability.h"

namespace kp {

// Storage types. bf16 is the top half of a float32; fp16 is IEEE binary16.
// We convert them ourselves, so neither NVRTC nor the host compiler needs the
// CUDA half-precision headers.
struct bf16 {
    unsigned short bits;
};
struct fp16 {
    unsigned short bits;
};

// Channels one thread owns. head_dim is a multiple of it, and 8 two-byte
// elements are one 16-byte vector.
enum : int { kChannelsPerThread = 8 };
// The most threads a launch puts in a block (kpool_cupy/kernel/geometry.py:
// one 4096-channel pool), the kernels' __launch_bounds__. With at least one
// such block resident per SM it caps registers at 128 per thread (65536 /
// 512); tests/test_ptx.py checks no shipped variant spills under it.
enum : int { kMaxThreadsPerBlock = 512 };
// The most threads a block of request or pool groups has at HEAD_DIM
// (kpool_cupy/kernel/geometry.py: groups up to 256 threads, or one group of
// HEAD_DIM / 8): a tighter launch bound where a kernel needs more than 128
// registers.
__host__ __device__ constexpr int group_block_bound(int head_dim) {
    return head_dim / kChannelsPerThread > 256 ? head_dim / kChannelsPerThread : 256;
}

// The launch bounds of the prefill pooling kernels (kpool_compress and its
// FP8 form) at the engines' shape, 16-bit keys and gate scores in pools of
// at most 4 members, where blocks of at most 256 threads (HEAD_DIM <= 2048):
// 3 blocks of 256 threads per SM, which caps registers at 80 (65536 / 768,
// in ptxas's steps of 8) and keeps 24 warps of loads in flight instead of 16.
// Elsewhere one block of kMaxThreadsPerBlock (128 registers).
template <typename KT, typename GT, int HEAD_DIM, int KPOOL>
__host__ __device__ constexpr bool three_blocks_per_sm() {
    return sizeof(KT) == 2 && sizeof(GT) == 2 && KPOOL <= 4 && group_block_bound(HEAD_DIM) == 256;
}
template <typename KT, typename GT, int HEAD_DIM, int KPOOL>
__host__ __device__ constexpr int pool_block_threads() {
    return three_blocks_per_sm<KT, GT, HEAD_DIM, KPOOL>() ? 256 : kMaxThreadsPerBlock;
}
template <typename KT, typename GT, int HEAD_DIM, int KPOOL>
__host__ __device__ constexpr int pool_blocks_per_sm() {
    return three_blocks_per_sm<KT, GT, HEAD_DIM, KPOOL>() ? 3 : 1;
}

// VectorAccess: bits of a kernel's VECTOR template argument, one per operand
// whose rows the launcher found 16-byte aligned (base address and every
// stepped stride). Mirrored in kpool_cupy/kernel/codes.py (a test reads this
// header and compares). The access path is chosen at compile time: a kernel
// built for aligned operands carries no element-by-element code for them.
// kVectorTail is a ring's keys, kVectorGateRing its gate scores: one bit each,
// since a split ring's two halves are separate arrays.
enum VectorAccess : int {
    kVectorK = 1,
    kVectorGate = 2,
    kVectorApe = 4,
    kVectorOut = 8,
    kVectorTail = 16,
    kVectorGateRing = 32
};

// Whether every bit of `wanted` is in the VECTOR template argument `mask`.
__host__ __device__ constexpr bool vector_bits(int mask, int wanted) { return (mask & wanted) == wanted; }

__device__ __forceinline__ float to_float(float value) { return value; }
__device__ __forceinline__ float to_float(bf16 value) {
    return kp_bits_to_float(static_cast<unsigned int>(value.bits) << 16);
}
__device__ __forceinline__ float to_float(fp16 value) {
#if KP_DEVICE_CODE
    float result;
    asm("cvt.f32.f16 %0, %1;" : "=f"(result) : "h"(value.bits));
    return result;
#else
    const unsigned int sign = (value.bits & 0x8000u) << 16;
    const unsigned int exponent = (value.bits >> 10) & 0x1fu;
    const unsigned int mantissa = value.bits & 0x3ffu;
    if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float32
        const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
        return kp_bits_to_float(kp_float_to_bits(magnitude) | sign);
    }
    if (exponent == 31) return kp_bits_to_float(sign | 0x7f800000u | (mantissa << 13));
    return kp_bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
#endif
}

template <typename T>
__device__ __forceinline__ T from_float(float value);

template <>
__device__ __forceinline__ float from_float<float>(float value) {
    return value;
}
// Round to nearest even; a NaN stays a (quiet) NaN instead of rounding to inf.
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float value) {
    const unsigned int bits = kp_float_to_bits(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<unsigned short>((bits >> 16) | 0x0040u)};
    const unsigned int rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
    return bf16{static_cast<unsigned short>(rounded >> 16)};
}
template <>
__device__ __forceinline__ fp16 from_float<fp16>(float value) {
#if KP_DEVICE_CODE
    unsigned short bits;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
    return fp16{bits};
#else
    const unsigned int bits = kp_float_to_bits(value);
    const unsigned int sign = (bits >> 16) & 0x8000u;
    const unsigned int magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return fp16{static_cast<unsigned short>(sign | 0x7e00u)};
    // 65520 is halfway between 65504 (the largest half) and 65536; it and
    // everything above round to infinity.
    if (magnitude >= 0x477ff000u) return fp16{static_cast<unsigned short>(sign | 0x7c00u)};
    if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal half, in units of 2^-24
        const float units = std::nearbyint(kp_bits_to_float(magnitude) * 16777216.0f);
        return fp16{static_cast<unsigned short>(sign | static_cast<unsigned int>(units))};
    }
    unsigned int rebased = magnitude - (112u << 23);
    rebased += 0x0fffu + ((rebased >> 13) & 1u);
    return fp16{static_cast<unsigned short>(sign | (rebased >> 13))};
#endif
}

// The raw bits of element i of a group of 8 held in 16-byte words.
template <typename T>
__device__ __forceinline__ T element_from_words(const uint4* words, int i);

__device__ __forceinline__ unsigned int word_of(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
template <>
__device__ __forceinline__ float element_from_words<float>(const uint4* words, int i) {
    return kp_bits_to_float(word_of(words[i / 4], i % 4));
}
template <>
__device__ __forceinline__ bf16 element_from_words<bf16>(const uint4* words, int i) {
    return bf16{static_cast<unsigned short>(word_of(words[0], i / 2) >> (16 * (i % 2)))};
}
template <>
__device__ __forceinline__ fp16 element_from_words<fp16>(const uint4* words, int i) {
    return fp16{static_cast<unsigned short>(word_of(words[0], i / 2) >> (16 * (i % 2)))};
}

__device__ __forceinline__ unsigned int raw_bits(float value) { return kp_float_to_bits(value); }
__device__ __forceinline__ unsigned int raw_bits(bf16 value) { return value.bits; }
__device__ __forceinline__ unsigned int raw_bits(fp16 value) { return value.bits; }

// Eight consecutive elements of a row as loaded, converted to float32 only
// when read: 16-byte words when VECTOR (the launcher has checked the address
// and row stride are 16-byte aligned), elements otherwise. Holding the raw
// bits lets a pool issue all its member loads before the first is used.
template <typename T, bool VECTOR>
struct Row8;
template <typename T>
struct Row8<T, true> {
    uint4 words[sizeof(T) * kChannelsPerThread / 16];
    __device__ __forceinline__ void load(const T* source) {
#pragma unroll
        for (int w = 0; w < static_cast<int>(sizeof(words) / sizeof(uint4)); ++w)
            words[w] = kp_load16(source + w * (16 / sizeof(T)));
    }
    // The same load issued here, not sunk under a later branch that uses it
    // (kp_load16_now); read-only data only.
    __device__ __forceinline__ void load_now(const T* source) {
#pragma unroll
        for (int w = 0; w < static_cast<int>(sizeof(words) / sizeof(uint4)); ++w)
            words[w] = kp_load16_now(source + w * (16 / sizeof(T)));
    }
    __device__ __forceinline__ float operator[](int i) const { return to_float(element_from_words<T>(words, i)); }
};
template <typename T>
struct Row8<T, false> {
    T elements[kChannelsPerThread];
    __device__ __forceinline__ void load(const T* source) {
#pragma unroll
        for (int i = 0; i < kChannelsPerThread; ++i) elements[i] = source[i];
    }
    // Element loads have no such form; the compiler places them.
    __device__ __forceinline__ void load_now(const T* source) { load(source); }
    __device__ __forceinline__ float operator[](int i) const { return to_float(elements[i]); }
};

// Eight float32 values rounded to bfloat16, two to a word (value 2w in the
// low half of word w), with from_float<bf16>'s bits. On a GPU of sm_80 or
// newer the hardware rounds two at a time (cvt.rn.bf16x2.f32, one F2FP;
// from_float takes about seven instructions a value) wherever none of the
// eight is a NaN: both round to nearest even, subnormals and overflow to
// infinity alike, but the hardware's NaN is the canonical one where
// from_float keeps the payload, so a group holding a NaN takes from_float.
__device__ __forceinline__ void pack_bf16x8(const float (&values)[kChannelsPerThread],
                                            unsigned int (&packed)[kChannelsPerThread / 2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    bool any_nan = false;
#pragma unroll
    for (int i = 0; i < kChannelsPerThread; ++i) any_nan |= values[i] != values[i];
    if (!any_nan) {
#pragma unroll
        for (int w = 0; w < kChannelsPerThread / 2; ++w)  // the first source: the high half
            asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed[w]) : "f"(values[2 * w + 1]), "f"(values[2 * w]));
        return;
    }
#endif
#pragma unroll
    for (int w = 0; w < kChannelsPerThread / 2; ++w)
        packed[w] = raw_bits(from_float<bf16>(values[2 * w])) | raw_bits(from_float<bf16>(values[2 * w + 1])) << 16;
}

template <typename T>
struct IsBf16 {
    static constexpr bool value = false;
};
template <>
struct IsBf16<bf16> {
    static constexpr bool value = true;
};

// Rounds 8 float32 values once to T and stores them, as 16-byte vectors when
// VECTOR; bfloat16 through pack_bf16x8.
template <bool VECTOR, typename T>
__device__ __forceinline__ void store8(T* target, const float (&values)[kChannelsPerThread]) {
    constexpr int kWords = sizeof(T) * kChannelsPerThread / 16;
    constexpr int kPerWord = 4 / sizeof(T) > 0 ? 4 / sizeof(T) : 1;  // elements per 32-bit word
    unsigned int packed[4 * kWords];
    if constexpr (IsBf16<T>::value) {
        pack_bf16x8(values, packed);
    } else if constexpr (VECTOR) {
#pragma unroll
        for (int w = 0; w < 4 * kWords; ++w) {
            unsigned int word = 0;
#pragma unroll
            for (int j = 0; j < kPerWord; ++j)
                word |= raw_bits(from_float<T>(values[w * kPerWord + j])) << (16 * j);
            packed[w] = word;
        }
    }
    if constexpr (VECTOR) {
#pragma unroll
        for (int w = 0; w < kWords; ++w)
            kp_store16(target + w * (16 / sizeof(T)),
                       uint4{packed[4 * w], packed[4 * w + 1], packed[4 * w + 2], packed[4 * w + 3]});
    } else if constexpr (IsBf16<T>::value) {
#pragma unroll
        for (int i = 0; i < kChannelsPerThread; ++i)
            target[i] = bf16{static_cast<unsigned short>(packed[i / 2] >> (16 * (i % 2)))};
    } else {
#pragma unroll
        for (int i = 0; i < kChannelsPerThread; ++i) target[i] = from_float<T>(values[i]);
    }
}

// Stores 8 elements as loaded, bit for bit (a ring stores raw values, so a
// pool closed from it is the pool built in one call); 16-byte words when
// both the row was loaded as words and the target allows them.
template <bool TARGET_VECTOR, typename T, bool SOURCE_VECTOR>
__device__ __forceinline__ void store_raw8(T* target, const Row8<T, SOURCE_VECTOR>& row) {
    if constexpr (TARGET_VECTOR && SOURCE_VECTOR) {
#pragma unroll
        for (int w = 0; w < static_cast<int>(sizeof(row.words) / sizeof(uint4)); ++w)
            kp_store16(target + w * (16 / sizeof(T)), row.words[w]);
    } else if constexpr (SOURCE_VECTOR) {
#pragma unroll
        for (int i = 0; i < kChannelsPerThread; ++i) target[i] = element_from_words<T>(row.words, i);
    } else {
#pragma unroll
        for (int i = 0; i < kChannelsPerThread; ++i) target[i] = row.elements[i];
    }
}

// Copies 8 consecutive elements bit for bit: a load, then store_raw8.
template <bool TARGET_VECTOR, bool SOURCE_VECTOR, typename T>
__device__ __forceinline__ void copy8(T* target, const T* source) {
    Row8<T, SOURCE_VECTOR> row;
    row.load(source);
    store_raw8<TARGET_VECTOR>(target, row);
}

// This thread's group (one pool or one request) and its first channel: a group
// is HEAD_DIM / 8 consecutive threads, several groups fill a block. False for
// threads past the block's last whole group; the launch geometry leaves none,
// but nothing relies on that.
// `block`: the block's place among the blocks that share out the groups
// (blockIdx.x unless a kernel runs two kinds of block).
template <int HEAD_DIM>
__device__ __forceinline__ bool thread_group(long long block, long long* group, int* channel) {
    static_assert(HEAD_DIM > 0 && HEAD_DIM % kChannelsPerThread == 0, "head_dim must be a positive multiple of 8");
    constexpr unsigned int kLanes = HEAD_DIM / kChannelsPerThread;
    const unsigned int groups_per_block = blockDim.x / kLanes;
    *group = block * groups_per_block + static_cast<long long>(threadIdx.x / kLanes);
    *channel = static_cast<int>(threadIdx.x % kLanes) * kChannelsPerThread;
    return threadIdx.x < groups_per_block * kLanes;
}
template <int HEAD_DIM>
__device__ __forceinline__ bool thread_group(long long* group, int* channel) {
    return thread_group<HEAD_DIM>(static_cast<long long>(blockIdx.x), group, channel);
}

// Offsets, lengths, slots and positions arrive as int32, uint32 or int64, a
// template argument of the kernel (IT), so a read is one load of that width,
// widened to a signed 64-bit value.
template <typename IT>
__device__ __forceinline__ long long load_index(const IT* array, long long i) {
    static_assert(sizeof(IT) == 4 || sizeof(IT) == 8, "index arrays are int32, uint32 or int64");
    return static_cast<long long>(array[i]);
}

// A read of an index array in which a negative value means something
// (positions' -1 padding, slots, pool ids): load_index, except that a uint32
// array's all-ones value, the uint32 form of -1, reads as -1. Offsets and
// lengths keep their full uint32 range through load_index. signed_index
// widens an element already loaded the same way.
template <typename IT>
__device__ __forceinline__ long long signed_index(IT element) {
    const long long value = static_cast<long long>(element);
    if constexpr (sizeof(IT) == 4 && static_cast<IT>(-1) > 0) return value == 0xFFFFFFFFLL ? -1 : value;
    return value;
}
template <typename IT>
__device__ __forceinline__ long long load_signed_index(const IT* array, long long i) {
    static_assert(sizeof(IT) == 4 || sizeof(IT) == 8, "index arrays are int32, uint32 or int64");
    return signed_index(array[i]);
}

// The request that owns `item`: the last b in [0, batch) with
// offsets[b] <= item, by binary search (0 when none is). Offsets may be
// garbage when the caller skipped validation: the answer is always in
// [0, batch), and the caller checks the request before using it.
template <typename IT>
__device__ __forceinline__ long long find_request(const IT* offsets, long long batch, long long item) {
    long long lo = 0, hi = batch - 1;  // invariant: the answer is in [lo, hi]
    while (lo < hi) {
        const long long mid = lo + (hi - lo + 1) / 2;
        if (load_index(offsets, mid) <= item)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// The mid that node `node` (heap order: 1 the first step, 2 n + 1 after
// going right from n, 2 n after going left) of find_request's search over
// [lo, hi] reads; false where no search reaches the node (the interval
// above it holds one request or none). Which mid a node reads does not
// depend on the data, so a search's nodes can all be read at once.
// I: the search's index type (long long, or int where the batch fits it).
template <typename I>
__device__ __forceinline__ bool search_node_mid(int node, I lo, I hi, I* mid) {
    int depth = 0;
    while ((node >> (depth + 1)) != 0) ++depth;
    for (int bit = depth - 1; bit >= 0; --bit) {
        if (lo >= hi) return false;
        const I m = lo + (hi - lo + 1) / 2;
        if ((node >> bit) & 1)
            lo = m;
        else
            hi = m - 1;
    }
    *mid = lo + (hi - lo + 1) / 2;
    return lo < hi;
}

// The request's token rows and cached length, checked before any use: false
// when the row range is not inside [0, total_tokens) or the length negative.
// The three reads are independent and issued together.
template <typename IO, typename IC>
__device__ __forceinline__ bool request_rows(const IO* input_row_offsets, const IC* cache_lengths, long long request,
                                             long long total_tokens, long long* row_begin, long long* row_end,
                                             long long* cached) {
    *row_begin = load_index(input_row_offsets, request);
    *row_end = load_index(input_row_offsets, request + 1);
    *cached = load_index(cache_lengths, request);
    return *row_begin >= 0 && *row_end <= total_tokens && *row_begin <= *row_end && *cached >= 0;
}

// Pools a query token sees: (cached + local + 1) / kpool, the positions
// before and at its own, for any cached >= 0 and local >= 0 without
// overflow: a count past 2^63 - 1 (kpool 1 and a garbage length a few
// tokens from it) is 2^63 - 1, every pool there is.
__device__ __forceinline__ long long pools_visible(long long cached, long long local, long long kpool) {
    const long long whole = cached / kpool, rest = (cached % kpool + local + 1) / kpool;
    return whole > 9223372036854775807LL - rest ? 9223372036854775807LL : whole + rest;
}

// The pools `token` sees, 0 where no request's usable rows hold it (the
// scorer's rule: kpool_index_logits.cu). With no request (batch 0) nothing
// of the offsets is read.
template <typename IO, typename IC>
__device__ __forceinline__ long long token_pools_visible(long long token, const IO* input_row_offsets,
                                                         const IC* cache_lengths, long long batch,
                                                         long long num_tokens, long long kpool) {
    if (batch <= 0) return 0;
    const long long request = find_request(input_row_offsets, batch, token);
    long long row_begin, row_end, cached;
    if (!request_rows(input_row_offsets, cache_lengths, request, num_tokens, &row_begin, &row_end, &cached) ||
        token < row_begin || token >= row_end)
        return 0;
    return pools_visible(cached, token - row_begin, kpool);
}

// log2(e) rounded to float32: exp(x) = exp2(x * log2(e)).
constexpr float kLog2e = 1.44269504088896340736f;

// One pooled channel: the softmax over a pool's members, a chunk of members
// at a time. Within a chunk it is two passes over registers: the chunk's
// maximum logit, then each member's weight exp(logit - max) and the sums of
// weights and weighted keys in member order. Across chunks (kpool > 8) the
// running sums are rescaled when a chunk raises the maximum. Every kernel
// feeds members in pool order through this struct, so one pool gives the
// same bits whichever kernel built it.
//
// Policy at the edges (every backend does the same):
// - a logit equal to the maximum weighs exactly 1, so a channel whose logits
//   are all -inf (or all +inf) gets the mean of its members' keys, the limit
//   of equal logits, instead of 0/0;
// - a single +inf logit takes the whole weight;
// - a NaN logit or key makes the channel NaN (fmaxf skips a NaN logit, whose
//   own weight is then exp(NaN) = NaN).
//
// Nothing here branches: the first weight needs the chunk's maximum, so every
// member's gate scores are loaded before the first exp, and the compiler has
// no block boundary to hold loads behind. exp is exp2 of the difference times
// log2(e) (one MUFU.EX2 on the GPU) and the final division a reciprocal and a
// multiply; the README's error bound covers the GPU's approximations
// (ex2.approx: 2 ulp, rcp.approx: 1 ulp) as well as the emulator's correctly
// rounded ones.
struct PoolChannel {
    float max_logit;
    float weight_sum;
    float weighted_keys;

    // The chunk of COUNT members logits[j], keys[j]; FIRST: the pool's first.
    template <int COUNT, bool FIRST>
    __device__ __forceinline__ void add(const float (&logits)[COUNT], const float (&keys)[COUNT]) {
        float chunk_max = logits[0];
#pragma unroll
        for (int j = 1; j < COUNT; ++j) chunk_max = fmaxf(chunk_max, logits[j]);
        const float new_max = FIRST ? chunk_max : fmaxf(max_logit, chunk_max);
        float sum = 0.0f, weighted = 0.0f;
#pragma unroll
        for (int j = 0; j < COUNT; ++j) {
            // exp2 runs unconditionally and the select picks: a conditional
            // call would be a branch (the compiler does not speculate inline
            // assembly), and a branch splits the loads from their uses.
            const float exp_weight = kp_exp2((logits[j] - new_max) * kLog2e);
            const float weight = logits[j] == new_max ? 1.0f : exp_weight;
            // The multiply-add is fused on purpose and spelled out: both
            // compilers build with contraction off, so every kernel and the
            // emulator round it, and only it, once.
            sum = j == 0 ? weight : sum + weight;
            weighted = j == 0 ? weight * keys[j] : fmaf(weight, keys[j], weighted);
        }
        if (FIRST) {
            weight_sum = sum;
            weighted_keys = weighted;
        } else {
            // exp(old max - new max): 1 when the chunk did not raise it.
            const float exp_scale = kp_exp2((max_logit - new_max) * kLog2e);
            const float scale = max_logit == new_max ? 1.0f : exp_scale;
            weight_sum = fmaf(weight_sum, scale, sum);
            weighted_keys = fmaf(weighted_keys, scale, weighted);
        }
        max_logit = new_max;
    }
    // weight_sum is in [1, kpool] (the maximum weighs 1) unless NaN, so the
    // reciprocal neither overflows nor meets a subnormal.
    __device__ __forceinline__ float value() const { return weighted_keys * kp_rcp(weight_sum); }
};

// How many members pool8 loads, per thread, before it uses any. A pool
// whose keys, gate scores and ape rows fit kWholePoolBytes comes in one
// chunk, one memory round trip: up to 7 members of 16-bit keys and gate
// scores (64 bytes each with their ape row), 4 of float32 (96 bytes). A
// larger pool streams in chunks of kStreamBytes (4 or 2 members, at least 128
// bytes of keys and gate scores in flight). Both leave room in the 128
// registers kMaxThreadsPerBlock allows (at 512 bytes, 5 float32 members spill
// in tail update); tests/test_ptx.py checks that no shipped variant spills,
// and kpool_cupy/kernel/geometry.py mirrors the two sizes.
enum : int { kWholePoolBytes = 448, kStreamBytes = 256 };

template <int KPOOL, typename KT, typename GT>
__host__ __device__ constexpr int chunk_members() {
    constexpr int kMemberBytes = kChannelsPerThread * (sizeof(KT) + sizeof(GT) + sizeof(float));
    constexpr int kStream = kStreamBytes / kMemberBytes < 1 ? 1 : kStreamBytes / kMemberBytes;
    return KPOOL * kMemberBytes <= kWholePoolBytes ? KPOOL : kStream;
}

// A chunk of COUNT members; FIRST: it starts the pool.
template <int COUNT, bool FIRST>
struct Chunk {};

// Calls visit(Chunk<COUNT, FIRST>{}, m0) for members 0 .. KPOOL - 1 in chunks
// of CHUNK, in order: the first chunk, a loop of whole ones, a partial last.
// pool8 and the benchmark's baseline kernel share it, so both reduce a pool
// in the same chunks and agree bit for bit.
template <int KPOOL, int CHUNK, typename Visit>
__device__ __forceinline__ void for_each_chunk(Visit visit) {
    static_assert(KPOOL >= 1 && CHUNK >= 1, "kpool and the chunk must be at least 1");
    constexpr int kFirst = KPOOL < CHUNK ? KPOOL : CHUNK;
    constexpr int kRest = (KPOOL - kFirst) % CHUNK;  // the last, partial chunk
    visit(Chunk<kFirst, true>{}, 0);
#pragma unroll 1
    for (int m0 = kFirst; m0 + CHUNK <= KPOOL; m0 += CHUNK) visit(Chunk<CHUNK, false>{}, m0);
    if constexpr (kRest > 0) visit(Chunk<kRest, false>{}, KPOOL - kRest);
}

// Feeds COUNT loaded members (their key, gate and ape rows) to each of the
// thread's channels: logit = gate + ape. FIRST: they start the pool.
template <int COUNT, bool FIRST, typename KeyRow, typename GateRow, typename BiasRow>
__device__ __forceinline__ void add_rows(const KeyRow (&keys)[COUNT], const GateRow (&gates)[COUNT],
                                         const BiasRow (&bias)[COUNT], PoolChannel (&channels)[kChannelsPerThread]) {
#pragma unroll
    for (int c = 0; c < kChannelsPerThread; ++c) {
        float logits[COUNT], values[COUNT];
#pragma unroll
        for (int j = 0; j < COUNT; ++j) {
            logits[j] = gates[j][c] + bias[j][c];
            values[j] = keys[j][c];
        }
        channels[c].template add<COUNT, FIRST>(logits, values);
    }
}

// Loads members m0 .. m0 + COUNT - 1 (keys, gate scores and ape rows), all
// before the first is used, then feeds them to each channel. FIRST: member
// m0 is the pool's first.
template <int COUNT, bool FIRST, typename KT, typename GT, bool KEY_VECTOR, bool GATE_VECTOR, bool APE_VECTOR,
          typename MemberRows>
__device__ __forceinline__ void pool_chunk(int m0, MemberRows member_rows, const float* ape, long long ape_row_stride,
                                           PoolChannel (&channels)[kChannelsPerThread]) {
    Row8<KT, KEY_VECTOR> keys[COUNT];
    Row8<GT, GATE_VECTOR> gates[COUNT];
    Row8<float, APE_VECTOR> bias[COUNT];
    const KT* key_rows[COUNT];
    const GT* gate_rows[COUNT];
#pragma unroll
    for (int j = 0; j < COUNT; ++j) member_rows(m0 + j, &key_rows[j], &gate_rows[j]);
#pragma unroll
    for (int j = 0; j < COUNT; ++j) bias[j].load(ape + (m0 + j) * ape_row_stride);
#pragma unroll
    for (int j = 0; j < COUNT; ++j) keys[j].load(key_rows[j]);
#pragma unroll
    for (int j = 0; j < COUNT; ++j) gates[j].load(gate_rows[j]);
    add_rows<COUNT, FIRST>(keys, gates, bias, channels);
}

// for_each_chunk's visitor in pool8 (a struct: NVRTC compiles no generic
// lambda in device code without --extended-lambda).
template <typename KT, typename GT, bool KEY_VECTOR, bool GATE_VECTOR, bool APE_VECTOR, typename MemberRows>
struct PoolChunks {
    MemberRows& member_rows;
    const float* ape;
    long long ape_row_stride;
    PoolChannel (&channels)[kChannelsPerThread];

    template <int COUNT, bool FIRST>
    __device__ __forceinline__ void operator()(Chunk<COUNT, FIRST>, int m0) const {
        pool_chunk<COUNT, FIRST, KT, GT, KEY_VECTOR, GATE_VECTOR, APE_VECTOR>(m0, member_rows, ape, ape_row_stride,
                                                                               channels);
    }
};

// pool8's reduction, its channels' softmax state kept (the backward pass
// needs each channel's maximum and weight sum as well as its value).
template <int KPOOL, typename KT, typename GT, bool KEY_VECTOR, bool GATE_VECTOR, bool APE_VECTOR,
          typename MemberRows>
__device__ __forceinline__ void pool_channels8(MemberRows member_rows, const float* ape, long long ape_row_stride,
                                               PoolChannel (&channels)[kChannelsPerThread]) {
    for_each_chunk<KPOOL, chunk_members<KPOOL, KT, GT>()>(
        PoolChunks<KT, GT, KEY_VECTOR, GATE_VECTOR, APE_VECTOR, MemberRows>{member_rows, ape, ape_row_stride, channels});
}

// Reduces one pool over this thread's 8 channels: members m = 0 .. KPOOL - 1
// in order, member m's key and gate rows (this thread's 8 channels) from
// member_rows(m, &key_row, &gate_row), its ape row at ape + m * ape_row_stride.
// Every kernel pools through here, so a pool is the same bits whichever
// kernel builds it.
template <int KPOOL, typename KT, typename GT, bool KEY_VECTOR, bool GATE_VECTOR, bool APE_VECTOR,
          typename MemberRows>
__device__ __forceinline__ void pool8(MemberRows member_rows, const float* ape, long long ape_row_stride,
                                      float (&result)[kChannelsPerThread]) {
    PoolChannel channels[kChannelsPerThread];
    pool_channels8<KPOOL, KT, GT, KEY_VECTOR, GATE_VECTOR, APE_VECTOR>(member_rows, ape, ape_row_stride, channels);
#pragma unroll
    for (int c = 0; c < kChannelsPerThread; ++c) result[c] = channels[c].value();
}

// A divisor d (1 <= d <= 2^31) with what turns a division by it into a
// multiply and a shift, worked out once a block: for every n < 2^31,
// floor(n / d) = floor(n m / 2^p), where l = ceil(log2 d), p = 31 + l and
// m = ceil(2^p / d) (below 2^32: d > 2^(l - 1)). Why it is exact: m d = 2^p +
// e with 0 <= e < d <= 2^l, so n m / 2^p = n / d + n e / (d 2^p), and
// n e < 2^(31 + l) = 2^p keeps the second term below 1 / d, which the first's
// fraction (at most (d - 1) / d) cannot pass 1 with. Pool ids below a reach
// (at most 2^31 - 1), a row's columns and an int32 position are such n.
struct Divisor {
    unsigned int size;        // d
    unsigned int multiplier;  // m (p follows from d: two registers live, not three)

    __device__ __forceinline__ unsigned int quotient(unsigned int n) const {
        const int shift = 63 - __clz(static_cast<int>(size - 1u));  // p = 31 + l; d = 1: clz(0) = 32
        return static_cast<unsigned int>(static_cast<unsigned long long>(n) * multiplier >> shift);
    }
};

// A power of two d = 2^l (the engines' page sizes and kpool 4) has m = 2^31
// exactly, with no division: the 64-bit one below is a subroutine call of
// some 70 instructions a thread, which a block that writes one row span
// (kpool_expand_topk) would pay in full.
__device__ __forceinline__ Divisor divisor_of(unsigned int d) {
    if ((d & (d - 1u)) == 0u) return Divisor{d, 0x80000000u};
    const unsigned int l = static_cast<unsigned int>(32 - __clz(static_cast<int>(d - 1u)));
    return Divisor{d, static_cast<unsigned int>(((1ull << (31u + l)) + d - 1ull) / d)};
}

}  // namespace kp

#endif  // KPOOL_COMMON_CUH
