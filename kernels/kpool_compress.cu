// kpool_compress: one pooled key per complete pool of kpool tokens.
//
//     logits[m, c] = gate[member m, c] + ape[m, c]
//     w[:, c]      = softmax over m of logits[:, c]
//     pooled[p, c] = sum_m w[m, c] * k[member m, c]
//
// The softmax runs per channel, not per member: each channel has its own
// weights. Inputs are [total_tokens, head_dim] at any row stride, ape is
// float32 [kpool, head_dim], pooled is [>= total_pools, head_dim].
#include "kpool_common.cuh"

namespace kp {

// Finds the first token row of `pool` and whether the pool may be written.
//
// The pool's request is the last b with pool_row_offsets[b] <= pool. Its
// members are kpool consecutive rows starting after the `align` leading
// tokens that complete a pool opened by the cached prefix. Every value read
// here may be garbage when the caller skipped validation, so each step is
// checked before it is used to form an address: a pool whose members are not
// all inside its request's rows and [0, total_tokens) is not written at all.
template <int KPOOL>
__device__ __forceinline__ bool locate_pool(long long pool, const void* input_row_offsets, int input_kind,
                                            const void* cache_lengths, int cache_kind,
                                            const void* pool_row_offsets, int pool_kind, long long batch,
                                            long long total_tokens, long long* first_row) {
    const long long request = find_request(pool_row_offsets, pool_kind, batch, pool);
    const long long pool_begin = load_index(pool_row_offsets, pool_kind, request);
    const long long pool_end = load_index(pool_row_offsets, pool_kind, request + 1);
    // pool_begin >= 0 keeps pool - pool_begin from overflowing below.
    if (pool_begin < 0 || pool < pool_begin || pool >= pool_end) return false;

    long long row_begin, row_end, cached;
    if (!request_rows(input_row_offsets, input_kind, cache_lengths, cache_kind, request, total_tokens, &row_begin,
                      &row_end, &cached))
        return false;

    const long long local_pool = pool - pool_begin;  // >= 0, and bounded below before it scales
    if (local_pool > (row_end - row_begin) / KPOOL) return false;
    const long long phase = cached % KPOOL;
    const long long align = phase == 0 ? 0 : KPOOL - phase;
    const long long first = row_begin + align + local_pool * KPOOL;
    if (first + KPOOL > row_end) return false;
    *first_row = first;
    return true;
}

}  // namespace kp

// One group of head_dim / 8 threads per pool, several pools per block; each
// thread owns 8 consecutive channels of its pool.
//
// The op is memory-bound: each member row of k and gate is read once, as
// 16-byte vectors where addresses allow, and each pooled row written once.
// Threads never talk to each other, which is also what lets the emulator run
// this same kernel one thread at a time. All row arithmetic is 64-bit, since
// rows times stride passes 2^31 on long prompts.
//
// vector_mask: kp::VectorAccess bits of k, gate, ape and pooled.
template <typename KT, typename GT, typename OT, int HEAD_DIM, int KPOOL>
__global__ void kpool_compress(const KT* __restrict__ k, long long k_row_stride, const GT* __restrict__ gate,
                               long long gate_row_stride, const float* __restrict__ ape, long long ape_row_stride,
                               const void* __restrict__ input_row_offsets, int input_kind,
                               const void* __restrict__ cache_lengths, int cache_kind,
                               const void* __restrict__ pool_row_offsets, int pool_kind, long long batch,
                               long long total_tokens, OT* __restrict__ pooled, long long pooled_row_stride,
                               long long pooled_rows, int vector_mask) {
    static_assert(KPOOL >= 1, "kpool must be at least 1");
    long long pool;
    int channel;
    if (!kp::thread_group<HEAD_DIM>(&pool, &channel) || batch <= 0) return;

    // The last offset is the exact pool count, so surplus threads exit here;
    // rows of `pooled` past it are never written.
    const long long total_pools = kp::load_index(pool_row_offsets, pool_kind, batch);
    if (pool >= total_pools || pool >= pooled_rows) return;

    long long first_row;
    if (!kp::locate_pool<KPOOL>(pool, input_row_offsets, input_kind, cache_lengths, cache_kind, pool_row_offsets,
                                pool_kind, batch, total_tokens, &first_row))
        return;

    // Members of a located pool all exist, so nothing below is masked.
    const KT* k_member = k + first_row * k_row_stride + channel;
    const GT* gate_member = gate + first_row * gate_row_stride + channel;
    const bool k_vector = vector_mask & kp::kVectorK, gate_vector = vector_mask & kp::kVectorGate;
    float result[kp::kChannelsPerThread];
    kp::pool8<KPOOL>(
        [&](int m, float(&keys)[kp::kChannelsPerThread], float(&logits)[kp::kChannelsPerThread]) {
            kp::load8(k_member + m * k_row_stride, k_vector, keys);
            kp::load8(gate_member + m * gate_row_stride, gate_vector, logits);
        },
        ape + channel, ape_row_stride, (vector_mask & kp::kVectorApe) != 0, result);
    kp::store8(pooled + pool * pooled_row_stride + channel, (vector_mask & kp::kVectorOut) != 0, result);
}
