// The FP8 epilogue every writer of an FP8 cache shares, and the query side
// with it: a row of D = 8 * LANES float32 values, 8 per thread,
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
// Every lane of a warp must reach the rotation and the quantization together
// or have left the kernel (their shuffles name the whole warp, kp::kWarpLanes);
// a kernel that calls them opens with KP_THREADS_COOPERATE(true) for the
// emulator.
#ifndef KPOOL_FP8_CUH
#define KPOOL_FP8_CUH

#include "kpool_common.cuh"

namespace kp {

// The e4m3fn byte of a float32, rounded to nearest even after clamping to
// [-448, 448]; NaN gives 0x7f whatever its sign, -0 gives 0x80. Every case
// is computed and one is selected: no branch per value. The value is never
// a float32 subnormal (the build flushes them; the emulator too).
__device__ __forceinline__ unsigned int e4m3fn_bits(float value) {
    const unsigned int bits = kp_float_to_bits(value);
    const unsigned int sign = (bits >> 24) & 0x80u;
    const unsigned int magnitude = bits & 0x7fffffffu;
    // 2^-6 and above, a normal e4m3: keep 3 of the 23 mantissa bits, ties to
    // even, then rebias 127 -> 7.
    const unsigned int normal = ((magnitude + 0x7ffffu + ((magnitude >> 20) & 1u)) >> 20) - (120u << 3);
    // Below 2^-6, multiples of 2^-9: |value| * 2^9 is exact (a power-of-two
    // scaling of a normal float32 below 2^-6 stays below 8), and its nearest
    // integer, ties to even, is the code (8 for 2^-6 itself, the first normal).
    // Larger values are capped first, so the conversion never overflows.
    const float below = fminf(kp_bits_to_float(magnitude), 0.015625f);
    const unsigned int small = static_cast<unsigned int>(kp_round_to_int(below * 512.0f));
    const unsigned int code = magnitude >= 0x43e00000u ? 0x7eu  // 448 and above (inf too): the largest finite
                              : magnitude >= 0x3c800000u ? normal
                                                         : small;
    return magnitude > 0x7f800000u ? 0x7fu : sign | code;  // NaN: 0x7f
}

// Four values' e4m3fn bytes, a's in the low byte, by e4m3fn_bits's rule. On
// sm_89 and newer the hardware converts two at a time
// (cvt.rn.satfinite.e4m3x2.f32, one F2FP where e4m3fn_bits takes about 20
// instructions): to nearest even, e4m3's subnormals included, and finite
// values past 448 and infinities to +-448 (satfinite), as the rule says.
// The PTX ISA gives a NaN for a NaN without saying which of e4m3's two (0x7f,
// 0xff); the rule's is 0x7f, so a NaN byte's sign bit is cleared (a byte
// whose low seven bits are all ones is a NaN: satfinite makes no other). The
// emulator and older GPUs run e4m3fn_bits; tests/test_gpu_fp8.py holds the
// hardware's bytes to the reference's on every rounding edge.
__device__ __forceinline__ unsigned int e4m3x4_bits(float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    unsigned short low, high;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(low) : "f"(b), "f"(a));  // the first source: high byte
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(high) : "f"(d), "f"(c));
    const unsigned int word = static_cast<unsigned int>(low) | (static_cast<unsigned int>(high) << 16);
    const unsigned int nan = ((word & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;  // a NaN byte's bit 7, no carry
    return word & ~nan;
#else
    return e4m3fn_bits(a) | (e4m3fn_bits(b) << 8) | (e4m3fn_bits(c) << 16) | (e4m3fn_bits(d) << 24);
#endif
}

// The smallest power of two >= v, for a positive normal v: from the bits, so
// a power of two stays itself and nothing is rounded through log2 or exp2.
__device__ __forceinline__ float ue8m0(float v) {
    const unsigned int bits = kp_float_to_bits(v);
    return kp_bits_to_float((bits & 0x7fffffu) ? (bits & 0xff800000u) + 0x800000u : bits);
}

// 1 / s for s = 2^e a normal power of two, from the bits (exact: 2^-e is a
// normal float32 for e in [-126, 126], and ue8m0's scales lie in
// [2^-22, 2^120]); 0 for s = inf, as 1 / inf.
__device__ __forceinline__ float inverse_power_of_two(float s) {
    const unsigned int bits = kp_float_to_bits(s);
    return bits >= 0x7f800000u ? 0.0f : kp_bits_to_float(0x7f000000u - bits);
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

// The mask every shuffle of the epilogue names: the whole warp, known at
// compile time. A row's group of LANES lanes exchanges values within its own
// segment of the warp (the shuffles' width), never with another group, so
// the warp's groups only have to meet: each lane of the warp either reaches
// each shuffle with the others or has left the kernel (CUDA waits for the
// non-exited lanes a mask names). Every caller keeps to that: a group with
// no row to write leaves the kernel before the epilogue, and the decode
// step, whose groups close pools at different steps, runs the epilogue at
// every step where any lane of the warp closes one (kp::tail_update_steps).
// A run-time mask of the group alone would cost every shuffle a check that
// the named lanes have converged and a divergent fallback.
constexpr unsigned int kWarpLanes = 0xffffffffu;

template <int LANES>
__device__ __forceinline__ void check_row_lanes() {
    static_assert(LANES >= 1 && LANES <= 32 && (LANES & (LANES - 1)) == 0,
                  "a row's lanes: a power of two within one warp (head_dim 8 to 256)");
}

// The rotation of one row before its rounding: v holds this thread's 8
// values (channels 8 * lane .. 8 * lane + 7, x already in the dtype the
// caller rounds to) and becomes B(x) * fl32(1/sqrt(D)) in float32; the
// caller rounds it to bfloat16 (hadamard_rotate, or the FP8 epilogue's
// round_to_bf16). A lane adds its partner's value or takes its own from
// the partner's in one fused multiply-add by +-1 (below head_dim 256):
// sign * v is exact, so the one rounding is the sum's, as a + b and a - b
// round. Every lane of the group must call it together.
template <int LANES>
__device__ __forceinline__ void hadamard_butterflies(float (&v)[kChannelsPerThread], int lane) {
    check_row_lanes<LANES>();
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
        // This thread holds a (it keeps a + b) or b (it keeps a - b = -b + a), its partner the other.
        const bool low = (lane & lanes) == 0;
        const float sign = low ? 1.0f : -1.0f;
#pragma unroll
        for (int i = 0; i < kChannelsPerThread; ++i) {
            const float partner = __shfl_xor_sync(kWarpLanes, v[i], lanes, LANES);
            // A whole warp's row (head_dim 256) keeps the add or subtract: ptxas holds each stage's sign in a
            // register for the whole kernel, five of them, and the decode step at kpool 7 would spill.
            v[i] = LANES < 32 ? fmaf(sign, v[i], partner) : (low ? v[i] + partner : partner - v[i]);
        }
    }
    constexpr float kScale = inverse_sqrt<LANES * kChannelsPerThread>();
#pragma unroll
    for (int i = 0; i < kChannelsPerThread; ++i) v[i] *= kScale;
}

// The rotation of one row, rounded: v becomes y = bf16(B(x) *
// fl32(1/sqrt(D))), as float32, rounded by from_float<bf16> everywhere (a
// rotated row that is stored; a NaN's payload is no backend's contract).
// Every lane of the group must call it together.
template <int LANES>
__device__ __forceinline__ void hadamard_rotate(float (&v)[kChannelsPerThread], int lane) {
    hadamard_butterflies<LANES>(v, lane);
#pragma unroll
    for (int i = 0; i < kChannelsPerThread; ++i) v[i] = to_float(from_float<bf16>(v[i]));
}

// v rounded to bfloat16, to nearest even, as float32, for a row that is only
// quantized: on the GPU the hardware's conversion, two values at a time
// (cvt.rn.bf16x2.f32, sm_80 and newer), whose NaN is the canonical one where
// from_float<bf16> keeps the payload; a quantized NaN is 0x7f either way,
// and the row's maximum skips it. Finite values round alike: v is the
// result of the build's float32 arithmetic, never subnormal (it flushes).
__device__ __forceinline__ void round_to_bf16(float (&v)[kChannelsPerThread]) {
#pragma unroll
    for (int i = 0; i < kChannelsPerThread; i += 2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        unsigned int pair;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pair) : "f"(v[i + 1]), "f"(v[i]));  // the first source: high half
        v[i] = kp_bits_to_float(pair << 16);
        v[i + 1] = kp_bits_to_float(pair & 0xffff0000u);
#else
        v[i] = to_float(from_float<bf16>(v[i]));
        v[i + 1] = to_float(from_float<bf16>(v[i + 1]));
#endif
    }
}

// A thread's 8 e4m3fn bytes as two words, channel i's byte at bits 8 (i % 4)
// of word i / 4 (the order they sit in memory).
using Fp8Bytes = unsigned int[kChannelsPerThread / 4];

// The quantization of one rotated row y (this thread's 8 values in v): the
// row's scale s (every lane of the group gets it) and this thread's 8 e4m3fn
// bytes in q. ROUND_SCALE: s is the power of two ue8m0 gives, else v itself;
// a template argument, so a kernel carries one of the two paths.
template <int LANES, bool ROUND_SCALE>
__device__ __forceinline__ float fp8_quantize(const float (&v)[kChannelsPerThread], Fp8Bytes& q) {
    check_row_lanes<LANES>();
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kChannelsPerThread; ++i)
        amax = fmaxf(amax, fabsf(v[i]));  // fmaxf skips a NaN, as the reference's row maximum does
#pragma unroll
    for (int lanes = 1; lanes < LANES; lanes *= 2) amax = fmaxf(amax, __shfl_xor_sync(kWarpLanes, amax, lanes, LANES));
    const float bound = fmaxf(amax, 1e-4f) * (1.0f / 448.0f);
    if constexpr (ROUND_SCALE) {
        // y / s with s a power of two in [2^-22, 2^120] (or inf): y times
        // 2^-e is the same float32, rounding and flushing included, and a
        // multiply where IEEE division costs a subroutine's worth per value.
        const float scale = ue8m0(bound);
        const float inverse = inverse_power_of_two(scale);
#pragma unroll
        for (int w = 0; w < kChannelsPerThread / 4; ++w)
            q[w] = e4m3x4_bits(v[4 * w] * inverse, v[4 * w + 1] * inverse, v[4 * w + 2] * inverse,
                               v[4 * w + 3] * inverse);
        return scale;
    } else {
#pragma unroll
        for (int w = 0; w < kChannelsPerThread / 4; ++w)
            q[w] = e4m3x4_bits(kp_div_rn(v[4 * w], bound), kp_div_rn(v[4 * w + 1], bound),
                               kp_div_rn(v[4 * w + 2], bound), kp_div_rn(v[4 * w + 3], bound));
        return bound;
    }
}

// One row's whole epilogue, rotation then quantization: v (x) is consumed,
// q gets this thread's bytes, and the row's scale is returned.
template <int LANES, bool ROUND_SCALE>
__device__ __forceinline__ float fp8_epilogue(float (&v)[kChannelsPerThread], int lane, Fp8Bytes& q) {
    hadamard_butterflies<LANES>(v, lane);
    round_to_bf16(v);
    return fp8_quantize<LANES, ROUND_SCALE>(v, q);
}

// Where a writer's FP8 rows go (kpool_cupy/ops/fp8_target.py builds the
// arguments).
//   kFp8Rows:  values [rows, D] uint8 at `stride` bytes a row, scales [rows]
//              float32; output row r is row r.
//   kFp8Slots: a paged cache [rows pages, block_size, D + 4] uint8 whose
//              pages lie `stride` bytes apart: a page holds block_size * D
//              value bytes (entry t at t * D), then block_size float32
//              scales (entry t at block_size * D + 4 * t). Output row r goes
//              to flat slot destinations[r] (negative: nowhere).
//   kFp8Table: the same cache; request b's pool q goes to slot
//              destinations[b * destination_stride + q / block_size] *
//              block_size + q % block_size (a negative entry: nowhere).
enum Fp8Target : int { kFp8Rows = 0, kFp8Slots = 1, kFp8Table = 2 };

template <int HEAD_DIM, int TARGET, typename ID>
struct Fp8Sink {
    unsigned char* values;
    long long stride;
    float* scales;  // kFp8Rows only
    long long rows;
    long long block_size;
    const ID* destinations;  // slots or the block table; unread for kFp8Rows
    long long destination_rows, destination_columns, destination_stride;

    // The value row and scale of output row `row`, pool `pool` of request
    // `request`: false when they go nowhere. Every index may be garbage when
    // the caller skipped validation; each is checked before it forms an
    // address, so nothing outside the arrays is touched. In two halves:
    // locate checks what needs no loaded value and issues the one load of
    // the destination (a slot, or a block-table entry) into *found, as
    // loaded (widened where it is used, not where the load issues), and
    // keeps in *where the one other number address needs (the row for
    // kFp8Rows, the pool's entry in its page for kFp8Table); address checks
    // the destination and forms the row's addresses. A writer issues the
    // pool's own loads between the two, so none of them waits for the
    // destination, and holds only found and where across them.
    __device__ __forceinline__ bool locate(long long row, long long request, long long pool, ID* found,
                                           long long* where) const {
        if constexpr (TARGET == kFp8Rows) {
            *where = row;
            return row >= 0 && row < rows;
        } else if constexpr (TARGET == kFp8Slots) {
            if (row < 0 || row >= destination_rows) return false;
            *found = destinations[row];
            return true;
        } else {
            if (request < 0 || request >= destination_rows || pool < 0) return false;
            const long long block = pool / block_size;
            if (block >= destination_columns) return false;
            *found = destinations[request * destination_stride + block];
            *where = pool - block * block_size;  // pool % block_size
            return true;
        }
    }
    __device__ __forceinline__ bool address(ID found, long long where, unsigned char** value_row,
                                            float** scale) const {
        if constexpr (TARGET == kFp8Rows) {
            *value_row = values + where * stride;
            *scale = scales + where;
            return true;
        } else {
            // A slot's page and entry; the block table gives both (the entry is where), a slot by division.
            long long page = static_cast<long long>(found), entry = where;
            if constexpr (TARGET == kFp8Slots) {
                if (page < 0) return false;
                entry = page % block_size;
                page /= block_size;
            }
            if (page < 0 || page >= rows) return false;
            unsigned char* const base = values + page * stride;
            *value_row = base + entry * HEAD_DIM;
            *scale = reinterpret_cast<float*>(base + block_size * HEAD_DIM) + entry;
            return true;
        }
    }
    __device__ __forceinline__ bool place(long long row, long long request, long long pool,
                                          unsigned char** value_row, float** scale) const {
        ID found{};
        long long where = 0;
        return locate(row, request, pool, &found, &where) && address(found, where, value_row, scale);
    }
};

// An FP8 writer kernel's destination parameters, in the order
// kpool_cupy/kernel/declarations.py declares them (FP8_SINK), and the same
// names passed on (to make its kp::Fp8Sink). ID: the index type of slots or
// the block table.
#define KP_FP8_SINK_PARAMS(ID)                                                                                    \
    unsigned char *__restrict__ values, long long values_stride, float *__restrict__ scales, long long target_rows, \
        long long block_size, const ID *__restrict__ destinations, long long destination_rows,                     \
        long long destination_columns, long long destination_stride
#define KP_FP8_SINK_ARGS                                                                                          \
    values, values_stride, scales, target_rows, block_size, destinations, destination_rows, destination_columns, \
        destination_stride

// Writes this thread's 8 bytes of a row (channels `channel` ..) and, from the
// group's first lane, the scale. VECTOR: one 8-byte store (the launcher found
// the row addresses 8-byte aligned), else 8 byte stores.
template <bool VECTOR>
__device__ __forceinline__ void store_fp8(unsigned char* value_row, float* scale_address, int channel,
                                          const Fp8Bytes& q, float scale) {
    if constexpr (VECTOR) {
        kp_store8(value_row + channel, q[0], q[1]);
    } else {
#pragma unroll
        for (int i = 0; i < kChannelsPerThread; ++i)
            value_row[channel + i] = static_cast<unsigned char>(q[i / 4] >> (8 * (i % 4)));
    }
    if (channel == 0) *scale_address = scale;
}

// Stores one pooled result (this thread's 8 channels from `channel` on),
// rounded once to T: the pooled key itself, or with ROTATE its rotation y =
// bf16(B(bf16(pooled)) * fl32(1/sqrt(D))), for engines whose cache keeps
// rotated bf16 keys (the `rotate=` option). With ROTATE every lane of the
// warp that has not left calls it together; WRITE false: the rotation runs
// and nothing is stored.
template <bool ROTATE, bool VECTOR, int HEAD_DIM, typename T>
__device__ __forceinline__ void store_pooled(T* target, int channel, const float (&result)[kChannelsPerThread],
                                             bool write = true) {
    if constexpr (ROTATE) {
        float v[kChannelsPerThread];
#pragma unroll
        for (int i = 0; i < kChannelsPerThread; ++i) v[i] = to_float(from_float<bf16>(result[i]));
        hadamard_rotate<HEAD_DIM / kChannelsPerThread>(v, channel / kChannelsPerThread);
        if (write) store8<VECTOR>(target, v);
    } else if (write) {
        store8<VECTOR>(target, result);
    }
}

// The FP8 row of one pooled result (v, float32, rounded to bf16 first, as a
// pooled key's x always is) into value_row and scale_address, which the
// caller found through its kp::Fp8Sink before reducing the pool (so the
// slot or block-table read overlaps the pool's loads); WRITE false: the
// epilogue runs (its shuffles meet the warp's other groups) and nothing is
// stored. Every lane of the group calls it together.
template <bool VECTOR, bool ROUND_SCALE, int HEAD_DIM>
__device__ __forceinline__ void write_fp8_row(unsigned char* value_row, float* scale_address, int channel,
                                              bool write, float (&v)[kChannelsPerThread]) {
    round_to_bf16(v);  // only quantized: the hardware's rounding on the GPU
    Fp8Bytes q;
    const float scale = fp8_epilogue<HEAD_DIM / kChannelsPerThread, ROUND_SCALE>(v, channel / kChannelsPerThread, q);
    if (write) store_fp8<VECTOR>(value_row, scale_address, channel, q, scale);
}

// Where a pooling kernel's pools go (compress, ring close, tail update, and
// their FP8 forms): writer.prepare(row, request, pool_id) once the pool is
// known, before its loads (false: it goes nowhere; the FP8 writer issues the
// load of its slot or block-table entry there, and neither the pooling nor
// its loads wait for it), then writer.write(row, channel, write, result)
// after it (write false, or a destination that turns out to be nowhere: the
// lanes meet the warp's shuffles and store nothing).

// The pool itself, rounded once to OT, at pooled + row * row_stride (ROTATE:
// its rotation, kp::store_pooled).
template <typename OT, int HEAD_DIM, bool ROTATE, bool VECTOR>
struct PooledRowWriter {
    OT* pooled;
    long long row_stride;

    __device__ __forceinline__ bool prepare(long long, long long, long long) { return true; }
    __device__ __forceinline__ void write(long long row, int channel, bool write,
                                          const float (&result)[kChannelsPerThread]) {
        store_pooled<ROTATE, VECTOR, HEAD_DIM>(pooled + row * row_stride + channel, channel, result, write);
    }
};

// The pool's FP8 bytes and scale, where the sink places it (kp::write_fp8_row).
// prepare issues the destination's load (Fp8Sink::locate); write checks it
// and forms the addresses (Fp8Sink::address), after the pool's loads.
template <int HEAD_DIM, int TARGET, typename ID, bool ROUND_SCALE, bool VECTOR>
struct Fp8RowWriter {
    const Fp8Sink<HEAD_DIM, TARGET, ID>& sink;
    unsigned char* value_row;
    float* scale_address;
    ID found{};           // the destination as loaded (a slot or a block-table entry; none for rows)
    long long where = 0;  // the row, or the pool's entry in its page (Fp8Sink::locate)

    __device__ __forceinline__ bool prepare(long long row, long long request, long long pool_id) {
        return sink.locate(row, request, pool_id, &found, &where);
    }
    __device__ __forceinline__ void write(long long, int channel, bool write,
                                          const float (&result)[kChannelsPerThread]) {
        const bool placed = write && sink.address(found, where, &value_row, &scale_address);
        float v[kChannelsPerThread];
#pragma unroll
        for (int i = 0; i < kChannelsPerThread; ++i) v[i] = result[i];
        write_fp8_row<VECTOR, ROUND_SCALE, HEAD_DIM>(value_row, scale_address, channel, placed, v);
    }
};

}  // namespace kp

#endif  // KPOOL_FP8_CUH
