// The warp-level matrix instructions the kernels use, on the host: mma.sync
// m16n8k32 with e4m3 inputs and m16n8k16 with f16 inputs, both accumulating
// into float32. Host builds only; kpool_emulator.h includes it.
//
// A warp's 32 lanes each hold a fragment of A, B and C; the instruction is a
// warp-wide collective (kpool_fibers.h): once every lane has arrived, the
// matrices are put together from the fragments by the layouts of the PTX ISA
// ("Matrix Fragments for mma.m16n8k32" and "... mma.m16n8k16 with floating
// point type"), D = A B + C is computed, and each lane gets its fragment of D.
// With groupID g = lane / 4 and t = lane % 4:
//
//   m16n8k32 e4m3   A [16 x 32]: byte j of register r is A[g + 8 (r % 2)][4 t + (j) + 16 (r / 2)]
//                   B [32 x 8]:  byte j of register r is B[4 t + j + 16 r][g]
//   m16n8k16 f16    A [16 x 16]: half j of register r is A[g + 8 (r % 2)][2 t + j + 8 (r / 2)]
//                   B [16 x 8]:  half j of register r is B[2 t + j + 8 r][g]
//   C and D [16 x 8] (both):     element i is C[g + 8 (i / 2)][2 t + i % 2]
//
// Each product of two e4m3 (or two f16) values is exact in float32; the
// emulator adds them to C one after another in k order, in float32 with
// the launch's flush-to-zero. The tensor cores' own order and internal width
// are undocumented (narrower than float32 for FP8 on Hopper by public
// measurements), so results agree with a GPU within a bound, not bit for bit.
#ifndef KPOOL_MMA_H
#define KPOOL_MMA_H

#include <cmath>
#include <cstring>

#include "kpool_fibers.h"

// The value of an e4m3fn byte: sign, 4 exponent bits (bias 7), 3 mantissa
// bits; exponent 0 is subnormal (m * 2^-9); 0x7f and 0xff are NaN; no inf.
inline float kp_e4m3_value(unsigned int byte) {
    const unsigned int magnitude = byte & 0x7fu;
    const float sign = (byte & 0x80u) ? -1.0f : 1.0f;
    if (magnitude == 0x7fu) return std::nanf("");
    const unsigned int exponent = magnitude >> 3, mantissa = magnitude & 7u;
    const float value = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                      : std::ldexp(static_cast<float>(8u + mantissa), static_cast<int>(exponent) - 10);
    return sign * value;
}

// The value of an IEEE half's bits (subnormals included, exactly).
inline float kp_f16_value(unsigned int half) {
    const unsigned int exponent = (half >> 10) & 0x1fu, mantissa = half & 0x3ffu;
    const float sign = (half & 0x8000u) ? -1.0f : 1.0f;
    if (exponent == 0x1fu) return mantissa ? std::nanf("") : sign * INFINITY;
    const float value = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -24)
                                      : std::ldexp(static_cast<float>(1024u + mantissa), static_cast<int>(exponent) - 25);
    return sign * value;
}

struct KpMmaLane {
    const unsigned int* a;  // 4 registers
    const unsigned int* b;  // 2 registers
    const float* c;         // 4 accumulators
    float* d;               // 4 results (may be c)
};

// D = A B + C for one warp, from the lanes' fragments. K is 32 (e4m3 bytes)
// or 16 (f16 halves); E the elements a 32-bit register holds (4 or 2).
template <int K, int E, float (*VALUE)(unsigned int)>
inline void kp_mma_compute(void* const* lanes) {
    float a[16][K], b[K][8], c[16][8];
    constexpr int bits = 32 / E;
    for (int lane = 0; lane < 32; ++lane) {
        const KpMmaLane& l = *static_cast<const KpMmaLane*>(lanes[lane]);
        const int g = lane / 4, t = lane % 4;
        for (int r = 0; r < 4; ++r)
            for (int j = 0; j < E; ++j) {
#ifdef KP_MMA_MISPLACED_LANE
                // Tests only: this lane's A elements land in reversed k order, a wrong layout the tests must see.
                const int k = E * t + (lane == KP_MMA_MISPLACED_LANE ? E - 1 - j : j) + (K / 2) * (r / 2);
#else
                const int k = E * t + j + (K / 2) * (r / 2);
#endif
                a[g + 8 * (r % 2)][k] = VALUE((l.a[r] >> (bits * j)) & ((1u << bits) - 1u));
            }
        for (int r = 0; r < 2; ++r)
            for (int j = 0; j < E; ++j) b[E * t + j + (K / 2) * r][g] = VALUE((l.b[r] >> (bits * j)) & ((1u << bits) - 1u));
        for (int i = 0; i < 4; ++i) c[g + 8 * (i / 2)][2 * t + i % 2] = l.c[i];
    }
    for (int lane = 0; lane < 32; ++lane) {
        const KpMmaLane& l = *static_cast<const KpMmaLane*>(lanes[lane]);
        const int g = lane / 4, t = lane % 4;
        for (int i = 0; i < 4; ++i) {
            const int row = g + 8 * (i / 2), column = 2 * t + i % 2;
            float sum = c[row][column];
            for (int k = 0; k < K; ++k) sum += a[row][k] * b[k][column];  // each product exact
            l.d[i] = sum;
        }
    }
}

// One mma.sync as a warp-wide collective: every lane's fragments in, D out.
template <int K, int E, float (*VALUE)(unsigned int)>
inline void kp_mma_run(const char* name, float (&d)[4], const unsigned int (&a)[4], const unsigned int (&b)[2],
                       const float (&c)[4], const char* file, int line) {
    float result[4];
    KpMmaLane lane{a, b, c, result};
    kp_warp_collective(name, &kp_mma_compute<K, E, VALUE>, &lane, file, line);
    std::memcpy(d, result, sizeof result);
}

inline void kp_mma_e4m3_m16n8k32(float (&d)[4], const unsigned int (&a)[4], const unsigned int (&b)[2],
                                 const float (&c)[4], const char* file = __builtin_FILE(),
                                 int line = __builtin_LINE()) {
    kp_mma_run<32, 4, kp_e4m3_value>("mma.sync.m16n8k32.e4m3", d, a, b, c, file, line);
}

inline void kp_mma_f16_m16n8k16(float (&d)[4], const unsigned int (&a)[4], const unsigned int (&b)[2],
                                const float (&c)[4], const char* file = __builtin_FILE(),
                                int line = __builtin_LINE()) {
    kp_mma_run<16, 2, kp_f16_value>("mma.sync.m16n8k16.f16", d, a, b, c, file, line);
}

#endif  // KPOOL_MMA_H
