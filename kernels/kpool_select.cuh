// The pool_topk largest logits of a row, by one block: the selection rule
// of kpool_index_topk, which kpool_index_select_fp8 shares.
//
// Rule: a larger logit first; equal logits: the lower pool id; -0.0 equals
// +0.0; every NaN, whatever its sign, below every number (-inf included).
// order_key maps a logit to an unsigned key with exactly that order (NaN
// 0), so the rule is: larger key first, then lower pool id.
//
// Streaming, one read of each logit: candidates arrive in ascending pool id,
// a chunk of kSelectChunk at a time, and the block appends the ones that can
// still be selected to a shared buffer, in order. When a chunk would not
// fit, the buffer is cut back to its k best (a radix select finds the k-th
// largest key K in four 8-bit rounds, then a stable compaction keeps every
// key above K and the lowest-id keys equal to K), and from then on only keys
// above K are appended: a later candidate equal to K has a higher id than
// every kept one and loses to all k of them. The buffer stays in ascending
// pool id, so the selection comes out sorted with no sort.
#ifndef KPOOL_SELECT_CUH
#define KPOOL_SELECT_CUH

#include "kpool_expand.cuh"

namespace kp {

constexpr int kSelectThreads = 256;
constexpr int kSelectWarps = kSelectThreads / 32;
constexpr int kSelectPerThread = 4;  // consecutive candidates a thread takes from a chunk
constexpr int kSelectChunk = kSelectThreads * kSelectPerThread;

// A logit's place in the selection order as an unsigned key.
__device__ __forceinline__ unsigned int order_key(float logit) {
    unsigned int bits = kp_float_to_bits(logit);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0u;  // NaN, either sign
    if (bits == 0x80000000u) bits = 0u;                  // -0.0 as +0.0
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Exclusive prefix sum of `value` over the block's threads in thread order;
// *total: the sum over all. Every thread of the block calls it together.
__device__ __forceinline__ unsigned int block_exclusive_sum(unsigned int value, unsigned int* total) {
    __shared__ unsigned int warp_sums[kSelectWarps];
    const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
    unsigned int inclusive = value;
#pragma unroll
    for (int delta = 1; delta < 32; delta *= 2) {
        const unsigned int other = __shfl_up_sync(0xffffffffu, inclusive, delta);
        if (lane >= delta) inclusive += other;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    unsigned int before = 0, sum = 0;
#pragma unroll
    for (int w = 0; w < kSelectWarps; ++w) {
        before += w < warp ? warp_sums[w] : 0u;
        sum += warp_sums[w];
    }
    __syncthreads();  // warp_sums is free again for the next call
    *total = sum;
    return before + inclusive - value;
}

// The shared buffer of candidates, ascending pool id: keys[i], ids[i] for
// i < count. CAP: the largest k it serves (a multiple of kSelectThreads).
template <int CAP>
struct SelectBuffer {
    static constexpr int kSize = CAP + kSelectChunk;
    static constexpr int kPerThread = kSize / kSelectThreads;  // a thread's share when cutting back
    static_assert(CAP % kSelectThreads == 0, "CAP a multiple of the block");
    unsigned int keys[kSize];
    int ids[kSize];
    unsigned int histogram[256];
    unsigned int found[2];
};

// The k-th largest key among the buffer's count (> k) keys: *greater, how
// many keys lie above it. Four rounds of an 8-bit histogram over the keys
// that match the digits found so far.
template <int CAP>
__device__ __forceinline__ unsigned int kth_largest_key(SelectBuffer<CAP>& buffer, int count, int k,
                                                        unsigned int* greater) {
    unsigned int prefix = 0u, prefix_mask = 0u;
    unsigned int wanted = static_cast<unsigned int>(k);  // the rank still to find among the matching keys
    for (int shift = 24; shift >= 0; shift -= 8) {
        buffer.histogram[threadIdx.x] = 0u;  // kSelectThreads == 256 bins
        __syncthreads();
        for (int i = static_cast<int>(threadIdx.x); i < count; i += kSelectThreads) {
            const unsigned int key = buffer.keys[i];
            if ((key & prefix_mask) == prefix) atomicAdd(&buffer.histogram[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        // Thread j looks at digit 255 - j: the keys in higher digits are the exclusive sum before it.
        const unsigned int digit = 255u - threadIdx.x;
        const unsigned int here = buffer.histogram[digit];
        unsigned int total;
        const unsigned int above = block_exclusive_sum(here, &total);
        if (above < wanted && above + here >= wanted) {
            buffer.found[0] = digit;
            buffer.found[1] = above;
        }
        __syncthreads();
        prefix |= buffer.found[0] << shift;
        prefix_mask |= 255u << shift;
        wanted -= buffer.found[1];
        __syncthreads();  // found is read before the next round writes it
    }
    *greater = static_cast<unsigned int>(k) - wanted;
    return prefix;
}

// Cuts the buffer's count (> k) candidates back to its k best, in order:
// every key above the k-th largest K, then as many keys equal to K as
// there is room for, lowest ids first. Returns K.
template <int CAP>
__device__ __forceinline__ unsigned int cut_back(SelectBuffer<CAP>& buffer, int count, int k) {
    unsigned int greater;
    const unsigned int threshold = kth_largest_key(buffer, count, k, &greater);
    const unsigned int ties = static_cast<unsigned int>(k) - greater;  // keys equal to K that stay
    constexpr int kShare = SelectBuffer<CAP>::kPerThread;
    const int first = static_cast<int>(threadIdx.x) * kShare;
    unsigned int keys[kShare];
    int ids[kShare];
    unsigned int above = 0u, equal = 0u;
#pragma unroll
    for (int e = 0; e < kShare; ++e) {
        const bool held = first + e < count;
        keys[e] = held ? buffer.keys[first + e] : 0u;
        ids[e] = held ? buffer.ids[first + e] : -1;
        above += held && keys[e] > threshold;
        equal += held && keys[e] == threshold;
    }
    // Both counts in one sum: each stays below 2^16 (kSize <= 5120).
    unsigned int total;
    const unsigned int before = block_exclusive_sum(above | (equal << 16), &total);
    unsigned int above_before = before & 0xffffu, equal_before = before >> 16;
#pragma unroll
    for (int e = 0; e < kShare; ++e) {
        if (first + e >= count) break;
        const unsigned int kept_equal = equal_before < ties ? equal_before : ties;
        if (keys[e] > threshold) {
            buffer.keys[above_before + kept_equal] = keys[e];
            buffer.ids[above_before + kept_equal] = ids[e];
            ++above_before;
        } else if (keys[e] == threshold) {
            if (equal_before < ties) {
                buffer.keys[above_before + equal_before] = keys[e];
                buffer.ids[above_before + equal_before] = ids[e];
            }
            ++equal_before;
        }
    }
    __syncthreads();
    return threshold;
}

// Where a block's selection stands: count candidates in the buffer, and
// once it has been cut back, the threshold a new key must beat. The same in
// every thread of the block.
struct SelectState {
    int count = 0;
    bool cut = false;
    unsigned int threshold = 0u;
};

// One chunk of candidates, all with higher ids than any offered before:
// this thread's mine (<= kSelectPerThread) keys and ids, in id order across
// the block's threads. Every thread of the block calls it together.
template <int CAP>
__device__ __forceinline__ void offer_chunk(SelectBuffer<CAP>& buffer, SelectState& state,
                                            const unsigned int (&keys)[kSelectPerThread],
                                            const int (&ids)[kSelectPerThread], int mine, int k) {
    for (;;) {
        unsigned int entering = 0u;
#pragma unroll
        for (int e = 0; e < kSelectPerThread; ++e)
            entering += e < mine && (!state.cut || keys[e] > state.threshold);
        unsigned int total;
        unsigned int at = static_cast<unsigned int>(state.count) + block_exclusive_sum(entering, &total);
        if (state.count + static_cast<int>(total) > SelectBuffer<CAP>::kSize) {
            // No room for the chunk: cut back to k (count > k here, since total <= kSelectChunk) and look
            // at the chunk again under the new threshold.
            state.threshold = cut_back(buffer, state.count, k);
            state.cut = true;
            state.count = k;
            continue;
        }
#pragma unroll
        for (int e = 0; e < kSelectPerThread; ++e)
            if (e < mine && (!state.cut || keys[e] > state.threshold)) {
                buffer.keys[at] = keys[e];
                buffer.ids[at] = ids[e];
                ++at;
            }
        state.count += static_cast<int>(total);
        __syncthreads();
        return;
    }
}

// After the last chunk: the buffer's first min(count, k) entries are the k
// best, ascending id.
template <int CAP>
__device__ __forceinline__ void finish_selection(SelectBuffer<CAP>& buffer, SelectState& state, int k) {
    if (state.count > k) {
        state.threshold = cut_back(buffer, state.count, k);
        state.cut = true;
        state.count = k;
    }
}

// The k best of candidates 0 .. candidates - 1, where load_keys(first,
// keys, count) gives the keys of pools first .. first + count - 1 (count <=
// kSelectPerThread): kSelectPerThread consecutive candidates a thread, a
// chunk at a time. Leaves min(candidates, k) entries in the buffer.
template <int CAP, typename LoadKeys>
__device__ __forceinline__ SelectState select_best(SelectBuffer<CAP>& buffer, long long candidates, int k,
                                                   LoadKeys load_keys) {
    SelectState state;
    for (long long chunk = 0; chunk < candidates; chunk += kSelectChunk) {
        const long long first = chunk + static_cast<long long>(threadIdx.x) * kSelectPerThread;
        const long long left = candidates - first;
        const int mine = left <= 0 ? 0 : (left < kSelectPerThread ? static_cast<int>(left) : kSelectPerThread);
        unsigned int keys[kSelectPerThread];
        int ids[kSelectPerThread];
#pragma unroll
        for (int e = 0; e < kSelectPerThread; ++e) ids[e] = static_cast<int>(first + e);
        if (mine > 0) load_keys(first, keys, mine);
        offer_chunk(buffer, state, keys, ids, mine, k);
    }
    finish_selection(buffer, state, k);
    return state;
}

// Writes token `token`'s row of positions [num_tokens, width] (kpool_expand.cuh's
// rules) from its selection: pools 0 .. selected - 1 when `all`, else
// buffer.ids[0 .. selected). With COMPACT the valid entries packed left and
// their number in counts[token]. Every thread of the block calls it together.
template <bool PAGED, bool COMPACT, int CAP, typename IO, typename IC>
__device__ __forceinline__ void write_selection(const SelectBuffer<CAP>& buffer, bool all, long long selected,
                                                long long token, const IO* input_row_offsets,
                                                const IC* cache_lengths, long long batch, long long num_tokens,
                                                long long kpool, long long pool_topk, const int* block_table,
                                                long long max_blocks, long long block_table_stride,
                                                long long block_size, int* positions, long long width,
                                                int* counts) {
    long long visible_positions = 0;
    const long long request =
        expand_request(token, input_row_offsets, cache_lengths, batch, num_tokens, &visible_positions);
    const long long visible = visible_positions;  // a copy the lambda takes by value: no local memory
    const long long partial = visible % kpool;     // once a token: a run-time 64-bit division is a call
    // Columns and kpool fit 32 bits (pool_topk <= 4096, kpool <= 1024): the slot is a 32-bit division.
    const unsigned int pool_columns = static_cast<unsigned int>(pool_topk * kpool);
    const unsigned int per_pool = static_cast<unsigned int>(kpool);
    auto column_value = [&buffer, all, selected, request, visible, partial, pool_columns, per_pool, kpool,
                         block_table, max_blocks, block_table_stride, block_size](long long column) -> long long {
        const unsigned int c = static_cast<unsigned int>(column);
        long long value;
        if (c < pool_columns) {
            const unsigned int slot = c / per_pool;
            const long long pool = slot < selected ? (all ? slot : buffer.ids[slot]) : -1;
            value = pool_position(pool, c - slot * per_pool, kpool);
        } else {
            value = tail_position(request, visible, partial, c - pool_columns);
        }
        return PAGED ? paged_slot(value, request, block_table, max_blocks, block_table_stride, block_size) : value;
    };
    int* const out = positions + token * width;
    if (!COMPACT) {
        for (long long column = threadIdx.x; column < width; column += kSelectThreads)
            out[column] = static_cast<int>(column_value(column));
        return;
    }
    long long kept = 0;
    for (long long base = 0; base < width; base += kSelectThreads) {
        const long long column = base + threadIdx.x;
        const long long value = column < width ? column_value(column) : -1;
        unsigned int total;
        const long long at = kept + block_exclusive_sum(value >= 0 ? 1u : 0u, &total);
        if (value >= 0) out[at] = static_cast<int>(value);
        kept += total;
    }
    for (long long column = kept + threadIdx.x; column < width; column += kSelectThreads) out[column] = -1;
    if (threadIdx.x == 0) counts[token] = static_cast<int>(kept);
}

}  // namespace kp

#endif  // KPOOL_SELECT_CUH
