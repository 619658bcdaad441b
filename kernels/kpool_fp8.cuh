// The FP8 epilogue every writer of an FP8 cache shares, and the query side
// with it (issue 12): a row of D = 8 * LANES float32 values, 8 per thread,
// across a group of LANES consecutive lanes of one warp.
//
//     y = bf16( B(x) * fl32(1/sqrt(D)) )        B: butterflies (a+b, a-b) at strides 1, 2, ..., D/2
//     v = fl32( max(max_c |y_c|, 1e-4) * fl32(1/448) )
//     s = the smallest power of two >= v        (ROUND_SCALE; else s = v)
//     q = e4m3fn( clamp( fl32(y / s), -448, 448 ) )
//
// Strides 1, 2 and 4 stay in a thread's registers; strides 8 .. D/2 pair a
// thread with lane ^ (stride / 8) through __shfl_xor_sync, as does the row's
// maximum. Every float32 operation flushes subnormals, as the build does
// (-ftz=true; the emulator sets the host's flush-to-zero to match), so the
// bytes equal kpool_cupy/backends/reference_epilogue.py's.
//
// Every lane of the warp must reach fp8_epilogue (the shuffles name the whole
// warp): a kernel keeps its surplus threads alive and opens with
// KP_THREADS_COOPERATE(true) for the emulator.
#ifndef KPOOL_FP8_CUH
#define KPOOL_FP8_CUH

#include "kpool_common.cuh"

namespace kp {

// The e4m3fn byte of a float32, rounded to nearest even after clamping to
// [-448, 448]; NaN gives 0x7f whatever its sign, -0 gives 0x80. Integer
// operations only, so the GPU and the host round alike.
__device__ __forceinline__ unsigned int e4m3fn_bits(float value) {
    const unsigned int bits = kp_float_to_bits(value);
    const unsigned int sign = (bits >> 24) & 0x80u;
    const unsigned int magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return 0x7fu;          // NaN
    if (magnitude >= 0x43e00000u) return sign | 0x7eu;  // 448 and above (inf too): the largest finite
    if (magnitude >= 0x3c800000u) {                     // 2^-6 and above: a normal e4m3
        // Keep 3 of the 23 mantissa bits, ties to even, then rebias 127 -> 7.
        const unsigned int rounded = (magnitude + 0x7ffffu + ((magnitude >> 20) & 1u)) >> 20;
        return sign | (rounded - (120u << 3));
    }
    // Below 2^-6: multiples of 2^-9 (code 8 is 2^-6 itself, the first normal).
    const int exponent = static_cast<int>(magnitude >> 23) - 127;
    const int shift = 14 - exponent;  // significand (24 bits) * 2^(exponent - 23) * 2^9
    if (magnitude == 0u || shift > 25) return sign;
    const unsigned int significand = (magnitude & 0x7fffffu) | 0x800000u;
    unsigned int code = significand >> shift;
    const unsigned int remainder = significand & ((1u << shift) - 1u);
    const unsigned int half = 1u << (shift - 1);
    if (remainder > half || (remainder == half && (code & 1u))) ++code;
    return sign | code;
}

// The smallest power of two >= v, for a positive normal v: from the bits, so
// a power of two stays itself and nothing is rounded through log2 or exp2.
__device__ __forceinline__ float ue8m0(float v) {
    const unsigned int bits = kp_float_to_bits(v);
    return kp_bits_to_float((bits & 0x7fffffu) ? (bits & 0xff800000u) + 0x800000u : bits);
}

// fl32(1/sqrt(D)) for D a power of two: 2^(-k/2), times fl32(1/sqrt(2)) for
// odd k (a power-of-two scaling of the nearest float32 is the nearest float32).
template <int D>
__host__ __device__ constexpr float inverse_sqrt() {
    static_assert(D >= 1 && (D & (D - 1)) == 0, "the rotation needs a power-of-two head_dim");
    float scale = 1.0f;
    int k = 0;
    for (int d = D; d > 1; d >>= 1) ++k;
    for (int i = 0; i < k / 2; ++i) scale *= 0.5f;
    return (k % 2) ? scale * 0.70710677f : scale;  // 0x3f3504f3, the float32 nearest 1/sqrt(2)
}

// One row's epilogue: v holds this thread's 8 values (channels 8 * lane ..
// 8 * lane + 7, x already in the dtype the caller rounds to), lane is the
// thread's place in its group of LANES. Writes the 8 e4m3fn bytes to q and
// returns the row's scale (every lane of the group gets it).
template <int LANES, bool ROUND_SCALE>
__device__ __forceinline__ float fp8_epilogue(float (&v)[kChannelsPerThread], int lane,
                                              unsigned char (&q)[kChannelsPerThread]) {
    static_assert(LANES >= 1 && LANES <= 32 && (LANES & (LANES - 1)) == 0,
                  "a row's lanes: a power of two within one warp (head_dim 8 to 256)");
    constexpr unsigned int kWarp = 0xffffffffu;
#pragma unroll
    for (int stride = 1; stride < kChannelsPerThread; stride *= 2)
#pragma unroll
        for (int i = 0; i < kChannelsPerThread; ++i)
            if ((i & stride) == 0) {
                const float a = v[i], b = v[i + stride];
                v[i] = a + b;
                v[i + stride] = a - b;
            }
#pragma unroll
    for (int lanes = 1; lanes < LANES; lanes *= 2) {
        const bool low = (lane & lanes) == 0;  // this thread holds a (the a+b half), its partner b
#pragma unroll
        for (int i = 0; i < kChannelsPerThread; ++i) {
            const float partner = __shfl_xor_sync(kWarp, v[i], lanes, LANES);
            v[i] = low ? v[i] + partner : partner - v[i];
        }
    }
    constexpr float kScale = inverse_sqrt<LANES * kChannelsPerThread>();
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kChannelsPerThread; ++i) {
        v[i] = to_float(from_float<bf16>(v[i] * kScale));
        amax = fmaxf(amax, fabsf(v[i]));  // fmaxf skips a NaN, as the reference's row maximum does
    }
#pragma unroll
    for (int lanes = 1; lanes < LANES; lanes *= 2) amax = fmaxf(amax, __shfl_xor_sync(kWarp, amax, lanes, LANES));
    const float bound = fmaxf(amax, 1e-4f) * (1.0f / 448.0f);
    const float scale = ROUND_SCALE ? ue8m0(bound) : bound;
#pragma unroll
    for (int i = 0; i < kChannelsPerThread; ++i)
        q[i] = static_cast<unsigned char>(e4m3fn_bits(kp_div_rn(v[i], scale)));
    return scale;
}

}  // namespace kp

#endif  // KPOOL_FP8_CUH
