// Selected pools back to token positions, one column at a time: what
// kpool_expand_topk writes and what kpool_index_topk writes after it has
// selected, so both expand a pool id alike.
//
//     positions[t, s * kpool + j] = pool_ids[t, s] * kpool + j        (pool_ids[t, s] >= 0)
//     positions[t, s * kpool + j] = -1                                 (pool_ids[t, s] < 0)
//
// A -1 id (no selection) stays -1 in all its columns, never a clamped valid
// position; so does an id whose positions would not fit int32. With
// always_select_tail, kpool - 1 more columns hold the query's trailing
// positions no complete pool covers yet: with visible = cache_len + local + 1,
// column i < visible % kpool holds visible - visible % kpool + i, the rest -1.
// With a block table each position p becomes its cache slot
// block_table[b, p / block_size] * block_size + p % block_size, -1 for a
// block past the table, a negative entry, or a slot past int32.
//
// Every index read may be garbage when the caller skipped validation; each
// is checked before it forms an address.
#ifndef KPOOL_EXPAND_CUH
#define KPOOL_EXPAND_CUH

#include "kpool_common.cuh"

namespace kp {

// The request whose rows hold `token`, or -1 (no request, unusable rows, or
// a cached length of 2^62 or more); *visible: the positions it sees,
// cache_len + local + 1 (0 for -1).
template <typename IO, typename IC>
__device__ __forceinline__ long long expand_request(long long token, const IO* input_row_offsets,
                                                    const IC* cache_lengths, long long batch, long long total_tokens,
                                                    long long* visible) {
    *visible = 0;
    if (batch <= 0) return -1;
    const long long candidate = find_request(input_row_offsets, batch, token);
    long long row_begin, row_end, cached;
    if (!request_rows(input_row_offsets, cache_lengths, candidate, total_tokens, &row_begin, &row_end, &cached) ||
        token < row_begin || token >= row_end || cached >= (1LL << 62))
        return -1;
    *visible = cached + (token - row_begin) + 1;
    return candidate;
}

// Position j of pool `pool`: pool * kpool + j, or -1 for a negative pool or
// one whose last position would not fit int32 (kpool <= 1024: no product
// here overflows, and no division: a run-time 64-bit one is a call).
__device__ __forceinline__ long long pool_position(long long pool, long long j, long long kpool) {
    return pool >= 0 && pool <= 2147483647LL && pool * kpool + (kpool - 1) <= 2147483647LL ? pool * kpool + j : -1;
}

// Tail column i of a token of `request` that sees `visible` positions, of
// which `partial` = visible % kpool are past its last complete pool.
__device__ __forceinline__ long long tail_position(long long request, long long visible, long long partial,
                                                   long long i) {
    if (request < 0) return -1;
    const long long value = i < partial ? visible - partial + i : -1;
    return value > 2147483647LL ? -1 : value;
}

// A position's cache slot through `request`'s row of the block table (row b
// at b * table_stride entries), -1 where there is none. Positions fit int32
// and block_size <= 2^20, so the block is a 32-bit division.
__device__ __forceinline__ long long paged_slot(long long value, long long request, const int* block_table,
                                                long long max_blocks, long long table_stride, long long block_size) {
    if (value < 0 || value > 2147483647LL) return -1;
    const unsigned int size = static_cast<unsigned int>(block_size);
    const unsigned int block = static_cast<unsigned int>(value) / size;
    const long long entry = request >= 0 && block < max_blocks ? block_table[request * table_stride + block] : -1;
    return entry >= 0 && entry * block_size + (block_size - 1) <= 2147483647LL
               ? entry * block_size + (static_cast<unsigned int>(value) - block * size)
               : -1;
}

}  // namespace kp

#endif  // KPOOL_EXPAND_CUH
