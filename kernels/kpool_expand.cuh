// Selected pools back to token positions: what kpool_expand_topk writes and
// what kpool_index_topk and kpool_index_select_fp8 write after they have
// selected, by the same code, so all three expand a pool id alike. Column by
// column:
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
// A block writes a token's row (write_expanded_row): the token's request is
// found once, by one warp, and each thread writes runs of kExpandRun
// consecutive columns, one pool id and one table entry a run where kpool
// and block_size let a run stay in one pool and one page. A row is at most
// 2^31 - 1 columns wide (the host refuses wider), so a column is 32 bits.
//
// Every index read may be garbage when the caller skipped validation; each
// is checked before it forms an address.
#ifndef KPOOL_EXPAND_CUH
#define KPOOL_EXPAND_CUH

#include "kpool_common.cuh"

namespace kp {

constexpr int kExpandThreads = 256;  // a block that writes rows (the selecting kernels' blocks too)
constexpr int kExpandWarps = kExpandThreads / 32;
constexpr int kExpandRun = 4;  // consecutive columns a thread writes together: 16 bytes
constexpr int kExpandSpan = kExpandThreads * kExpandRun;  // columns a block writes in one pass
// Levels of the request search one warp reads in one round trip: its 31 nodes, one a lane.
constexpr int kSearchLevels = 5;

// Exclusive prefix sum of `value` over the block's kExpandThreads threads in
// thread order; *total: the sum over all. Every thread of the block calls it
// together.
__device__ __forceinline__ unsigned int block_exclusive_sum(unsigned int value, unsigned int* total) {
    __shared__ unsigned int warp_sums[kExpandWarps];
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
    for (int w = 0; w < kExpandWarps; ++w) {
        before += w < warp ? warp_sums[w] : 0u;
        sum += warp_sums[w];
    }
    __syncthreads();  // warp_sums is free again for the next call
    *total = sum;
    return before + inclusive - value;
}

// The type a request search compares offsets in: a 32-bit array's own type,
// with the item clamped to that type's range (every offset of the array is
// at most the clamped item exactly when it is at most the item: items are
// not negative), else 64 bits.
template <typename IO>
struct SearchValue {
    using type = long long;
};
template <>
struct SearchValue<int> {
    using type = int;
};
template <>
struct SearchValue<unsigned int> {
    using type = unsigned int;
};

template <typename V>
__device__ __forceinline__ V search_key(long long item) {
    constexpr long long most = sizeof(V) == 8 ? 9223372036854775807LL
                               : static_cast<V>(-1) > 0 ? 4294967295LL
                                                        : 2147483647LL;
    return static_cast<V>(item < most ? item : most);
}

// kp::find_request then kp::request_rows for `item`, by the 32 lanes of a
// warp together: each round reads the next kSearchLevels levels of the
// search at once (a lane a node: the offset and the length at its mid, into
// shared memory), then every lane walks them, so a batch of up to
// 2^(2 kSearchLevels) requests costs two round trips where the search took
// one a step. The walk takes exactly the search's steps (which mid a node
// reads does not depend on the data), so garbage offsets land where
// kp::find_request lands; the rows and length come from the steps' own
// reads: offsets[lo] where the walk last went right, offsets[hi + 1] where
// it last went left. The nodes pass through shared memory, not shuffles:
// ptxas held the fused select to 128 registers, and spilled, around
// shuffles in a loop only some warps run. The walk is 32-bit (requests:
// the host refuses more than 2^31 - 1; offsets: SearchValue). batch > 0; one
// warp calls it.
template <typename IO, typename IC>
__device__ __forceinline__ bool warp_request_rows(const IO* offsets, const IC* lengths, long long batch,
                                                  long long total_tokens, long long item, long long* request,
                                                  long long* row_begin, long long* row_end, long long* cached) {
    using V = typename SearchValue<IO>::type;
    constexpr int kNodes = (1 << kSearchLevels) - 1;
    struct Node {  // a step's two reads together: one shared load
        V offset;
        IC length;
    };
    __shared__ Node nodes[kNodes];
    const int lane = static_cast<int>(threadIdx.x % 32);
    const V key = search_key<V>(item);
    // Clamped as well as refused by the host: no batch makes a read past offsets[batch].
    const long long last = batch - 1 < 2147483646LL ? batch - 1 : 2147483646LL;
    int lo = 0, hi = static_cast<int>(last);
    V at_lo = static_cast<V>(offsets[0]);         // offsets[lo]
    IC length_lo = lengths[0];                    // lengths[lo]
    V above = static_cast<V>(offsets[last + 1]);  // offsets[hi + 1]
    while (lo < hi) {  // the same on every lane
        int mid;
        if (lane < kNodes && search_node_mid(lane + 1, lo, hi, &mid)) {
            nodes[lane] = Node{static_cast<V>(offsets[mid]), lengths[mid]};
        }
        __syncwarp();
        int node = 1;
        for (int level = 0; level < kSearchLevels && lo < hi; ++level) {
            const int m = lo + (hi - lo + 1) / 2;
            const Node read = nodes[node - 1];
            if (read.offset <= key) {
                lo = m;
                at_lo = read.offset;
                length_lo = read.length;
                node = 2 * node + 1;
            } else {
                hi = m - 1;
                above = read.offset;
                node = 2 * node;
            }
        }
        __syncwarp();  // every lane has walked before the next round's nodes overwrite these
    }
    *request = lo;
    *row_begin = static_cast<long long>(at_lo);  // widened as load_index widens
    *row_end = static_cast<long long>(above);
    *cached = static_cast<long long>(length_lo);
    return *row_begin >= 0 && *row_end <= total_tokens && *row_begin <= *row_end && *cached >= 0;
}

// What a token's row needs of its request: the request (-1: no request,
// unusable rows, the token outside them, or a cached length of 2^62 or
// more), and its tail: with visible = cache_len + local + 1 positions seen,
// tail column i < tail_count holds tail_base + i, where tail_base = visible
// - visible % kpool and tail_count = visible % kpool, less the columns whose
// position would pass int32 (0 without a request).
struct ExpandRow {
    long long request;
    int tail_base;
    unsigned int tail_count;
};

// `token`'s ExpandRow, found by the block's first warp and read by every
// thread; with `needed` false (no block table, no tail) nothing is read and
// the row has no request. Every thread of the block calls it together.
template <typename IO, typename IC>
__device__ __forceinline__ ExpandRow block_expand_row(bool needed, long long token, const IO* input_row_offsets,
                                                      const IC* cache_lengths, long long batch,
                                                      long long total_tokens, long long kpool) {
    __shared__ ExpandRow shared;
    if (!needed || batch <= 0) return ExpandRow{-1, 0, 0u};
    if (threadIdx.x < 32) {
        long long request, row_begin, row_end, cached;
        const bool rows = warp_request_rows(input_row_offsets, cache_lengths, batch, total_tokens, token, &request,
                                            &row_begin, &row_end, &cached);
        if (threadIdx.x == 0) {
            ExpandRow row{-1, 0, 0u};
            if (rows && token >= row_begin && token < row_end && cached < (1LL << 62)) {
                const long long visible = cached + (token - row_begin) + 1;
                const long long partial = visible % kpool;  // once a row: a run-time 64-bit division is a call
                const long long base = visible - partial;
                const long long room = base <= 2147483647LL ? 2147483648LL - base : 0;  // positions up to int32's
                row.request = request;
                row.tail_base = room > 0 ? static_cast<int>(base) : 0;
                row.tail_count = static_cast<unsigned int>(partial < room ? partial : room);
            }
            shared = row;
        }
    }
    __syncthreads();
    const ExpandRow row = shared;
    __syncthreads();  // shared is free again for the block's next row
    return row;
}

// Where a row's positions go: the token KV cache's block table (PAGED), and
// the row's shape.
struct ExpandTarget {
    const int* block_table;
    long long max_blocks, table_stride;
    Divisor block_size;         // 1 without PAGED
    unsigned int width;         // columns of the row
    unsigned int pool_columns;  // pool_topk * kpool: the columns before the tail's
    Divisor kpool;
    long long max_pool;  // the largest pool id whose positions all fit int32
    int max_entry;       // the largest table entry whose slots all fit int32
    // Whether a run inside the pool columns lies in one pool and one page: kpool and (PAGED) block_size
    // multiples of kExpandRun, as every run's first column is. One id and one table entry serve it then.
    bool whole;
};

// kpool <= 1024, block_size <= 2^20 (the host's bounds), width < 2^31.
template <bool PAGED>
__device__ __forceinline__ ExpandTarget expand_target(const int* block_table, long long max_blocks,
                                                      long long table_stride, long long block_size, long long width,
                                                      long long pool_columns, long long kpool) {
    const unsigned int size = PAGED ? static_cast<unsigned int>(block_size) : 1u;
    const unsigned int per_pool = static_cast<unsigned int>(kpool);
    return ExpandTarget{block_table,
                        max_blocks,
                        table_stride,
                        divisor_of(size),
                        static_cast<unsigned int>(width),
                        static_cast<unsigned int>(pool_columns),
                        divisor_of(per_pool),
                        (2147483647u - (per_pool - 1)) / per_pool,
                        static_cast<int>((2147483647u - (size - 1)) / size),
                        per_pool % kExpandRun == 0 && (!PAGED || size % kExpandRun == 0)};
}

// A run of kExpandRun columns from `first`: the pool ids it reads, as
// they are stored (ID: the ids' element type, widened by signed_index only
// when they are looked at), then its values. `one`: a whole run inside the
// pool columns, worked out from its first column.
template <typename ID>
struct ExpandRun {
    unsigned int first;
    bool one;
    ID pool[kExpandRun];    // each pool column's id as read (-1 as ID: none; a whole run: pool[0] only)
    int value[kExpandRun];  // -1 past the width
};

// Reads the run's pool ids, pool_of(slot) (-1: no pool), and nothing else:
// it needs no row, and no id is looked at before run_values, so a kernel
// may issue these loads before its request search. A whole run reads one
// id; any other run reads each pool column's, all issued together.
template <typename ID, typename PoolOf>
__device__ __forceinline__ void run_pools(ExpandRun<ID>& run, const ExpandTarget& t, PoolOf pool_of) {
    run.one = t.whole && run.first + kExpandRun <= t.pool_columns;
#pragma unroll
    for (int r = 0; r < kExpandRun; ++r) {
        const unsigned int c = run.first + r;
        run.pool[r] = (r == 0 || !run.one) && c < t.pool_columns ? pool_of(t.kpool.quotient(c)) : static_cast<ID>(-1);
    }
}

// Column first + r's position before paging (-1: none): its pool's
// position pool * kpool + c % kpool, -1 for a negative pool or one whose
// last position would not fit int32; or the tail's. POOLED: the column is
// known to lie in the pool columns.
template <bool POOLED = false, typename ID>
__device__ __forceinline__ int run_position(const ExpandRun<ID>& run, int r, const ExpandRow& row,
                                            const ExpandTarget& t) {
    const unsigned int c = run.first + r;
    if (POOLED || c < t.pool_columns) {
        const long long pool = signed_index(run.pool[r]);
        const unsigned int member = c - t.kpool.quotient(c) * t.kpool.size;  // c % kpool
        return pool >= 0 && pool <= t.max_pool ? static_cast<int>(static_cast<unsigned int>(pool) * t.kpool.size + member)
                                               : -1;
    }
    const unsigned int i = c - t.pool_columns;
    return c < t.width && i < row.tail_count ? row.tail_base + static_cast<int>(i) : -1;
}

// The run's values: positions from its ids and the row, then (PAGED) each
// position's slot, block_table[request, p / block_size] * block_size + p %
// block_size (-1 for a block past the table, a negative entry, or one whose
// slots pass int32), every table entry read before any is looked at. A
// whole run reads one, and its values are consecutive (or all -1: one
// pool, one page). WHOLE: the run is known whole (run.one), inside the pool
// columns.
template <bool PAGED, bool WHOLE = false, typename ID>
__device__ __forceinline__ void run_values(ExpandRun<ID>& run, const ExpandRow& row, const ExpandTarget& t) {
    const int columns = WHOLE || run.one ? 1 : kExpandRun;
    int position[kExpandRun], entry[kExpandRun];
    unsigned int block[kExpandRun];
#pragma unroll
    for (int r = 0; r < kExpandRun; ++r) {
        position[r] = r < columns ? run_position<WHOLE>(run, r, row, t) : -1;
        block[r] = PAGED && position[r] >= 0 ? t.block_size.quotient(static_cast<unsigned int>(position[r])) : 0u;
        entry[r] = PAGED && position[r] >= 0 && row.request >= 0 && block[r] < t.max_blocks
                       ? t.block_table[row.request * t.table_stride + block[r]]
                       : -1;
    }
#pragma unroll
    for (int r = 0; r < kExpandRun; ++r) {
        const unsigned int offset = static_cast<unsigned int>(position[r]) - block[r] * t.block_size.size;
        run.value[r] = !PAGED ? position[r]
                       : entry[r] >= 0 && entry[r] <= t.max_entry
                           ? static_cast<int>(static_cast<unsigned int>(entry[r]) * t.block_size.size + offset)
                           : -1;
    }
    if (WHOLE || run.one) {
#pragma unroll
        for (int r = 1; r < kExpandRun; ++r) run.value[r] = run.value[0] < 0 ? -1 : run.value[0] + r;
    }
}

// Writes a run's values at out[first ..] (those below `end`): one 16-byte
// store where the run is whole and aligned.
template <typename ID>
__device__ __forceinline__ void store_run(const ExpandRun<ID>& run, int* out, unsigned int end) {
    int* const at = out + run.first;
    if (run.first + kExpandRun <= end && (reinterpret_cast<unsigned long long>(at) & 15) == 0) {
        uint4 v;  // the values' bits
        v.x = static_cast<unsigned int>(run.value[0]);
        v.y = static_cast<unsigned int>(run.value[1]);
        v.z = static_cast<unsigned int>(run.value[2]);
        v.w = static_cast<unsigned int>(run.value[3]);
        kp_store16(at, v);
        return;
    }
#pragma unroll
    for (int r = 0; r < kExpandRun; ++r)
        if (run.first + r < end) at[r] = run.value[r];
}

// Writes a whole row `out` by its runs: without COMPACT every column; with
// COMPACT its valid entries packed left in column order, -1 after, their
// number in *count (thread 0's). Every thread of the block calls it
// together. Without COMPACT, where runs lie in one pool and one page
// (t.whole), the passes of kExpandSpan columns inside the pool columns come
// first, in a loop of their own: a run there reads one id and one table
// entry and stores once, with no column's own path (run_values<PAGED, true>);
// the rest of the row (the tail's columns, any partial pass) follows in the
// general loop.
template <bool PAGED, bool COMPACT, typename PoolOf>
__device__ __forceinline__ void write_expanded_row(const ExpandRow& row, const ExpandTarget& t, PoolOf pool_of,
                                                   int* out, int* count) {
    using ID = decltype(pool_of(0u));
    ExpandRun<ID> run;
    unsigned int base = 0;
    if (!COMPACT && t.whole) {
        // The host makes a row at least its pool columns wide; a launch made by hand may not, and no pass may
        // write past its row.
        const unsigned int whole_end = t.pool_columns < t.width ? t.pool_columns : t.width;
        for (; base + kExpandSpan <= whole_end; base += kExpandSpan) {
            run.first = base + threadIdx.x * kExpandRun;
            run.pool[0] = pool_of(t.kpool.quotient(run.first));  // the run's other ids are never read
            run_values<PAGED, true>(run, row, t);
            store_run(run, out, t.width);
        }
    }
    unsigned int kept = 0;
    for (; base < t.width; base += kExpandSpan) {
        run.first = base + threadIdx.x * kExpandRun;
        run_pools(run, t, pool_of);
        run_values<PAGED>(run, row, t);
        if (!COMPACT) {
            if (run.first < t.width) store_run(run, out, t.width);
            continue;
        }
        unsigned int valid = 0;
#pragma unroll
        for (int r = 0; r < kExpandRun; ++r) valid += run.value[r] >= 0 ? 1u : 0u;
        unsigned int total;
        unsigned int at = kept + block_exclusive_sum(valid, &total);
#pragma unroll
        for (int r = 0; r < kExpandRun; ++r)
            if (run.value[r] >= 0) out[at++] = run.value[r];
        kept += total;
    }
    if (!COMPACT) return;
    for (unsigned int column = kept + threadIdx.x; column < t.width; column += kExpandThreads) out[column] = -1;
    if (threadIdx.x == 0) *count = static_cast<int>(kept);
}

}  // namespace kp

#endif  // KPOOL_EXPAND_CUH
