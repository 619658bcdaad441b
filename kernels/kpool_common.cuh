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

// The codes a launcher passes, mirrored in kpool_cupy/kernel/codes.py (a test
// reads this header and compares).
//
// IndexKind: the element type of an offsets, lengths or ids array.
enum IndexKind : int { kIndexInt32 = 0, kIndexUint32 = 1, kIndexInt64 = 2 };
// VectorAccess: bits of a kernel's vector_mask, one per operand whose rows
// the launcher found 16-byte aligned (base address and every stepped stride).
enum VectorAccess : int { kVectorK = 1, kVectorGate = 2, kVectorApe = 4, kVectorOut = 8, kVectorTail = 16 };

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

// Loads 8 consecutive elements as float32: 16-byte vectors when `vector` (the
// launcher has checked the address and row stride are 16-byte aligned),
// element by element otherwise.
template <typename T>
__device__ __forceinline__ void load8(const T* source, bool vector, float (&values)[kChannelsPerThread]) {
    constexpr int kWords = sizeof(T) * kChannelsPerThread / 16;
    if (vector) {
        uint4 words[kWords];
#pragma unroll
        for (int w = 0; w < kWords; ++w) words[w] = kp_load16(source + w * (16 / sizeof(T)));
#pragma unroll
        for (int i = 0; i < kChannelsPerThread; ++i) values[i] = to_float(element_from_words<T>(words, i));
    } else {
#pragma unroll
        for (int i = 0; i < kChannelsPerThread; ++i) values[i] = to_float(source[i]);
    }
}

// Rounds 8 float32 values once to T and stores them, as 16-byte vectors when
// `vector`.
template <typename T>
__device__ __forceinline__ void store8(T* target, bool vector, const float (&values)[kChannelsPerThread]) {
    if (vector) {
        constexpr int kWords = sizeof(T) * kChannelsPerThread / 16;
        constexpr int kPerWord = 4 / sizeof(T) > 0 ? 4 / sizeof(T) : 1;  // elements per 32-bit word
        unsigned int packed[4 * kWords];
#pragma unroll
        for (int w = 0; w < 4 * kWords; ++w) {
            unsigned int word = 0;
#pragma unroll
            for (int j = 0; j < kPerWord; ++j)
                word |= raw_bits(from_float<T>(values[w * kPerWord + j])) << (16 * j);
            packed[w] = word;
        }
#pragma unroll
        for (int w = 0; w < kWords; ++w)
            kp_store16(target + w * (16 / sizeof(T)),
                       uint4{packed[4 * w], packed[4 * w + 1], packed[4 * w + 2], packed[4 * w + 3]});
    } else {
#pragma unroll
        for (int i = 0; i < kChannelsPerThread; ++i) target[i] = from_float<T>(values[i]);
    }
}

// Copies 8 consecutive elements bit for bit (a ring stores raw values, so a
// pool closed from it is the pool built in one call).
template <typename T>
__device__ __forceinline__ void copy8(T* target, bool target_vector, const T* source, bool source_vector) {
    constexpr int kWords = sizeof(T) * kChannelsPerThread / 16;
    if (target_vector && source_vector) {
#pragma unroll
        for (int w = 0; w < kWords; ++w)
            kp_store16(target + w * (16 / sizeof(T)), kp_load16(source + w * (16 / sizeof(T))));
    } else {
#pragma unroll
        for (int i = 0; i < kChannelsPerThread; ++i) target[i] = source[i];
    }
}

// This thread's group (one pool or one request) and its first channel: a group
// is HEAD_DIM / 8 consecutive threads, several groups fill a block. False for
// threads past the block's last whole group; the launch geometry leaves none,
// but nothing relies on that.
template <int HEAD_DIM>
__device__ __forceinline__ bool thread_group(long long* group, int* channel) {
    static_assert(HEAD_DIM > 0 && HEAD_DIM % kChannelsPerThread == 0, "head_dim must be a positive multiple of 8");
    constexpr unsigned int kLanes = HEAD_DIM / kChannelsPerThread;
    const unsigned int groups_per_block = blockDim.x / kLanes;
    *group = static_cast<long long>(blockIdx.x) * groups_per_block + static_cast<long long>(threadIdx.x / kLanes);
    *channel = static_cast<int>(threadIdx.x % kLanes) * kChannelsPerThread;
    return threadIdx.x < groups_per_block * kLanes;
}

// Offsets and lengths arrive as int32, uint32 or int64; `kind` says which
// and every read widens to a signed 64-bit value.
__device__ __forceinline__ long long load_index(const void* array, int kind, long long i) {
    if (kind == kIndexInt32) return static_cast<const int*>(array)[i];
    if (kind == kIndexUint32) return static_cast<const unsigned int*>(array)[i];
    return static_cast<const long long*>(array)[i];
}

// The request that owns `item`: the last b in [0, batch) with
// offsets[b] <= item, by binary search (0 when none is). Offsets may be
// garbage when the caller skipped validation: the answer is always in
// [0, batch), and the caller checks the request before using it.
__device__ __forceinline__ long long find_request(const void* offsets, int kind, long long batch, long long item) {
    long long lo = 0, hi = batch - 1;  // invariant: the answer is in [lo, hi]
    while (lo < hi) {
        const long long mid = lo + (hi - lo + 1) / 2;
        if (load_index(offsets, kind, mid) <= item)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// The request's token rows and cached length, checked before any use: false
// when the row range is not inside [0, total_tokens) or the length negative.
__device__ __forceinline__ bool request_rows(const void* input_row_offsets, int input_kind, const void* cache_lengths,
                                             int cache_kind, long long request, long long total_tokens,
                                             long long* row_begin, long long* row_end, long long* cached) {
    *row_begin = load_index(input_row_offsets, input_kind, request);
    *row_end = load_index(input_row_offsets, input_kind, request + 1);
    *cached = load_index(cache_lengths, cache_kind, request);
    return *row_begin >= 0 && *row_end <= total_tokens && *row_begin <= *row_end && *cached >= 0;
}

// One pooled channel as a streaming softmax over the members in order: the
// running maximum, the sum of weights relative to it, and the weighted sum of
// keys. Each member costs one exp, kpool needs no registers, and a member is
// read once. Every kernel feeds members in pool order through this struct, so
// one pool gives the same bits whichever kernel built it.
//
// Policy at the edges (every backend does the same):
// - a logit equal to the running maximum weighs exactly 1, so a channel whose
//   logits are all -inf (or all +inf) gets the mean of its members' keys, the
//   limit of equal logits, instead of 0/0;
// - a single +inf logit takes the whole weight;
// - a NaN logit or key makes the channel NaN.
struct PoolChannel {
    float max_logit;
    float weight_sum;
    float weighted_keys;

    __device__ __forceinline__ void first(float logit, float key) {
        max_logit = logit;
        // A NaN logit carries into the weight sum even when no member follows
        // (kpool 1), where nothing else would read it.
        weight_sum = logit != logit ? logit : 1.0f;
        weighted_keys = key;
    }
    __device__ __forceinline__ void push(float logit, float key) {
        const float delta = logit - max_logit;
        // exp(-|delta|) is the new member's weight when it is not above the
        // maximum and the rescale of what came before when it is.
        const float e = logit == max_logit ? 1.0f : expf(-fabsf(delta));
        // The multiply-adds are fused on purpose and spelled out: both
        // compilers build with contraction off, so every kernel and the
        // emulator round these, and only these, once.
        if (delta > 0.0f) {
            weight_sum = fmaf(weight_sum, e, 1.0f);
            weighted_keys = fmaf(weighted_keys, e, key);
            max_logit = logit;
        } else {
            weight_sum = weight_sum + e;
            weighted_keys = fmaf(e, key, weighted_keys);
        }
    }
    __device__ __forceinline__ float value() const { return weighted_keys / weight_sum; }
};

// Reduces one pool over this thread's 8 channels: members m = 0 .. KPOOL - 1
// in order, member m's keys and gate scores from load_member(m, keys, logits),
// its ape row at ape + m * ape_row_stride. Every kernel pools through here,
// so a pool is the same bits whichever kernel builds it.
//
// Small pools unroll fully so all member loads are in flight at once; large
// ones stream with a bounded unroll to keep registers in check.
template <int KPOOL, typename LoadMember>
__device__ __forceinline__ void pool8(LoadMember load_member, const float* ape, long long ape_row_stride,
                                      bool ape_vector, float (&result)[kChannelsPerThread]) {
    float keys[kChannelsPerThread], logits[kChannelsPerThread], bias[kChannelsPerThread];
    PoolChannel channels[kChannelsPerThread];
    load_member(0, keys, logits);
    load8(ape, ape_vector, bias);
#pragma unroll
    for (int c = 0; c < kChannelsPerThread; ++c) channels[c].first(logits[c] + bias[c], keys[c]);
#pragma unroll(KPOOL <= 8 ? KPOOL : 4)
    for (int m = 1; m < KPOOL; ++m) {
        load_member(m, keys, logits);
        load8(ape + m * ape_row_stride, ape_vector, bias);
#pragma unroll
        for (int c = 0; c < kChannelsPerThread; ++c) channels[c].push(logits[c] + bias[c], keys[c]);
    }
#pragma unroll
    for (int c = 0; c < kChannelsPerThread; ++c) result[c] = channels[c].value();
}

}  // namespace kp

#endif  // KPOOL_COMMON_CUH
