// kpool_compress: one pooled key per complete pool of kpool tokens.
//
//     logits[m, c] = gate[member m, c] + ape[m, c]
//     w[:, c]      = softmax over m of logits[:, c]
//     pooled[p, c] = sum_m w[m, c] * k[member m, c]
//
// The softmax runs per channel, not per member: each channel has its own
// weights. Inputs are [total_tokens, head_dim] at any row stride, ape is
// float32 [kpool, head_dim], pooled is [>= total_pools, head_dim].
// kpool_compress_fp8 is the same pooling with the FP8 epilogue fused
// (kernels/kpool_fp8.cuh): e4m3fn bytes and a scale per pool, into rows or
// a paged cache.
#include "kpool_fp8.cuh"

namespace kp {

// The request that probably owns `pool`: its share of the pools the grid
// covers scaled to the batch, right when every request completes as many
// pools (prefill of equal prompts, decode of one pool each) and the host
// knew the count (`guess_pools`, the launch's; its bound otherwise), so no
// load waits to be divided by. float32 with a correctly rounded reciprocal:
// a few instructions (a double or 64-bit integer division costs dozens), and
// the reference computes the same bits. 0 <= pool < the grid's groups,
// which exceed guess_pools by less than a block's: the product fits int64,
// and the clamp keeps the guess in [0, batch).
__device__ __forceinline__ long long guess_request(long long pool, long long guess_pools, long long batch) {
    const float share = static_cast<float>(pool) * static_cast<float>(batch);
    // The host passes at least 1; a hand-made launch's smaller count is taken as 1, so no guess leaves the batch.
    const float scaled = share * kp_rcp_rn(static_cast<float>(guess_pools < 1 ? 1 : guess_pools));
    const long long guess = static_cast<long long>(scaled);
    return guess < batch - 1 ? guess : batch - 1;
}

// Finds the first token row of `pool` and whether the pool may be written.
//
// The pool's request is guess_request's when pool_row_offsets confirm it
// (its offsets bracket the pool), else the last b with
// pool_row_offsets[b] <= pool by binary search: on sorted offsets the same
// request, found in one round trip of loads for the common shapes, since the
// guess's five index reads are issued together, beside the caller's read of
// the pool count (total_pools, the last offset): the guess does not wait for
// it. A pool at or past the count is never searched for and never located. Its members are kpool
// consecutive rows starting after the `align` leading tokens that complete a
// pool opened by the cached prefix. Every value read here may be garbage when
// the caller skipped validation, so each step is checked before it is used
// to form an address: a pool whose members are not all inside its request's
// rows and [0, total_tokens) is not written at all. Also gives the pool's
// request and its number q in the request (positions [q * KPOOL,
// (q + 1) * KPOOL)), -1 for a cached length of 2^62 or more, which only
// garbage has (a paged cache's block table needs q).
template <int KPOOL, typename IO, typename IC, typename IP>
__device__ __forceinline__ bool locate_pool(long long pool, long long guess_pools, const IO* input_row_offsets,
                                            const IC* cache_lengths, const IP* pool_row_offsets, long long batch,
                                            long long total_tokens, long long* first_row, long long* owner,
                                            long long* number) {
    // The count and the guess's five reads issue together, each kept as loaded until all have issued: a
    // widening right after a load is an instruction that waits for it, and the reads after it would too.
    long long request = guess_request(pool, guess_pools, batch);
    const IP total_read = pool_row_offsets[batch];
    const IP begin_read = pool_row_offsets[request], end_read = pool_row_offsets[request + 1];
    const IO rows_begin_read = input_row_offsets[request], rows_end_read = input_row_offsets[request + 1];
    const IC cached_read = cache_lengths[request];
    const long long total_pools = static_cast<long long>(total_read);  // load_index's widening, each
    long long pool_begin = static_cast<long long>(begin_read), pool_end = static_cast<long long>(end_read);
    long long row_begin = static_cast<long long>(rows_begin_read), row_end = static_cast<long long>(rows_end_read);
    long long cached = static_cast<long long>(cached_read);
    bool rows_ok = row_begin >= 0 && row_end <= total_tokens && row_begin <= row_end && cached >= 0;  // request_rows'
    const bool counted = pool < total_pools;  // no early return here: ptxas would move it before the reads
    if (counted && (pool < pool_begin || pool >= pool_end)) {  // a wrong guess: search
        request = find_request(pool_row_offsets, batch, pool);
        pool_begin = load_index(pool_row_offsets, request);
        pool_end = load_index(pool_row_offsets, request + 1);
        rows_ok = request_rows(input_row_offsets, cache_lengths, request, total_tokens, &row_begin, &row_end, &cached);
    }
    // pool_begin >= 0 keeps pool - pool_begin from overflowing below.
    if (!counted || pool_begin < 0 || pool < pool_begin || pool >= pool_end || !rows_ok) return false;

    const long long local_pool = pool - pool_begin;  // >= 0, and bounded below before it scales
    if (local_pool > (row_end - row_begin) / KPOOL) return false;
    const long long phase = cached % KPOOL;
    const long long align = phase == 0 ? 0 : KPOOL - phase;
    const long long first = row_begin + align + local_pool * KPOOL;
    if (first + KPOOL > row_end) return false;
    *first_row = first;
    *owner = request;
    *number = cached < (1LL << 62) ? cached / KPOOL + (phase != 0) + local_pool : -1;
    return true;
}

// The pool `pool` of the batch into result (float32, unrounded): false, and
// result untouched, when it is past the count or cannot be located. Once the
// pool is located and before its loads, prepare(request, number) runs (an
// FP8 writer finds the pool's cache slot there, so that its reads overlap
// the pool's; the pool does not wait for them). Both compress kernels pool
// through here, so their pools are the same bits.
template <typename KT, typename GT, int HEAD_DIM, int KPOOL, int VECTOR, typename IO, typename IC, typename IP,
          typename Prepare>
__device__ __forceinline__ bool compress_pool(long long pool, int channel, const KT* k, long long k_row_stride,
                                              const GT* gate, long long gate_row_stride, const float* ape,
                                              long long ape_row_stride, const IO* input_row_offsets,
                                              const IC* cache_lengths, const IP* pool_row_offsets, long long batch,
                                              long long total_tokens, long long guess_pools,
                                              float (&result)[kChannelsPerThread], Prepare prepare) {
    // The last offset is the exact pool count: surplus groups leave in locate_pool.
    if (batch <= 0) return false;  // no request to guess
    long long first_row, request, number;
    if (!locate_pool<KPOOL>(pool, guess_pools, input_row_offsets, cache_lengths, pool_row_offsets, batch,
                            total_tokens, &first_row, &request, &number))
        return false;
    prepare(request, number);
    // Members of a located pool all exist, so nothing below is masked.
    const KT* k_member = k + first_row * k_row_stride + channel;
    const GT* gate_member = gate + first_row * gate_row_stride + channel;
    pool8<KPOOL, KT, GT, vector_bits(VECTOR, kVectorK), vector_bits(VECTOR, kVectorGate),
          vector_bits(VECTOR, kVectorApe)>(
        [&](int m, const KT** key_row, const GT** gate_row) {
            *key_row = k_member + m * k_row_stride;
            *gate_row = gate_member + m * gate_row_stride;
        },
        ape + channel, ape_row_stride, result);
    return true;
}

}  // namespace kp

// The pooling inputs both compress kernels take, in the order
// kpool_cupy/kernel/declarations.py declares them (_COMPRESS_INPUTS), and
// the same names passed on to kp::compress_pool.
#define KP_COMPRESS_INPUT_PARAMS                                                                                  \
    const KT *__restrict__ k, long long k_row_stride, const GT *__restrict__ gate, long long gate_row_stride,     \
        const float *__restrict__ ape, long long ape_row_stride, const IO *__restrict__ input_row_offsets,        \
        const IC *__restrict__ cache_lengths, const IP *__restrict__ pool_row_offsets, long long batch,           \
        long long total_tokens, long long guess_pools
#define KP_COMPRESS_INPUT_ARGS                                                                                    \
    k, k_row_stride, gate, gate_row_stride, ape, ape_row_stride, input_row_offsets, cache_lengths, pool_row_offsets, \
        batch, total_tokens, guess_pools

namespace kp {

// A pool through compress_pool into a writer (kpool_fp8.cuh): its place
// found before the pool's loads, its row written after. A pool that goes
// nowhere still runs the writer (an FP8 row's lanes meet the warp's at its
// shuffles) and stores nothing. What both compress kernels run.
template <typename KT, typename GT, int HEAD_DIM, int KPOOL, int VECTOR, typename IO, typename IC, typename IP,
          typename Writer>
__device__ __forceinline__ void compress_into(long long pool, int channel, KP_COMPRESS_INPUT_PARAMS, Writer& writer) {
    bool placed = false;
    float result[kChannelsPerThread];
    if (!compress_pool<KT, GT, HEAD_DIM, KPOOL, VECTOR>(
            pool, channel, KP_COMPRESS_INPUT_ARGS, result,
            [&](long long request, long long number) { placed = writer.prepare(pool, request, number); }))
        return;
    writer.write(pool, channel, placed, result);
}

}  // namespace kp

// One group of head_dim / 8 threads per pool, several pools per block; each
// thread owns 8 consecutive channels of its pool.
//
// The op is memory-bound: each member row of k and gate is read once, as
// 16-byte vectors where addresses allow, and each pooled row written once.
// Without ROTATE threads never talk to each other, which is also what lets
// the emulator run this same kernel one thread at a time. All row arithmetic is 64-bit, since
// rows times stride passes 2^31 on long prompts.
//
// VECTOR: kp::VectorAccess bits of k, gate, ape and pooled (compile time).
// ROTATE: write the Hadamard rotation of each pool (kp::store_pooled); its
// lanes then meet at shuffles, and a group with no pool leaves as a whole.
// IO, IC, IP: the element types of input_row_offsets, cache_lengths and
// pool_row_offsets (int, unsigned int or long long).
template <typename KT, typename GT, typename OT, int HEAD_DIM, int KPOOL, int VECTOR, bool ROTATE, typename IO,
          typename IC, typename IP>
__global__ void __launch_bounds__(kp::pool_block_threads<KT, GT, HEAD_DIM, KPOOL>(),
                                  kp::pool_blocks_per_sm<KT, GT, HEAD_DIM, KPOOL>())
    kpool_compress(KP_COMPRESS_INPUT_PARAMS, OT* __restrict__ pooled, long long pooled_row_stride,
                   long long pooled_rows) {
    static_assert(KPOOL >= 1, "kpool must be at least 1");
    KP_THREADS_COOPERATE(ROTATE);
    long long pool;
    int channel;
    if (!kp::thread_group<HEAD_DIM>(&pool, &channel) || batch <= 0 || pool >= pooled_rows) return;
    // Rows of `pooled` past the pool count are never written.
    kp::PooledRowWriter<OT, HEAD_DIM, ROTATE, kp::vector_bits(VECTOR, kp::kVectorOut)> writer{pooled,
                                                                                              pooled_row_stride};
    kp::compress_into<KT, GT, HEAD_DIM, KPOOL, VECTOR>(pool, channel, KP_COMPRESS_INPUT_ARGS, writer);
}

// kpool_compress with the FP8 epilogue fused: each pool's float32 result
// goes through kp::fp8_epilogue (bf16 x, the rotation, the scale, e4m3fn
// bytes) in registers, and only its bytes and scale are written, to output
// row `pool` or to the pool's cache slot (kp::Fp8Sink, TARGET), read beside
// the pool's loads. The values equal the epilogue applied to kpool_compress's
// own float32 result.
//
// The epilogue's shuffles name the whole warp (kp::kWarpLanes): a group with
// no pool to write leaves the kernel, and the warp's other group goes on.
// HEAD_DIM: a power of two, 8 to 256. VECTOR: kp::VectorAccess bits of k,
// gate and ape, and kVectorOut for 8-byte value stores. ID: the element type
// of slots or the block table. ROUND_SCALE: power-of-two scales.
template <typename KT, typename GT, int HEAD_DIM, int KPOOL, int VECTOR, int TARGET, bool ROUND_SCALE, typename IO,
          typename IC, typename IP, typename ID>
__global__ void __launch_bounds__(kp::pool_block_threads<KT, GT, HEAD_DIM, KPOOL>(),
                                  kp::pool_blocks_per_sm<KT, GT, HEAD_DIM, KPOOL>())
    kpool_compress_fp8(KP_COMPRESS_INPUT_PARAMS, KP_FP8_SINK_PARAMS(ID)) {
    static_assert(KPOOL >= 1, "kpool must be at least 1");
    KP_THREADS_COOPERATE(true);
    long long pool;
    int channel;
    if (!kp::thread_group<HEAD_DIM>(&pool, &channel) || batch <= 0) return;
    const kp::Fp8Sink<HEAD_DIM, TARGET, ID> sink{KP_FP8_SINK_ARGS};
    kp::Fp8RowWriter<HEAD_DIM, TARGET, ID, ROUND_SCALE, kp::vector_bits(VECTOR, kp::kVectorOut)> writer{sink, nullptr,
                                                                                                   nullptr};
    kp::compress_into<KT, GT, HEAD_DIM, KPOOL, VECTOR>(pool, channel, KP_COMPRESS_INPUT_ARGS, writer);
}

// ---------------------------------------------------------------------------
// The backward pass of kpool_compress. For one pool, with g = d loss / d pooled:
//
//     d k[m, c]    = w[m, c] * g[c]
//     d l[m, c]    = w[m, c] * g[c] * (k[m, c] - pooled[c])    (l = gate + ape)
//     d gate[m, c] = d l[m, c]
//     d ape[m, c]  = sum over every pool of d l[m, c]
//
// w and pooled are recomputed from k, gate and ape through the forward's own
// reduction (kp::pool_channels8: the same chunks, so pooled has the forward's
// bits), never stored. Then w[m] = exp(l[m] - max) * (1 / weight sum), 1 for
// the maximum itself, as the forward weighs it. float32 throughout, one
// rounding of each stored gradient.
namespace kp {

// Eight channels of a gradient row as float32, at any column stride (0
// included: autograd hands in expanded gradients), 16-byte words when VECTOR
// (unit column stride, rows 16-byte aligned).
template <bool VECTOR, typename T>
__device__ __forceinline__ void load_gradient8(const T* row, long long column_stride,
                                               float (&grad)[kChannelsPerThread]) {
    if constexpr (VECTOR) {
        Row8<T, true> words;
        words.load(row);
#pragma unroll
        for (int c = 0; c < kChannelsPerThread; ++c) grad[c] = words[c];
    } else {
#pragma unroll
        for (int c = 0; c < kChannelsPerThread; ++c) grad[c] = to_float(row[c * column_stride]);
    }
}

// Whether the backward keeps a whole pool's rows in registers (read once):
// where the forward loads the pool in one chunk, so the recomputed pool has
// its bits, and the rows take at most kBackwardWholeBytes, since the thread
// also holds 32 floats of softmax state and gradient (at 384 bytes, 4
// float32 members, ptxas spills under the 128-register bound). Larger pools
// are read twice: reduced as the forward streams them, then member by member.
enum : int { kBackwardWholeBytes = 320 };
template <int KPOOL, typename KT, typename GT>
__host__ __device__ constexpr bool backward_whole_pool() {
    constexpr int kMemberBytes = kChannelsPerThread * (sizeof(KT) + sizeof(GT) + sizeof(float));
    return chunk_members<KPOOL, KT, GT>() == KPOOL && KPOOL * kMemberBytes <= kBackwardWholeBytes;
}

// One pool's softmax state over a thread's 8 channels, and the pool's gradient.
struct PoolGradient {
    float max_logit[kChannelsPerThread];
    float inverse_sum[kChannelsPerThread];
    float pooled[kChannelsPerThread];
    float grad[kChannelsPerThread];

    __device__ __forceinline__ void set(const PoolChannel (&channels)[kChannelsPerThread]) {
#pragma unroll
        for (int c = 0; c < kChannelsPerThread; ++c) {
            max_logit[c] = channels[c].max_logit;
            inverse_sum[c] = kp_rcp(channels[c].weight_sum);
            pooled[c] = channels[c].weighted_keys * inverse_sum[c];  // PoolChannel::value()'s bits
        }
    }
    // Member m's gradients of its key and of its logit at channel c.
    __device__ __forceinline__ void member(int c, float logit, float key, float* grad_key, float* grad_logit) const {
        const float exp_weight = kp_exp2((logit - max_logit[c]) * kLog2e);
        const float weight = (logit == max_logit[c] ? 1.0f : exp_weight) * inverse_sum[c];
        const float scaled = weight * grad[c];
        *grad_key = scaled;
        *grad_logit = scaled * (key - pooled[c]);
    }
};

// The blocks' partial sums of d ape: each block adds its groups' d l of
// member m in group order (0, 1, ...) into partials[blockIdx.x][m][:]. The
// members go in rounds of round_members() (as many as kExchangeBytes of
// shared memory hold for every thread's 8 channels): each thread leaves its
// d l of a member in the round's slot (member_slot), and at the round's last
// member (round_end) the block meets once, sums every member of the round,
// and meets again before the next round reuses the slots. A thread without a
// pool brings zeros; every thread runs every member, so all reach each
// barrier.
enum : int { kExchangeBytes = 32 * 1024 };
template <int HEAD_DIM, int KPOOL>
__host__ __device__ constexpr int round_members() {
    constexpr int kMemberBytes = group_block_bound(HEAD_DIM) * kChannelsPerThread * static_cast<int>(sizeof(float));
    constexpr int kMost = kExchangeBytes / kMemberBytes > 0 ? kExchangeBytes / kMemberBytes : 1;
    return KPOOL < kMost ? KPOOL : kMost;
}

template <int HEAD_DIM, int KPOOL>
__device__ __forceinline__ void member_slot(float* exchange, bool in_group, int member,
                                            const float (&grad_logit)[kChannelsPerThread]) {
    constexpr int kSlot = group_block_bound(HEAD_DIM) * kChannelsPerThread;
    if (in_group) {  // threadIdx.x * 8 is the group's row HEAD_DIM times its index, plus the channel
        float* slot = exchange + (member % round_members<HEAD_DIM, KPOOL>()) * kSlot + threadIdx.x * kChannelsPerThread;
#pragma unroll
        for (int c = 0; c < kChannelsPerThread; ++c) slot[c] = grad_logit[c];
    }
}

// At member m: when m ends a round, the round's sums into partials (every
// thread calls it with the same m).
template <int HEAD_DIM, int KPOOL>
__device__ __forceinline__ void round_end(float* exchange, float* partials, int member) {
    constexpr int kRound = round_members<HEAD_DIM, KPOOL>();
    constexpr int kSlot = group_block_bound(HEAD_DIM) * kChannelsPerThread;
    constexpr unsigned int kLanes = HEAD_DIM / kChannelsPerThread;
    if (member % kRound != kRound - 1 && member != KPOOL - 1) return;
    const int first = member - member % kRound;
    const unsigned int groups = blockDim.x / kLanes;
    __syncthreads();
    for (unsigned int item = threadIdx.x; item < static_cast<unsigned int>(member - first + 1) * HEAD_DIM;
         item += blockDim.x) {
        const unsigned int j = item / HEAD_DIM, column = item % HEAD_DIM;
        const float* slot = exchange + j * kSlot + column;
        float sum = slot[0];
        for (unsigned int g = 1; g < groups; ++g) sum += slot[g * HEAD_DIM];
        partials[(static_cast<long long>(blockIdx.x) * KPOOL + first + j) * HEAD_DIM + column] = sum;
    }
    if (member != KPOOL - 1) __syncthreads();  // the next round writes the slots
}

// Member m's gradients: grad_key and grad_gate rows stored (when the pool was
// located) and its d l handed to the block's sum.
template <int HEAD_DIM, int KPOOL, bool KEY_VECTOR, bool GATE_VECTOR, typename KT, typename GT, typename KeyRow,
          typename GateRow, typename BiasRow>
__device__ __forceinline__ void member_gradients(const PoolGradient& pool, bool located, int m, const KeyRow& key,
                                                 const GateRow& gate, const BiasRow& bias, KT* grad_key_row,
                                                 GT* grad_gate_row, float* exchange, bool in_group, float* partials) {
    float grad_key[kChannelsPerThread], grad_logit[kChannelsPerThread];
    if (located) {  // one branch around the member's channels (one a channel, when each was under its own test)
#pragma unroll
        for (int c = 0; c < kChannelsPerThread; ++c)
            pool.member(c, gate[c] + bias[c], key[c], &grad_key[c], &grad_logit[c]);
        store8<KEY_VECTOR>(grad_key_row, grad_key);
        store8<GATE_VECTOR>(grad_gate_row, grad_logit);
    } else {
#pragma unroll
        for (int c = 0; c < kChannelsPerThread; ++c) grad_key[c] = grad_logit[c] = 0.0f;
    }
    member_slot<HEAD_DIM, KPOOL>(exchange, in_group, m, grad_logit);
    round_end<HEAD_DIM, KPOOL>(exchange, partials, m);
}

}  // namespace kp

// d ape: element e of [KPOOL, HEAD_DIM] is the sum of the `blocks` partials
// kpool_compress_backward wrote, in a fixed order: a block of kApeSlices x
// kApeColumns threads takes kApeColumns consecutive elements (a warp's loads
// are 4 whole 32-byte sectors); slice s sums blocks s, s + kApeSlices, ...
// in order, then the slices' sums are added pairwise, neighbours first:
// ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)) and so on up to
// kApeSlices, the first two levels by shuffles inside a warp (its 4 slices),
// the rest by warp 0 from shared memory. Narrow blocks make many of them
// (kpool * head_dim / 8: 64 at kpool 4, head_dim 128, each on its own SM)
// and many slices keep many loads in flight, kApeLoads a thread at once;
// the order is the same on every run.
namespace kp {
enum : int { kApeSlices = 64, kApeColumns = 8, kApeLoads = 16 };
constexpr int kApeWarps = kApeSlices * kApeColumns / 32;
constexpr int kApeWarpSlices = 32 / kApeColumns;  // 4 slices a warp
static_assert(kApeWarpSlices == 4 && kApeWarps == 4 * kApeWarpSlices, "the pairwise levels below assume these");
}  // namespace kp

template <int HEAD_DIM, int KPOOL>
__global__ void __launch_bounds__(kp::kApeSlices * kp::kApeColumns)
    kpool_compress_backward_ape(const float* __restrict__ partials, long long blocks, float* __restrict__ grad_ape,
                                long long grad_ape_row_stride) {
    KP_THREADS_COOPERATE(true);
    constexpr long long kElements = static_cast<long long>(KPOOL) * HEAD_DIM;
    __shared__ float warp_sums[kp::kApeWarps][kp::kApeColumns];
    const int column = static_cast<int>(threadIdx.x % kp::kApeColumns);
    const int slice = static_cast<int>(threadIdx.x / kp::kApeColumns);
    const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
    const long long e = static_cast<long long>(blockIdx.x) * kp::kApeColumns + column;
    // A batch's kApeLoads loads issue together (ptxas puts 14 of 16 before the first add on sm_90), then their
    // adds in block order: a loop of one load and its add would wait a round trip for each block (ptxas runs an
    // unrolled loop's remainder that way). A block past the last reads as -0, which adds nothing (x + -0 is x
    // for every x, +0 and NaN included), so the adds need no predicate of their own. A slice's sum starts at
    // -0 too, or +0 where it holds no block, as the sum of nothing (so a call without pools gives +0).
    float sum = slice < blocks ? -0.0f : 0.0f;
    for (long long first = slice; e < kElements && first < blocks; first += kp::kApeLoads * kp::kApeSlices) {
        float part[kp::kApeLoads];
#pragma unroll
        for (int i = 0; i < kp::kApeLoads; ++i) {
            const long long b = first + static_cast<long long>(i) * kp::kApeSlices;
            part[i] = b < blocks ? partials[b * kElements + e] : -0.0f;
        }
#pragma unroll
        for (int i = 0; i < kp::kApeLoads; ++i) sum += part[i];
    }
    // Slices 2 j and 2 j + 1 of a warp are lanes kApeColumns apart, j and j + 2 twice that.
    sum += __shfl_down_sync(0xffffffffu, sum, kp::kApeColumns);
    sum += __shfl_down_sync(0xffffffffu, sum, 2 * kp::kApeColumns);
    if (lane < kp::kApeColumns) warp_sums[warp][column] = sum;
    __syncthreads();
    if (warp == 0) {
        // Lane 8 q + c: warps 4 q .. 4 q + 3's sums of column c, pairwise; then the same two levels across q.
        const int q = lane / kp::kApeColumns;
        const float* w = &warp_sums[4 * q][column];
        float total = (w[0] + w[kp::kApeColumns]) + (w[2 * kp::kApeColumns] + w[3 * kp::kApeColumns]);
        total += __shfl_down_sync(0xffffffffu, total, kp::kApeColumns);
        total += __shfl_down_sync(0xffffffffu, total, 2 * kp::kApeColumns);
        if (lane < kp::kApeColumns && e < kElements)
            grad_ape[(e / HEAD_DIM) * grad_ape_row_stride + e % HEAD_DIM] = total;
    }
}

// The gradient rows of the tokens no pool of this call covers, zero: one
// group of head_dim / 8 threads a request (`block`: the block's place
// among kpool_compress_backward's rest blocks), which writes the rows
// before its first pool (those completing a pool the cached prefix opened)
// and after its last (its unfinished pool), at most KPOOL - 1 of each, as
// consistent offsets have them. The pool blocks write every other row, so
// on consistent offsets no row is written twice and the outputs need no
// clearing first. Garbage offsets may leave rows unwritten, or have a pool
// block and a rest block write one row (which value stays is then
// unspecified), but make nothing outside the arrays be written.
namespace kp {
template <typename KT, typename GT, int HEAD_DIM, int KPOOL, int VECTOR, typename IO, typename IC, typename IP>
__device__ __forceinline__ void clear_rows_outside_pools(long long block, const IO* input_row_offsets,
                                                         const IC* cache_lengths, const IP* pool_row_offsets,
                                                         long long batch, long long total_tokens, KT* grad_k,
                                                         long long grad_k_row_stride, GT* grad_gate,
                                                         long long grad_gate_row_stride) {
    long long request;
    int channel;
    if (!thread_group<HEAD_DIM>(block, &request, &channel) || request >= batch) return;
    long long row_begin, row_end, cached;
    if (!request_rows(input_row_offsets, cache_lengths, request, total_tokens, &row_begin, &row_end, &cached))
        return;
    const long long pool_begin = load_index(pool_row_offsets, request);
    const long long pool_end = load_index(pool_row_offsets, request + 1);
    const long long pools = pool_begin < 0 || pool_end < pool_begin ? 0 : pool_end - pool_begin;  // no overflow
    const long long rows = row_end - row_begin;
    const long long phase = cached % KPOOL;
    const long long align = phase == 0 ? 0 : KPOOL - phase;
    const long long head = align < rows ? align : rows;  // rows before the first pool
    // Pools past what the rows hold (only garbage claims them) cover nothing.
    const long long fits = (rows - head) / KPOOL;
    const long long covered = head + (pools < fits ? pools : fits) * KPOOL;
    const long long tail_begin = covered > rows - (KPOOL - 1) ? covered : rows - (KPOOL - 1);
    float zeros[kChannelsPerThread];
#pragma unroll
    for (int c = 0; c < kChannelsPerThread; ++c) zeros[c] = 0.0f;
    const auto clear = [&](long long r) {
        const long long row = row_begin + r;
        store8<vector_bits(VECTOR, kVectorK)>(grad_k + row * grad_k_row_stride + channel, zeros);
        store8<vector_bits(VECTOR, kVectorGate)>(grad_gate + row * grad_gate_row_stride + channel, zeros);
    };
    // At most KPOOL - 1 rows each: kept rolled, one store of each gradient row a loop.
#pragma unroll 1
    for (long long r = 0; r < head; ++r) clear(r);
#pragma unroll 1
    for (long long r = tail_begin > head ? tail_begin : head; r < rows; ++r) clear(r);
}
}  // namespace kp

// Two kinds of block. The first pool_blocks: one group of head_dim / 8
// threads per pool, as kpool_compress; each thread recomputes its pool's 8
// channels and writes its members' d k and d gate rows. The rest: one group
// a request, which zeroes the rows of its tokens in no complete pool
// (kp::clear_rows_outside_pools), so the gradients take one launch. A
// pool whose members fit the forward's prefetch (kp::chunk_members: the
// whole pool, within kp::kBackwardWholeBytes) keeps its rows in registers, so
// k, gate and ape are read once; a larger pool reads them again, member by
// member. d ape goes to `partials`
// ([pool_blocks, KPOOL, HEAD_DIM] float32), which kpool_compress_backward_ape
// sums in a fixed order: no float atomics, so two runs give the same bits.
// Every thread of a pool block reaches every barrier, so none leaves early.
//
// VECTOR: kp::VectorAccess bits: kVectorK for k and grad_k together,
// kVectorGate for gate and grad_gate, kVectorApe, and kVectorOut for grad
// (unit column stride and 16-byte rows).
template <typename KT, typename GT, typename DT, int HEAD_DIM, int KPOOL, int VECTOR, typename IO, typename IC,
          typename IP>
__global__ void __launch_bounds__(kp::group_block_bound(HEAD_DIM),
                                  kp::kMaxThreadsPerBlock / kp::group_block_bound(HEAD_DIM))
    kpool_compress_backward(KP_COMPRESS_INPUT_PARAMS, const DT* __restrict__ grad, long long grad_row_stride,
                            long long grad_column_stride, long long grad_rows, KT* __restrict__ grad_k,
                            long long grad_k_row_stride, GT* __restrict__ grad_gate, long long grad_gate_row_stride,
                            float* __restrict__ partials, long long pool_blocks) {
    static_assert(KPOOL >= 1, "kpool must be at least 1");
    KP_THREADS_COOPERATE(true);
    if (blockIdx.x >= pool_blocks) {  // a whole block, before any barrier
        kp::clear_rows_outside_pools<KT, GT, HEAD_DIM, KPOOL, VECTOR>(
            blockIdx.x - pool_blocks, input_row_offsets, cache_lengths, pool_row_offsets, batch, total_tokens, grad_k,
            grad_k_row_stride, grad_gate, grad_gate_row_stride);
        return;
    }
    constexpr bool kKeyVector = kp::vector_bits(VECTOR, kp::kVectorK);
    constexpr bool kGateVector = kp::vector_bits(VECTOR, kp::kVectorGate);
    constexpr bool kApeVector = kp::vector_bits(VECTOR, kp::kVectorApe);
    constexpr bool kWhole = kp::backward_whole_pool<KPOOL, KT, GT>();
    __shared__ float exchange[kp::round_members<HEAD_DIM, KPOOL>() * kp::group_block_bound(HEAD_DIM) *
                              kp::kChannelsPerThread];
    long long pool;
    int channel;
    const bool in_group = kp::thread_group<HEAD_DIM>(&pool, &channel);
    bool located = false;
    long long first_row = 0;
    if (in_group && batch > 0 && pool < grad_rows) {
        long long request, number;
        located = kp::locate_pool<KPOOL>(pool, guess_pools, input_row_offsets, cache_lengths, pool_row_offsets,
                                         batch, total_tokens, &first_row, &request, &number);
    }
    const KT* k_member = k + first_row * k_row_stride + channel;
    const GT* gate_member = gate + first_row * gate_row_stride + channel;
    KT* grad_k_member = grad_k + first_row * grad_k_row_stride + channel;
    GT* grad_gate_member = grad_gate + first_row * grad_gate_row_stride + channel;
    kp::PoolGradient state;
    if constexpr (kWhole) {
        // The whole pool in registers: loaded once, reduced as pool_chunk reduces it.
        kp::Row8<KT, kKeyVector> keys[KPOOL];
        kp::Row8<GT, kGateVector> gates[KPOOL];
        kp::Row8<float, kApeVector> bias[KPOOL];
        if (located) {
#pragma unroll
            for (int m = 0; m < KPOOL; ++m) bias[m].load(ape + m * ape_row_stride + channel);
#pragma unroll
            for (int m = 0; m < KPOOL; ++m) keys[m].load(k_member + m * k_row_stride);
#pragma unroll
            for (int m = 0; m < KPOOL; ++m) gates[m].load(gate_member + m * gate_row_stride);
            kp::load_gradient8<kp::vector_bits(VECTOR, kp::kVectorOut)>(
                grad + pool * grad_row_stride + channel * grad_column_stride, grad_column_stride, state.grad);
            kp::PoolChannel channels[kp::kChannelsPerThread];
            kp::add_rows<KPOOL, true>(keys, gates, bias, channels);  // as pool_chunk reduces a whole pool
            state.set(channels);
        }
#pragma unroll
        for (int m = 0; m < KPOOL; ++m)
            kp::member_gradients<HEAD_DIM, KPOOL, kKeyVector, kGateVector>(
                state, located, m, keys[m], gates[m], bias[m], grad_k_member + m * grad_k_row_stride,
                grad_gate_member + m * grad_gate_row_stride, exchange, in_group, partials);
    } else {
        if (located) {
            kp::load_gradient8<kp::vector_bits(VECTOR, kp::kVectorOut)>(
                grad + pool * grad_row_stride + channel * grad_column_stride, grad_column_stride, state.grad);
            kp::PoolChannel channels[kp::kChannelsPerThread];
            kp::pool_channels8<KPOOL, KT, GT, kKeyVector, kGateVector, kApeVector>(
                [&](int m, const KT** key_row, const GT** gate_row) {
                    *key_row = k_member + m * k_row_stride;
                    *gate_row = gate_member + m * gate_row_stride;
                },
                ape + channel, ape_row_stride, channels);
            state.set(channels);
        }
#pragma unroll 1
        for (int m = 0; m < KPOOL; ++m) {
            kp::Row8<KT, kKeyVector> key;
            kp::Row8<GT, kGateVector> gate_row;
            kp::Row8<float, kApeVector> bias;
            if (located) {
                bias.load(ape + m * ape_row_stride + channel);
                key.load(k_member + m * k_row_stride);
                gate_row.load(gate_member + m * gate_row_stride);
            }
            kp::member_gradients<HEAD_DIM, KPOOL, kKeyVector, kGateVector>(
                state, located, m, key, gate_row, bias, grad_k_member + m * grad_k_row_stride,
                grad_gate_member + m * grad_gate_row_stride, exchange, in_group, partials);
        }
    }
}

