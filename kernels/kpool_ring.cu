// The pool lifecycle across calls: ring close, seed tail and tail update.
//
//     pooled[c] = sum_m softmax_m(gate[member m, c] + ape[m, c]) * k[member m, c]
//
// A pool whose members arrive over several calls keeps them in a per-request
// ring of ring >= KPOOL rows: keys in the dtype of k, gate scores in the
// dtype of gate. The launcher passes either form of the caller's ring the
// same way, as a key ring and a gate ring, each [max_slots, ring, HEAD_DIM]
// at its own slot and row strides (in elements; a padded cache's view), the
// last dim contiguous: one array [max_slots, 2, ring, HEAD_DIM] (index 0
// keys, 1 gate scores) is passed twice, its gate ring gate_offset (the half
// stride) elements on; a pair (key_ring, gate_ring) is passed as it is, with
// gate_offset 0. The token at absolute position pos lives at ring row
// pos % ring of slot slot_idx[r], so pool q's members are rows
// (q * KPOOL + m) % ring. A ring longer than a pool keeps a decode step's
// drafts from overwriting the open pool (speculative decoding;
// kpool_tail_update's docstring gives the bound). The ring holds raw values,
// and every pool is reduced by kp::PoolChannel with members in pool order, so
// a pool closed from the ring equals, bit for bit, the same pool built by
// kpool_compress.
//
// Geometry is kpool_compress's: a group of HEAD_DIM / 8 threads per request,
// several per block, each thread owning 8 channels. A thread reads back only
// the ring channels it wrote itself, so threads still never communicate.
#include "kpool_fp8.cuh"

// The parameters the ring kernels share, in the order
// kpool_cupy/kernel/declarations.py declares them: the ring (ring(); CONST
// is `const` where a kernel only reads it), then, for ring close and seed
// tail, the call's token rows and what places each request (_RING_TOKENS,
// _REQUESTS). KP_RING_ARGS passes the ring on; KP_RING_CLOSE_ARGS passes a
// ring close kernel's inputs to kp::close_pending_pool.
#define KP_RING_PARAMS(CONST)                                                                                    \
    CONST T *__restrict__ key_ring, CONST G *__restrict__ gate_ring, long long gate_offset, long long max_slots, \
        long long ring_rows, long long key_slot_stride, long long key_row_stride, long long gate_slot_stride,    \
        long long gate_row_stride
#define KP_RING_TOKEN_PARAMS \
    const T *__restrict__ k, long long k_row_stride, const G *__restrict__ gate, long long gate_row_stride_tokens
#define KP_REQUEST_PARAMS                                                                                            \
    const IO *__restrict__ input_row_offsets, const IC *__restrict__ cache_lengths, const IS *__restrict__ slot_idx, \
        long long batch, long long total_tokens
#define KP_RING_ARGS                                                                                        \
    key_ring, gate_ring, gate_offset, max_slots, ring_rows, key_slot_stride, key_row_stride, gate_slot_stride, \
        gate_row_stride
#define KP_RING_CLOSE_ARGS                                                                                       \
    KP_RING_ARGS, k, k_row_stride, gate, gate_row_stride_tokens, ape, ape_row_stride, input_row_offsets,          \
        cache_lengths, slot_idx, batch, total_tokens, closed

namespace kp {

// A ring's rows, and the slot and row strides of its keys and gate scores,
// in elements.
struct RingLayout {
    long long rows, key_slot_stride, key_row_stride, gate_slot_stride, gate_row_stride;
};

// The ring row of a position >= 0: position % rows with 32-bit divisions
// only (rows <= 65536, the launcher checks). A 64-bit division by a run-time
// divisor is a subroutine call on the GPU, and the registers saved around it
// spill in the decode kernel.
__device__ __forceinline__ long long ring_row_of(const RingLayout& ring, long long position) {
    const unsigned int rows = static_cast<unsigned int>(ring.rows);
    const unsigned long long p = static_cast<unsigned long long>(position);
    const unsigned int high = static_cast<unsigned int>(p >> 32) % rows;
    const unsigned int low = static_cast<unsigned int>(p) % rows;
    const unsigned int two_32 = (0xffffffffu % rows + 1u) % rows;  // 2^32 % rows
    return static_cast<long long>(((high * two_32) % rows + low) % rows);  // high * two_32 < 2^32
}

// The ring row after `row` (rows wrap).
__device__ __forceinline__ long long next_row(const RingLayout& ring, long long row) {
    return row + 1 == ring.rows ? 0 : row + 1;
}

}  // namespace kp

namespace kp {

// Ring close's work for the calling thread, one of a group of HEAD_DIM / 8
// per request: false when it has no request; else whether the request's
// pending pool c / KPOOL closes in this call (the group's first thread
// writes closed[request]: the id, or -1), and if so the pool, from the ring
// rows of positions [c - c % KPOOL, c) and the call's first KPOOL - c %
// KPOOL tokens, into result, with the thread's request and channel. Before
// the pool's loads prepare(request, pool id) runs (an FP8 writer finds the
// pool's cache slot there; the pool does not wait for it). Both ring close
// kernels pool through here and take its parameters. closed is written before the pooling so that nothing but
// the pool's own state stays live across it (a long pool's loads need every
// register).
template <typename T, typename G, int HEAD_DIM, int KPOOL, int VECTOR, typename IO, typename IC, typename IS,
          typename Prepare>
__device__ __forceinline__ bool close_pending_pool(long long* thread_request, int* thread_channel,
                                                   KP_RING_PARAMS(const), KP_RING_TOKEN_PARAMS, const float* ape,
                                                   long long ape_row_stride, KP_REQUEST_PARAMS, int* closed,
                                                   float (&result)[kChannelsPerThread], Prepare prepare) {
    static_assert(KPOOL >= 1, "kpool must be at least 1");
    long long request;
    int channel;
    if (!thread_group<HEAD_DIM>(&request, &channel) || request >= batch) return false;
    *thread_request = request;
    *thread_channel = channel;
    const RingLayout ring{ring_rows, key_slot_stride, key_row_stride, gate_slot_stride, gate_row_stride};
    long long row_begin, row_end, cached;
    bool closes = request_rows(input_row_offsets, cache_lengths, request, total_tokens, &row_begin, &row_end, &cached);
    const long long slot = load_signed_index(slot_idx, request);
    const long long phase = closes ? cached % KPOOL : 0;
    closes = closes && phase != 0 && slot >= 0 && slot < max_slots && row_end - row_begin >= KPOOL - phase &&
             cached / KPOOL <= 2147483647LL;
    if (channel == 0) closed[request] = closes ? static_cast<int>(cached / KPOOL) : -1;
    if (!closes) return false;
    prepare(request, cached / KPOOL);

    const T* keys_ring = key_ring + slot * ring.key_slot_stride + channel;
    const G* gates_ring = gate_ring + gate_offset + slot * ring.gate_slot_stride + channel;
    const long long first_row = ring_row_of(ring, cached - phase);  // pool c / KPOOL's first member
    pool8<KPOOL, T, G, vector_bits(VECTOR, kVectorK | kVectorTail), vector_bits(VECTOR, kVectorGate | kVectorGateRing),
          vector_bits(VECTOR, kVectorApe)>(
        [&](int m, const T** key_row, const G** gate_row) {
            // Cached members from the ring, the rest from this call's rows:
            // row_begin + m - phase < row_end, checked above.
            // m < KPOOL <= ring rows, so one wrap at most.
            const bool cached_member = m < phase;
            const long long ring_row = first_row + m < ring.rows ? first_row + m : first_row + m - ring.rows;
            const long long row = row_begin + m - phase;
            *key_row = cached_member ? keys_ring + ring_row * ring.key_row_stride : k + row * k_row_stride + channel;
            *gate_row = cached_member ? gates_ring + ring_row * ring.gate_row_stride
                                      : gate + row * gate_row_stride_tokens + channel;
        },
        ape + channel, ape_row_stride, result);
    return true;
}

// A request's pending pool, if it closes, through close_pending_pool into a
// writer (kpool_fp8.cuh): its place found before the pool's loads, its row
// written after (row b for request b). What both ring close kernels run.
template <typename T, typename G, int HEAD_DIM, int KPOOL, int VECTOR, typename IO, typename IC, typename IS,
          typename Writer>
__device__ __forceinline__ void close_into(KP_RING_PARAMS(const), KP_RING_TOKEN_PARAMS, const float* ape,
                                           long long ape_row_stride, KP_REQUEST_PARAMS, int* closed, Writer& writer) {
    long long request;
    int channel;
    bool placed = false;
    float result[kChannelsPerThread];
    if (!close_pending_pool<T, G, HEAD_DIM, KPOOL, VECTOR>(
            &request, &channel, KP_RING_CLOSE_ARGS, result, [&](long long pool_request, long long pool_id) {
                placed = writer.prepare(pool_request, pool_request, pool_id);
            }))
        return;
    writer.write(request, channel, placed, result);
}

}  // namespace kp

// Closes each request's pending pool c / KPOOL when the call completes it:
// the ring rows of positions [c - c % KPOOL, c), then the call's first
// KPOOL - c % KPOOL tokens.
// closed[b] is the pool id, or -1 and pooled row b is left alone. Reads the
// ring, never writes it.
//
// T, G: the element types of k and gate (and of the key and gate rings).
// VECTOR: kp::VectorAccess bits of k, gate, ape, pooled and the two rings. A
// member comes from the ring or from k and gate, so its keys take the 16-byte
// path when both the key ring and k allow it, its gate scores when the gate
// ring and gate do. ROTATE: as kpool_compress. IO, IC, IS: the element
// types of input_row_offsets, cache_lengths and slot_idx.
template <typename T, typename G, typename OT, int HEAD_DIM, int KPOOL, int VECTOR, bool ROTATE, typename IO,
          typename IC, typename IS>
__global__ void __launch_bounds__(kp::kMaxThreadsPerBlock, 1)
    kpool_ring_close(KP_RING_PARAMS(const), KP_RING_TOKEN_PARAMS, const float* __restrict__ ape,
                     long long ape_row_stride, KP_REQUEST_PARAMS, OT* __restrict__ pooled,
                     long long pooled_row_stride, int* __restrict__ closed) {
    KP_THREADS_COOPERATE(ROTATE);
    kp::PooledRowWriter<OT, HEAD_DIM, ROTATE, kp::vector_bits(VECTOR, kp::kVectorOut)> writer{pooled,
                                                                                              pooled_row_stride};
    kp::close_into<T, G, HEAD_DIM, KPOOL, VECTOR>(KP_RING_CLOSE_ARGS, writer);
}

// kpool_ring_close with the FP8 epilogue fused (kernels/kpool_fp8.cuh):
// each closed pool's bytes and scale go to output row b, or to its cache
// slot through slots[b] or request b's block table row (kp::Fp8Sink,
// TARGET, read before the pool's loads); the same bytes kpool_compress_fp8
// writes for the same pool. closed as kpool_ring_close. A request that
// closes nothing leaves the kernel (the epilogue's shuffles wait for the
// warp's lanes that have not left). HEAD_DIM: a power of two, 8 to 256;
// VECTOR's kVectorOut: 8-byte value stores. ID: the element type of slots or
// the block table. ROUND_SCALE: power-of-two scales.
template <typename T, typename G, int HEAD_DIM, int KPOOL, int VECTOR, int TARGET, bool ROUND_SCALE, typename IO,
          typename IC, typename IS, typename ID>
__global__ void __launch_bounds__(kp::kMaxThreadsPerBlock, 1)
    kpool_ring_close_fp8(KP_RING_PARAMS(const), KP_RING_TOKEN_PARAMS, const float* __restrict__ ape,
                         long long ape_row_stride, KP_REQUEST_PARAMS, KP_FP8_SINK_PARAMS(ID),
                         int* __restrict__ closed) {
    KP_THREADS_COOPERATE(true);
    const kp::Fp8Sink<HEAD_DIM, TARGET, ID> sink{KP_FP8_SINK_ARGS};
    kp::Fp8RowWriter<HEAD_DIM, TARGET, ID, ROUND_SCALE, kp::vector_bits(VECTOR, kp::kVectorOut)> writer{sink, nullptr,
                                                                                                   nullptr};
    kp::close_into<T, G, HEAD_DIM, KPOOL, VECTOR>(KP_RING_CLOSE_ARGS, writer);
}

// Stashes each request's last min(n, ring) tokens, positions
// [max(c + n - ring, c), c + n), into ring row pos % ring of its slot. It
// needs no kpool: on a ring of ring >= kpool rows, every member a later
// call's pools read from the ring (the pending pool's, fewer than kpool) is
// among them, and seeding a prompt in two chunks leaves the ring as seeding
// it in one.
//
// VECTOR: kp::VectorAccess bits of k, gate and the two rings. T, G, IO, IC,
// IS as ring close.
template <typename T, typename G, int HEAD_DIM, int VECTOR, typename IO, typename IC, typename IS>
__global__ void __launch_bounds__(kp::kMaxThreadsPerBlock, 1)
    kpool_seed_tail(KP_RING_PARAMS(), KP_RING_TOKEN_PARAMS, KP_REQUEST_PARAMS) {
    long long request;
    int channel;
    if (!kp::thread_group<HEAD_DIM>(&request, &channel) || request >= batch) return;

    long long row_begin, row_end, cached;
    const bool rows_ok =
        kp::request_rows(input_row_offsets, cache_lengths, request, total_tokens, &row_begin, &row_end, &cached);
    const long long slot = kp::load_signed_index(slot_idx, request);
    if (!rows_ok || slot < 0 || slot >= max_slots || cached > 9223372036854775807LL - (row_end - row_begin)) return;
    const long long count = row_end - row_begin;
    const long long end = cached + count;  // checked above not to overflow
    const long long start = count > ring_rows ? end - ring_rows : cached;

    const kp::RingLayout ring{ring_rows, key_slot_stride, key_row_stride, gate_slot_stride, gate_row_stride};
    T* const keys_ring = key_ring + slot * ring.key_slot_stride + channel;
    G* const gates_ring = gate_ring + gate_offset + slot * ring.gate_slot_stride + channel;
    long long ring_row = kp::ring_row_of(ring, start);
    for (long long position = start; position < end; ++position) {  // at most ring rows iterations
        const long long row = row_begin + (position - cached);
        kp::copy8<kp::vector_bits(VECTOR, kp::kVectorTail), kp::vector_bits(VECTOR, kp::kVectorK)>(
            keys_ring + ring_row * ring.key_row_stride, k + row * k_row_stride + channel);
        kp::copy8<kp::vector_bits(VECTOR, kp::kVectorGateRing), kp::vector_bits(VECTOR, kp::kVectorGate)>(
            gates_ring + ring_row * ring.gate_row_stride, gate + row * gate_row_stride_tokens + channel);
        ring_row = kp::next_row(ring, ring_row);
    }
}

namespace kp {

// The decode step of one request: walks its tokens in order, stashes every
// real token at ring row pos % ring, and whenever pos % KPOOL == KPOOL - 1
// pools pool pos / KPOOL from its members' rows, as output row
// row = request * pools_per_request + the pools closed so far; closed gets
// the ids, padded with -1. Both tail update kernels run through here. See
// kpool_tail_update for SPLIT.
//
// The writer (kpool_fp8.cuh) says where a pool goes and writes it:
// writer.prepare(row, request, pool_id) before the pool's loads (false:
// nowhere; an FP8 cache's block table entry is read there, beside the
// ring's, and the pooling does not wait for it), writer.write(row, channel,
// write, result) after. MEET (the writer's stores shuffle): at every step
// where any lane of the warp closes a pool, every lane of the warp that has
// not left calls write, with write false where its own request closes none,
// so that the shuffles name the whole warp (kp::kWarpLanes) and each meets
// in one step.
//
// Global loads wait on each other at most once on the path of a closing
// pool: the slot, each step's position and tokens and ape depend on the
// request alone and are issued together, whatever the slot and position
// turn out to be (the token rows exist either way); the ring's members, the
// writer's table entry and the token's own ring row need the slot and the
// position, and the ring stores before them carry this step's tokens. In
// the engines' shape (16-bit rows, pools of up to 4 members) step 0's
// position and tokens are issued before the slot's arithmetic and each
// later step's one step ahead, so that no load of a step waits for an
// instruction that uses the slot (in-order issue would make it a round trip
// of its own).
template <typename T, typename G, int KPOOL, int VECTOR, bool SPLIT, bool MEET, typename IPOS, typename IS,
          typename Writer>
__device__ __forceinline__ void tail_update_steps(
    long long request, int channel, T* key_ring, G* gate_ring, long long gate_offset, long long max_slots,
    long long ring_rows, long long key_slot_stride, long long key_row_stride, long long gate_slot_stride,
    long long gate_row_stride, const T* k, long long k_request_stride, long long k_token_stride, const G* gate,
    long long gate_request_stride, long long gate_token_stride, const float* ape, long long ape_row_stride,
    const IPOS* positions, const IS* slot_idx, long long requests, int next_n, int* closed, int pools_per_request,
    Writer& writer) {
    static_assert(SPLIT || sizeof(G) == sizeof(T), "one ring array holds keys and gate scores in one dtype");
    const bool lead = channel == 0;  // the group's first thread writes closed
    // Registers allow holding a step's tokens through the next step's loads (and through the ring row's
    // divisions) only for 16-bit rows and pools of up to 4 members; wider rows or longer pools spill at
    // head_dim 256 and 4096, and there the compiler places the loads (under the position's branch).
    constexpr bool kAhead = sizeof(T) == 2 && sizeof(G) == 2 && KPOOL <= 4;
    using KeyRow = Row8<T, vector_bits(VECTOR, kVectorK)>;
    using GateRow = Row8<G, vector_bits(VECTOR, kVectorGate)>;
    IPOS ahead_position{};  // as loaded: widened when its step uses it, not where the load issues
    KeyRow ahead_key;
    GateRow ahead_gate;
    const auto load_ahead = [&](int t) {
        ahead_position = positions[request * next_n + t];
        ahead_key.load_now(k + request * k_request_stride + t * k_token_stride + channel);
        ahead_gate.load_now(gate + request * gate_request_stride + t * gate_token_stride + channel);
    };
    if constexpr (kAhead)
        if (next_n > 0) load_ahead(0);  // beside the slot: issued before anything uses a loaded value
    const long long slot = load_signed_index(slot_idx, request);
    const bool slot_ok = slot >= 0 && slot < max_slots;
    constexpr bool kKeyRingVector = vector_bits(VECTOR, kVectorTail);
    constexpr bool kGateRingVector = vector_bits(VECTOR, kVectorGateRing);
    // The slot's key and gate rows, addressed by 32-bit offsets within the
    // slot (a slot spans fewer than 2^31 elements, the launcher checks): it
    // keeps registers free for the pool's loads.
    T* const keys_ring = key_ring + (slot_ok ? slot * key_slot_stride : 0) + channel;
    G* const gates_ring = SPLIT ? gate_ring + (slot_ok ? slot * gate_slot_stride : 0) + channel : nullptr;
    const int half = static_cast<int>(gate_offset);  // one array: the gate row half elements after the key row
    const int rows = static_cast<int>(ring_rows);
    const int key_row = static_cast<int>(key_row_stride);
    const int gate_row = static_cast<int>(gate_row_stride);
    // The gate row beside a key row: in the gate ring (SPLIT), else half
    // elements on from the key row's address.
    const auto gate_beside = [&](T* key_row_address, int row_offset) -> G* {
        if constexpr (SPLIT) return gates_ring + row_offset * gate_row;
        return reinterpret_cast<G*>(key_row_address) + half;
    };
    const RingLayout ring{ring_rows, key_slot_stride, key_row_stride, gate_slot_stride, gate_row_stride};
    int written = 0;
    for (int t = 0; t < next_n; ++t) {  // the same count for every lane of the warp: no early exit
        long long position;
        KeyRow token_key;
        GateRow token_gate;
        if constexpr (kAhead) {  // this step's, loaded a step ahead; the next step's issued now
            position = signed_index(ahead_position);
            token_key = ahead_key;
            token_gate = ahead_gate;
            if (t + 1 < next_n) load_ahead(t + 1);
        } else {
            position = load_signed_index(positions, request * next_n + t);
            token_key.load(k + request * k_request_stride + t * k_token_stride + channel);
            token_gate.load(gate + request * gate_request_stride + t * gate_token_stride + channel);
        }
        const bool real = slot_ok && position >= 0;  // padding leaves the ring byte-identical
        const int ring_row = real ? static_cast<int>(ring_row_of(ring, position)) : 0;
        if (real) {
            T* const key_slot_row = keys_ring + ring_row * key_row;
            store_raw8<kKeyRingVector>(key_slot_row, token_key);
            store_raw8<kGateRingVector>(gate_beside(key_slot_row, ring_row), token_gate);
        }
        const bool closes = real && position % KPOOL == KPOOL - 1 && written < pools_per_request;
        const long long row = request * pools_per_request + written;
        // Where the pool goes is read beside its members; the pooling does
        // not wait for it (a pool that goes nowhere is pooled and dropped).
        const bool placed = closes && writer.prepare(row, request, position / KPOOL);
        float result[kChannelsPerThread] = {};
        if (closes) {
            // The pool's members, positions position - KPOOL + 1 .. position,
            // sit at ring rows from first_row on (one wrap at most: KPOOL <=
            // ring rows); this thread wrote their 8 channels, in this call or
            // earlier (the last just now).
            const int first_row = ring_row >= KPOOL - 1 ? ring_row - (KPOOL - 1) : ring_row - (KPOOL - 1) + rows;
            T* const first_key = keys_ring + first_row * key_row;
            const int unwrapped = rows - first_row;  // members before the ring's end
            pool8<KPOOL, T, G, kKeyRingVector, kGateRingVector, vector_bits(VECTOR, kVectorApe)>(
                [&](int m, const T** key_member, const G** gate_member) {
                    // Member m at first_row + m, less the ring's length past its end.
                    const int member_row = m < unwrapped ? m : m - rows;
                    T* const key_address = first_key + member_row * key_row;
                    *key_member = key_address;
                    *gate_member = gate_beside(key_address, first_row + member_row);
                },
                ape + channel, ape_row_stride, result);
        }
        if constexpr (MEET) {
            if (__any_sync(kWarpLanes, closes)) writer.write(row, channel, placed, result);
        } else if (placed) {
            writer.write(row, channel, true, result);
        }
        if (closes) {
            if (lead) closed[row] = static_cast<int>(position / KPOOL);  // fits: checked with validate=True
            ++written;
        }
    }
    if (lead)
        for (int w = written; w < pools_per_request; ++w) closed[request * pools_per_request + w] = -1;
}

// The decode step's tokens and where they sit, as both tail update kernels
// take them (declarations.py's _STEP), and the names tail_update_steps reads.
#define KP_STEP_PARAMS                                                                                             \
    const T *__restrict__ k, long long k_request_stride, long long k_token_stride, const G *__restrict__ gate,     \
        long long gate_request_stride, long long gate_token_stride, const float *__restrict__ ape,                 \
        long long ape_row_stride, const IPOS *__restrict__ positions, const IS *__restrict__ slot_idx,            \
        long long requests, int next_n
#define KP_STEP_ARGS                                                                                               \
    k, k_request_stride, k_token_stride, gate, gate_request_stride, gate_token_stride, ape, ape_row_stride,        \
        positions, slot_idx, requests, next_n

// The calling thread's request (one group of HEAD_DIM / 8 threads each)
// through tail_update_steps into a writer: what both tail update kernels run.
template <typename T, typename G, int HEAD_DIM, int KPOOL, int VECTOR, bool SPLIT, bool MEET, typename IPOS,
          typename IS, typename Writer>
__device__ __forceinline__ void tail_update_into(KP_RING_PARAMS(), KP_STEP_PARAMS, int* closed, int pools_per_request,
                                                 Writer& writer) {
    long long request;
    int channel;
    if (!thread_group<HEAD_DIM>(&request, &channel) || request >= requests) return;
    tail_update_steps<T, G, KPOOL, VECTOR, SPLIT, MEET>(request, channel, KP_RING_ARGS, KP_STEP_ARGS, closed,
                                                        pools_per_request, writer);
}

}  // namespace kp

// The decode step: k, gate [requests, next_n, HEAD_DIM], positions
// [requests, next_n] (negative = padding). Walks each request's tokens in
// order, stashes every real token at ring row pos % ring, and closes pool
// pos / KPOOL whenever pos % KPOOL == KPOOL - 1, from its members' rows.
// pooled [requests, pools_per_request, HEAD_DIM] and closed
// [requests, pools_per_request] list the pools closed, in order; closed is
// padded with -1 and the matching pooled rows are left alone. A padding
// token touches nothing.
//
// VECTOR: kp::VectorAccess bits of k, gate, ape, pooled and the two rings.
// T, G as ring close. SPLIT: the rings are two arrays (a pair); without it
// they are one array, the gate ring gate_offset elements after the key ring
// at the same row stride, and the kernel addresses both from one pointer
// (two would cost the registers that keep the pool's loads from spilling).
// ROTATE: as kpool_compress. IPOS, IS: the element types of positions and
// slot_idx.
template <typename T, typename G, typename OT, int HEAD_DIM, int KPOOL, int VECTOR, bool SPLIT, bool ROTATE,
          typename IPOS, typename IS>
__global__ void __launch_bounds__(SPLIT ? kp::group_block_bound(HEAD_DIM) : kp::kMaxThreadsPerBlock, 1)
    kpool_tail_update(KP_RING_PARAMS(), KP_STEP_PARAMS, OT* __restrict__ pooled, int* __restrict__ closed,
                      int pools_per_request) {
    static_assert(KPOOL >= 1, "kpool must be at least 1");
    KP_THREADS_COOPERATE(ROTATE);
    kp::PooledRowWriter<OT, HEAD_DIM, ROTATE, kp::vector_bits(VECTOR, kp::kVectorOut)> writer{pooled, HEAD_DIM};
    kp::tail_update_into<T, G, HEAD_DIM, KPOOL, VECTOR, SPLIT, ROTATE>(KP_RING_ARGS, KP_STEP_ARGS, closed,
                                                                       pools_per_request, writer);
}

// kpool_tail_update with the FP8 epilogue fused (kernels/kpool_fp8.cuh):
// each closed pool's bytes and scale go to output row
// request * pools_per_request + j (values [requests, pools_per_request,
// HEAD_DIM], scales [requests, pools_per_request]) or, through request r's
// block table row (read beside the pool's ring rows), to its cache slot
// (kp::Fp8Sink, TARGET); the same bytes kpool_compress_fp8 writes for the
// same pool. Ring and closed as kpool_tail_update. The warp's lanes meet at
// the epilogue of every step where any of them closes a pool
// (kp::tail_update_steps' MEET). HEAD_DIM: a power of two, 8 to 256;
// VECTOR's kVectorOut: 8-byte value stores. ID: the element type of the
// block table. ROUND_SCALE: power-of-two scales.
template <typename T, typename G, int HEAD_DIM, int KPOOL, int VECTOR, bool SPLIT, int TARGET, bool ROUND_SCALE,
          typename IPOS, typename IS, typename ID>
__global__ void __launch_bounds__(SPLIT ? kp::group_block_bound(HEAD_DIM) : kp::kMaxThreadsPerBlock, 1)
    kpool_tail_update_fp8(KP_RING_PARAMS(), KP_STEP_PARAMS, KP_FP8_SINK_PARAMS(ID), int* __restrict__ closed,
                          int pools_per_request) {
    static_assert(KPOOL >= 1, "kpool must be at least 1");
    KP_THREADS_COOPERATE(true);
    const kp::Fp8Sink<HEAD_DIM, TARGET, ID> sink{KP_FP8_SINK_ARGS};
    kp::Fp8RowWriter<HEAD_DIM, TARGET, ID, ROUND_SCALE, kp::vector_bits(VECTOR, kp::kVectorOut)> writer{sink, nullptr,
                                                                                                   nullptr};
    kp::tail_update_into<T, G, HEAD_DIM, KPOOL, VECTOR, SPLIT, true>(KP_RING_ARGS, KP_STEP_ARGS, closed,
                                                                     pools_per_request, writer);
}
