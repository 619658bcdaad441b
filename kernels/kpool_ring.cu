// The pool lifecycle across calls: ring close, seed tail and tail update.
//
//     pooled[c] = sum_m softmax_m(gate[member m, c] + ape[m, c]) * k[member m, c]
//
// A pool whose members arrive over several calls keeps them in a per-request
// ring: tail [max_slots, 2, KPOOL, HEAD_DIM] in the dtype of k, index 0 keys,
// 1 gate scores; the token at absolute position pos lives at ring position
// pos % KPOOL of slot slot_idx[r]. The ring holds raw values, and every pool is
// reduced by kp::PoolChannel with members in pool order, so a pool closed from
// the ring equals, bit for bit, the same pool built by kpool_compress.
//
// Geometry is kpool_compress's: a group of HEAD_DIM / 8 threads per request,
// several per block, each thread owning 8 channels. A thread reads back only
// the ring channels it wrote itself, so threads still never communicate.
#include "kpool_common.cuh"

namespace kp {

// Element offset of (slot, which, position, channel 0) in a contiguous ring.
template <int HEAD_DIM, int KPOOL>
__device__ __forceinline__ long long ring_offset(long long slot, int which, long long position) {
    return ((slot * 2 + which) * KPOOL + position) * HEAD_DIM;
}

}  // namespace kp

// Closes each request's pending pool c / KPOOL when the call completes it:
// ring positions [0, c % KPOOL) then the call's first KPOOL - c % KPOOL tokens.
// closed[b] is the pool id, or -1 and pooled row b is left alone. Reads the
// ring, never writes it.
//
// vector_mask: kp::VectorAccess bits of k, gate, ape, pooled and tail.
template <typename T, typename OT, int HEAD_DIM, int KPOOL>
__global__ void kpool_ring_close(const T* __restrict__ tail, long long max_slots, const T* __restrict__ k,
                                 long long k_row_stride, const T* __restrict__ gate, long long gate_row_stride,
                                 const float* __restrict__ ape, long long ape_row_stride,
                                 const void* __restrict__ input_row_offsets, int input_kind,
                                 const void* __restrict__ cache_lengths, int cache_kind,
                                 const void* __restrict__ slot_idx, int slot_kind, long long batch,
                                 long long total_tokens, OT* __restrict__ pooled, long long pooled_row_stride,
                                 int* __restrict__ closed, int vector_mask) {
    static_assert(KPOOL >= 1, "kpool must be at least 1");
    long long request;
    int channel;
    if (!kp::thread_group<HEAD_DIM>(&request, &channel) || request >= batch) return;
    const bool lead = channel == 0;  // the group's first thread writes closed

    long long row_begin, row_end, cached;
    bool closes = kp::request_rows(input_row_offsets, input_kind, cache_lengths, cache_kind, request, total_tokens,
                                   &row_begin, &row_end, &cached);
    const long long slot = kp::load_index(slot_idx, slot_kind, request);
    const long long phase = closes ? cached % KPOOL : 0;
    closes = closes && phase != 0 && slot >= 0 && slot < max_slots && row_end - row_begin >= KPOOL - phase &&
             cached / KPOOL <= 2147483647LL;
    if (lead) closed[request] = closes ? static_cast<int>(cached / KPOOL) : -1;
    if (!closes) return;

    const bool k_vector = vector_mask & kp::kVectorK, gate_vector = vector_mask & kp::kVectorGate;
    const bool tail_vector = vector_mask & kp::kVectorTail;
    float result[kp::kChannelsPerThread];
    kp::pool8<KPOOL>(
        [&](int m, float(&keys)[kp::kChannelsPerThread], float(&logits)[kp::kChannelsPerThread]) {
            if (m < phase) {  // cached member: from the ring
                kp::load8(tail + kp::ring_offset<HEAD_DIM, KPOOL>(slot, 0, m) + channel, tail_vector, keys);
                kp::load8(tail + kp::ring_offset<HEAD_DIM, KPOOL>(slot, 1, m) + channel, tail_vector, logits);
            } else {  // this call's member: row_begin + m - phase < row_end, checked above
                const long long row = row_begin + m - phase;
                kp::load8(k + row * k_row_stride + channel, k_vector, keys);
                kp::load8(gate + row * gate_row_stride + channel, gate_vector, logits);
            }
        },
        ape + channel, ape_row_stride, (vector_mask & kp::kVectorApe) != 0, result);
    kp::store8(pooled + request * pooled_row_stride + channel, (vector_mask & kp::kVectorOut) != 0, result);
}

// Stashes each request's trailing tokens, positions
// [max(floor((c + n) / KPOOL) * KPOOL, c), c + n), into ring position
// pos % KPOOL of its slot: the start of the pool the next call completes.
// At most KPOOL - 1 tokens per request.
//
// vector_mask: kp::VectorAccess bits of k, gate and tail.
template <typename T, int HEAD_DIM, int KPOOL>
__global__ void kpool_seed_tail(T* __restrict__ tail, long long max_slots, const T* __restrict__ k,
                                long long k_row_stride, const T* __restrict__ gate, long long gate_row_stride,
                                const void* __restrict__ input_row_offsets, int input_kind,
                                const void* __restrict__ cache_lengths, int cache_kind,
                                const void* __restrict__ slot_idx, int slot_kind, long long batch,
                                long long total_tokens, int vector_mask) {
    static_assert(KPOOL >= 1, "kpool must be at least 1");
    long long request;
    int channel;
    if (!kp::thread_group<HEAD_DIM>(&request, &channel) || request >= batch) return;

    long long row_begin, row_end, cached;
    if (!kp::request_rows(input_row_offsets, input_kind, cache_lengths, cache_kind, request, total_tokens, &row_begin,
                          &row_end, &cached))
        return;
    const long long slot = kp::load_index(slot_idx, slot_kind, request);
    if (slot < 0 || slot >= max_slots || cached > 9223372036854775807LL - (row_end - row_begin)) return;
    const long long end = cached + (row_end - row_begin);  // checked above not to overflow
    const long long pool_start = (end / KPOOL) * KPOOL;
    const long long start = pool_start > cached ? pool_start : cached;

    const bool tail_vector = vector_mask & kp::kVectorTail;
    for (long long position = start; position < end; ++position) {  // fewer than KPOOL iterations
        const long long row = row_begin + (position - cached);
        const long long ring_position = position % KPOOL;
        kp::copy8(tail + kp::ring_offset<HEAD_DIM, KPOOL>(slot, 0, ring_position) + channel, tail_vector,
                  k + row * k_row_stride + channel, (vector_mask & kp::kVectorK) != 0);
        kp::copy8(tail + kp::ring_offset<HEAD_DIM, KPOOL>(slot, 1, ring_position) + channel, tail_vector,
                  gate + row * gate_row_stride + channel, (vector_mask & kp::kVectorGate) != 0);
    }
}

// The decode step: k, gate [requests, next_n, HEAD_DIM], positions
// [requests, next_n] of any index kind (negative = padding). Walks each request's tokens in
// order, stashes every real token in the ring, and closes pool pos / KPOOL
// whenever pos % KPOOL == KPOOL - 1, from ring positions 0 .. KPOOL - 1.
// pooled [requests, pools_per_request, HEAD_DIM] and closed
// [requests, pools_per_request] list the pools closed, in order; closed is
// padded with -1 and the matching pooled rows are left alone. A padding
// token touches nothing.
//
// vector_mask: kp::VectorAccess bits of k, gate, ape, pooled and tail.
template <typename T, typename OT, int HEAD_DIM, int KPOOL>
__global__ void kpool_tail_update(T* __restrict__ tail, long long max_slots, const T* __restrict__ k,
                                  long long k_request_stride, long long k_token_stride, const T* __restrict__ gate,
                                  long long gate_request_stride, long long gate_token_stride,
                                  const float* __restrict__ ape, long long ape_row_stride,
                                  const void* __restrict__ positions, int positions_kind,
                                  const void* __restrict__ slot_idx, int slot_kind,
                                  long long requests, int next_n, OT* __restrict__ pooled,
                                  int* __restrict__ closed, int pools_per_request, int vector_mask) {
    static_assert(KPOOL >= 1, "kpool must be at least 1");
    long long request;
    int channel;
    if (!kp::thread_group<HEAD_DIM>(&request, &channel) || request >= requests) return;
    const bool lead = channel == 0;  // the group's first thread writes closed

    const long long slot = kp::load_index(slot_idx, slot_kind, request);
    const bool slot_ok = slot >= 0 && slot < max_slots;
    const bool tail_vector = vector_mask & kp::kVectorTail, ape_vector = vector_mask & kp::kVectorApe;
    T* const keys_ring = tail + (slot_ok ? kp::ring_offset<HEAD_DIM, KPOOL>(slot, 0, 0) : 0) + channel;
    T* const gates_ring = tail + (slot_ok ? kp::ring_offset<HEAD_DIM, KPOOL>(slot, 1, 0) : 0) + channel;
    int written = 0;
    for (int t = 0; t < next_n && slot_ok; ++t) {
        const long long position = kp::load_index(positions, positions_kind, request * next_n + t);
        if (position < 0) continue;  // padding: the ring stays byte-identical
        const int ring_position = static_cast<int>(position % KPOOL);
        kp::copy8(keys_ring + ring_position * HEAD_DIM, tail_vector,
                  k + request * k_request_stride + t * k_token_stride + channel, (vector_mask & kp::kVectorK) != 0);
        kp::copy8(gates_ring + ring_position * HEAD_DIM, tail_vector,
                  gate + request * gate_request_stride + t * gate_token_stride + channel,
                  (vector_mask & kp::kVectorGate) != 0);
        if (ring_position != KPOOL - 1 || written >= pools_per_request) continue;

        // Ring positions 0 .. KPOOL - 1 of these 8 channels were written by
        // this thread, in this call or an earlier one.
        float result[kp::kChannelsPerThread];
        kp::pool8<KPOOL>(
            [&](int m, float(&keys)[kp::kChannelsPerThread], float(&logits)[kp::kChannelsPerThread]) {
                kp::load8(keys_ring + m * HEAD_DIM, tail_vector, keys);
                kp::load8(gates_ring + m * HEAD_DIM, tail_vector, logits);
            },
            ape + channel, ape_row_stride, ape_vector, result);
        const long long row = request * pools_per_request + written;
        kp::store8(pooled + row * HEAD_DIM + channel, (vector_mask & kp::kVectorOut) != 0, result);
        if (lead) closed[row] = static_cast<int>(position / KPOOL);  // fits: checked with validate=True
        ++written;
    }
    if (lead)
        for (int w = written; w < pools_per_request; ++w) closed[request * pools_per_request + w] = -1;
}
