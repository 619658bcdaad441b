// The pool_topk largest logits of a row, by one block: the selection rule
// of kpool_index_topk, which kpool_index_select_fp8 shares.
//
// Rule: a larger logit first; equal logits: the lower pool id; -0.0 equals
// +0.0; every NaN, whatever its sign, below every number (-inf included).
// order_key maps a logit to an unsigned key with exactly that order (NaN
// 0), so the rule is: larger key first, then lower pool id.
//
// Streaming, each logit offered once: candidates arrive in ascending pool id,
// a tile at a time in registers (SelectTile: GROUPS groups of 4 a thread,
// each warp's share one contiguous run), and the block appends the ones
// that can still be selected to a shared buffer, in order: a warp ranks its
// candidates with one shuffle scan, the block with one barrier. When a tile
// would not fit, the buffer and the tile are cut back together to their k
// best (a radix select finds the k-th largest key K in up to four 8-bit
// rounds, fewer where the keys left are all K, or the digits of it that
// already part the k best from the rest, then a stable compaction keeps
// every key above K and the lowest-id keys equal to K), and from then on
// only keys above K are offered: one comparison a candidate, and a later
// candidate equal to K has a higher id than every
// kept one and loses to all k of them. The buffer stays in ascending pool
// id, so the selection comes out sorted with no sort. The order candidates
// arrive in changes how often a cut comes, never the result; select_best
// starts a long range from a threshold its sample sets (a chunk's worth,
// read first), so a range cuts back about once, at its end, however its
// logits rise with pool id. A warp whose keys share a digit adds them to the
// histogram at once, so equal, NaN or slowly rising keys do not queue a
// whole warp on one bin.
#ifndef KPOOL_SELECT_CUH
#define KPOOL_SELECT_CUH

#include "kpool_expand.cuh"

namespace kp {

constexpr int kSelectThreads = 256;
constexpr int kSelectWarps = kSelectThreads / 32;
constexpr int kSelectPerThread = 4;  // consecutive candidates a thread takes from a chunk
constexpr int kSelectChunk = kSelectThreads * kSelectPerThread;

// A logit's place in the selection order as an unsigned key: a positive
// number's (+0.0 included) its bits with the top one set, a negative one's
// 0x80000000 less its magnitude (so -0.0 takes +0.0's key, a larger
// magnitude a lower key, -inf 0x00800000); NaN's 0.
__device__ __forceinline__ unsigned int order_key(float logit) {
    const unsigned int bits = kp_float_to_bits(logit);
    const unsigned int magnitude = bits & 0x7fffffffu;
    const unsigned int key = (bits & 0x80000000u) ? 0x80000000u - magnitude : (bits | 0x80000000u);
    return magnitude > 0x7f800000u ? 0u : key;  // NaN, either sign
}

static_assert(kSelectThreads == kExpandThreads, "a selecting block writes its row as an expanding one");

// The shared buffer of candidates, ascending pool id: keys[i], ids[i] for
// i < count. CAP: the largest k it serves (a multiple of kSelectThreads).
template <int CAP>
struct SelectBuffer {
    static constexpr int kSize = CAP + kSelectChunk;
    static_assert(CAP % kSelectThreads == 0, "CAP a multiple of the block");
    unsigned int keys[kSize];
    int ids[kSize];
    unsigned int histogram[256];
    unsigned int found[3];  // kth_largest_key's round: the digit, the keys above it, the keys in it
    unsigned int span[2];   // and the AND and the OR of the keys it counts, all one key where they agree
    unsigned int warp_totals[2][kSelectWarps];  // block_base's, two in turn
};

// A tile of candidates in registers: GROUPS groups of kSelectPerThread a
// thread. Candidate `tile_offset<GROUPS>(j, e)` of the tile is entry e of
// the thread's group j, so each warp holds one contiguous run of the tile,
// in the order (group, lane, entry): a warp ranks its candidates in id order
// with one shuffle scan, and the block with one barrier (block_base). With GROUPS 1
// a thread holds 4 consecutive candidates, thread t from 4 t.
template <int GROUPS>
struct SelectTile {
    static_assert(GROUPS <= 4, "warp_ranks: a thread's count in each group a byte of one word");
    unsigned int keys[GROUPS][kSelectPerThread];
    unsigned int enter;  // bit 4 j + e: offered (in the tile, and above the threshold once cut)
};

__device__ __forceinline__ bool has_bit(unsigned int bits, int group, int entry) {
    return ((bits >> (kSelectPerThread * group + entry)) & 1u) != 0u;
}
constexpr int kSelectWarpGroup = 32 * kSelectPerThread;  // a warp's candidates of one group

template <int GROUPS>
__device__ __forceinline__ int tile_offset(int group, int entry) {
    const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
    return (warp * GROUPS + group) * kSelectWarpGroup + kSelectPerThread * lane + entry;
}

// Ranks, in the warp's order, of its candidates whose bit of `pass` is set
// (has_bit): before[j], how many of the warp's pass before this thread's
// group j; the warp's count is returned. Every lane of the warp calls it
// together. A thread's count in each group, a byte a group, summed over the
// lanes below it in one scan of 5 shuffles, and the warp's from lane 31 (a
// group's bytes never carry: a warp's group holds 128 candidates).
template <int GROUPS>
__device__ __forceinline__ unsigned int warp_ranks(unsigned int pass, unsigned int (&before)[GROUPS]) {
    static_assert(GROUPS <= 4, "a byte a group in one word");
    const int lane = static_cast<int>(threadIdx.x % 32);
    unsigned int mine = 0u;
#pragma unroll
    for (int j = 0; j < GROUPS; ++j)
        mine |= static_cast<unsigned int>(__popc(pass & (0xfu << (kSelectPerThread * j)))) << (8 * j);
    unsigned int inclusive = mine;
#pragma unroll
    for (int delta = 1; delta < 32; delta *= 2) {
        const unsigned int other = __shfl_up_sync(0xffffffffu, inclusive, delta);
        if (lane >= delta) inclusive += other;
    }
    const unsigned int all = __shfl_sync(0xffffffffu, inclusive, 31);
    const unsigned int below = inclusive - mine;
    unsigned int count = 0u;
#pragma unroll
    for (int j = 0; j < GROUPS; ++j) {
        before[j] = count + ((below >> (8 * j)) & 255u);
        count += (all >> (8 * j)) & 255u;
    }
    return count;
}

// Each warp's count (`warp_count`, the same in its lanes) in, this warp's
// base (the counts of the warps before it) out, and *total the block's.
// One barrier: warp_totals stays in use until the caller's next barrier.
__device__ __forceinline__ unsigned int block_base(unsigned int (&warp_totals)[kSelectWarps], unsigned int warp_count,
                                                   unsigned int* total) {
    const int warp = static_cast<int>(threadIdx.x / 32);
    if (threadIdx.x % 32 == 0) warp_totals[warp] = warp_count;
    __syncthreads();
    unsigned int before = 0u, sum = 0u;
#pragma unroll
    for (int w = 0; w < kSelectWarps; ++w) {
        before += w < warp ? warp_totals[w] : 0u;
        sum += warp_totals[w];
    }
    *total = sum;
    return before;
}

// One for each lane where `counts` holds, into bin `digit`. A warp whose
// counting lanes share one digit adds once (logits that are all equal, or
// rise slowly, would otherwise queue their whole warp on one address).
// Every lane of the warp calls it together.
__device__ __forceinline__ void add_to_histogram(unsigned int* histogram, unsigned int digit, bool counts) {
    const unsigned int voters = __ballot_sync(0xffffffffu, counts);
    if (voters == 0u) return;  // the same in every lane
    const int leader = __ffs(static_cast<int>(voters)) - 1;
    const unsigned int leader_digit = __shfl_sync(0xffffffffu, digit, leader);
    if (__all_sync(0xffffffffu, !counts || digit == leader_digit)) {
        if (static_cast<int>(threadIdx.x % 32) == leader)
            atomicAdd(&histogram[leader_digit], static_cast<unsigned int>(__popc(voters)));
    } else if (counts) {
        atomicAdd(&histogram[digit], 1u);
    }
}

// A radix round's key: into the histogram's bin `digit` where it `counts`
// (add_to_histogram), and then into this thread's AND and OR of the keys it
// counts (kth_largest_key's tie check). Every lane of the warp calls it
// together.
__device__ __forceinline__ void count_key(unsigned int* histogram, unsigned int key, unsigned int digit, bool counts,
                                          unsigned int& common, unsigned int& any) {
    add_to_histogram(histogram, digit, counts);
    if (counts) {
        common &= key;
        any |= key;
    }
}

// The k-th largest key among the buffer's count keys and the tile's entering
// ones (more than k in all; without TILE the buffer's alone), or a key P at
// or below it: *greater, how many of them lie above P's digits (those whose
// digits found so far exceed them). Up to four rounds of an 8-bit histogram
// over the keys that match the digits found so far. A round whose keys are
// all one key (their AND is their OR) ends the search after its fill with
// that key, the k-th largest: a tie across the rank ends the search at the
// first round whose keys are all the tied key (an equal row's first, a
// mostly-NaN row's second or third), not after four. A round ends it
// early, with the digits found so far and the rest 0, where its digit holds
// exactly the keys the rank still wants (every key at or above P is then
// among the k largest and every other below them: the exact answer for a
// cut, since k - *greater keys of the digit are all it keeps), and with
// `enough` above 0 where its digit holds `enough` keys or fewer or the
// digits so far are all 0 (a lower bound only). The next call's first round
// rewrites the span words the last round read after its fill's barrier:
// every caller meets a barrier before it calls again on the same buffer
// (place_kept's or block_base's, publish_split's).
template <int CAP, int GROUPS, bool TILE = true>
__device__ __forceinline__ unsigned int kth_largest_key(SelectBuffer<CAP>& buffer, int count,
                                                        const SelectTile<GROUPS>& tile, int k, unsigned int* greater,
                                                        unsigned int enough = 0u) {
    unsigned int prefix = 0u, prefix_mask = 0u;
    unsigned int wanted = static_cast<unsigned int>(k);  // the rank still to find among the matching keys
    for (int shift = 24; shift >= 0; shift -= 8) {
        buffer.histogram[threadIdx.x] = 0u;  // kSelectThreads == 256 bins
        if (threadIdx.x == 0) {
            buffer.span[0] = 0xffffffffu;
            buffer.span[1] = 0u;
        }
        __syncthreads();
        unsigned int common = 0xffffffffu, any = 0u;  // the AND and the OR of the keys this thread counts
#pragma unroll 1
        for (int base = 0; base < count; base += kSelectThreads) {  // the same trips in every thread
            const int i = base + static_cast<int>(threadIdx.x);
            const unsigned int key = i < count ? buffer.keys[i] : 0u;
            count_key(buffer.histogram, key, (key >> shift) & 255u, i < count && (key & prefix_mask) == prefix,
                      common, any);
        }
        // The buffer's part first, so the two words are not held across the tile's keys (sm_100's unaligned
        // build spilled 32 bytes). ptxas sums a warp's first (REDUX), then one lane adds.
        atomicAnd(&buffer.span[0], common);
        atomicOr(&buffer.span[1], any);
        common = 0xffffffffu;
        any = 0u;
#pragma unroll
        for (int j = 0; j < (TILE ? GROUPS : 0); ++j)
#pragma unroll
            for (int e = 0; e < kSelectPerThread; ++e) {
                const unsigned int key = tile.keys[j][e];
                count_key(buffer.histogram, key, (key >> shift) & 255u,
                          has_bit(tile.enter, j, e) && (key & prefix_mask) == prefix, common, any);
            }
        if (TILE) {
            atomicAnd(&buffer.span[0], common);
            atomicOr(&buffer.span[1], any);
        }
        __syncthreads();
        if (buffer.span[0] == buffer.span[1]) {  // the same in every thread: every key counted is this one
            prefix = buffer.span[0];
            break;
        }
        // Thread j looks at digit 255 - j: the keys in higher digits are the exclusive sum before it.
        const unsigned int digit = 255u - threadIdx.x;
        const unsigned int here = buffer.histogram[digit];
        unsigned int total;
        const unsigned int above = block_exclusive_sum(here, &total);
        if (above < wanted && above + here >= wanted) {
            buffer.found[0] = digit;
            buffer.found[1] = above;
            buffer.found[2] = here;
        }
        __syncthreads();
        prefix |= buffer.found[0] << shift;
        prefix_mask |= 255u << shift;
        wanted -= buffer.found[1];
        const unsigned int in_digit = buffer.found[2];
        __syncthreads();  // found is read before the next round writes it
        // The same in every thread. A prefix of 0 (given `enough`) admits every key below 2^(shift) whatever the
        // digits below it: NaN's and those of the negatives nearest -inf.
        if (in_digit == wanted || in_digit <= enough || (enough > 0u && prefix == 0u)) break;
    }
    *greater = static_cast<unsigned int>(k) - wanted;
    return prefix;
}

// Where a block's selection stands: count candidates in the buffer, and
// once it has been cut back, the threshold a new key must beat. The same in
// every thread of the block.
struct SelectState {
    int count = 0;
    bool cut = false;
    unsigned int threshold = 0u;
};

// Writes the candidates of `part` (its bits of `enter`) that a cut at
// `threshold` keeps, `ties` keys equal to it kept in all, into the buffer in
// id order after the *above keys above and *equal keys equal to it already
// placed (counts the same in every thread; both are updated). id_of(j, e):
// the id of entry e of this thread's group j. Reads no buffer entry; one
// barrier, and warp_totals stays in use until the caller's next one.
template <int CAP, int GROUPS, typename IdOf>
__device__ __forceinline__ void place_kept(SelectBuffer<CAP>& buffer, unsigned int (&warp_totals)[kSelectWarps],
                                           const SelectTile<GROUPS>& part, unsigned int threshold, unsigned int ties,
                                           unsigned int* above, unsigned int* equal, IdOf id_of) {
    unsigned int is_above = 0u, is_equal = 0u;
#pragma unroll
    for (int j = 0; j < GROUPS; ++j)
#pragma unroll
        for (int e = 0; e < kSelectPerThread; ++e) {
            const int bit = kSelectPerThread * j + e;
            const unsigned int offered = (part.enter >> bit) & 1u;
            is_above |= (offered & static_cast<unsigned int>(part.keys[j][e] > threshold)) << bit;
            is_equal |= (offered & static_cast<unsigned int>(part.keys[j][e] == threshold)) << bit;
        }
    unsigned int above_before[GROUPS], equal_before[GROUPS];
    const unsigned int warp_above = warp_ranks(is_above, above_before);
    const unsigned int warp_equal = warp_ranks(is_equal, equal_before);
    // Both counts in one sum: each stays below 2^16 (a part holds at most 8,192 candidates).
    unsigned int total;
    const unsigned int base = block_base(warp_totals, warp_above | (warp_equal << 16), &total);
#pragma unroll
    for (int j = 0; j < GROUPS; ++j) {
        unsigned int a = *above + (base & 0xffffu) + above_before[j];  // keys above, and equal, before this one
        unsigned int q = *equal + (base >> 16) + equal_before[j];
#pragma unroll
        for (int e = 0; e < kSelectPerThread; ++e) {
            const unsigned int kept_equal = q < ties ? q : ties;
            if (has_bit(is_above, j, e)) {
                buffer.keys[a + kept_equal] = part.keys[j][e];
                buffer.ids[a + kept_equal] = id_of(j, e);
                ++a;
            } else if (has_bit(is_equal, j, e)) {
                if (q < ties) {
                    buffer.keys[a + q] = part.keys[j][e];
                    buffer.ids[a + q] = id_of(j, e);
                }
                ++q;
            }
        }
    }
    *above += total & 0xffffu;
    *equal += total >> 16;
}

// Cuts the buffer's count candidates and the tile's entering ones (more
// than k in all; the tile's ids all above the buffer's; without TILE the
// buffer's alone) back to their k best, in id order, into the buffer: every
// key above K (kth_largest_key's: the k-th largest, or the digits of it
// that part the k best from the rest, the rest 0), then as many keys equal
// to K as there is room for, lowest ids first. The buffer is compacted in place a chunk at a
// time: an entry moves only down, so a chunk's writes land on entries
// already read (each chunk's reads come before its place_kept barrier),
// then the tile follows.
template <int CAP, int GROUPS, bool TILE = true, typename IdOf>
__device__ __forceinline__ void cut_back(SelectBuffer<CAP>& buffer, SelectState& state,
                                         const SelectTile<GROUPS>& tile, int k, IdOf id_of) {
    unsigned int greater;
    const unsigned int threshold = kth_largest_key<CAP, GROUPS, TILE>(buffer, state.count, tile, k, &greater);
    const unsigned int ties = static_cast<unsigned int>(k) - greater;  // keys equal to K that stay
    unsigned int above = 0u, equal = 0u;
    int parity = 0;  // warp_totals alternate: a chunk's barrier also frees the other half
    for (int first = 0; first < state.count; first += kSelectChunk) {
        const int count = state.count - first < kSelectChunk ? state.count - first : kSelectChunk;
        SelectTile<1> part;
        int ids[kSelectPerThread];
        part.enter = 0u;
#pragma unroll
        for (int e = 0; e < kSelectPerThread; ++e) {
            const int offset = tile_offset<1>(0, e);
            const bool held = offset < count;
            part.keys[0][e] = held ? buffer.keys[first + offset] : 0u;
            ids[e] = held ? buffer.ids[first + offset] : -1;
            part.enter |= static_cast<unsigned int>(held) << e;
        }
        place_kept(buffer, buffer.warp_totals[parity], part, threshold, ties, &above, &equal,
                   [&ids](int, int e) { return ids[e]; });
        parity ^= 1;
    }
    if (TILE) place_kept(buffer, buffer.warp_totals[parity], tile, threshold, ties, &above, &equal, id_of);
    __syncthreads();
    state.count = k;
    state.cut = true;
    state.threshold = threshold;
}

// One tile of candidates, all with higher ids than any offered before: bit
// 4 j + e of `held` set where entry e of this thread's group j holds a
// candidate, id_of(j, e) its id. Those that can still be selected join the
// buffer in id order, or, when they would not fit, the buffer and they are
// cut back to the k best. Every thread of the block calls it together.
template <int CAP, int GROUPS, typename IdOf>
__device__ __forceinline__ void offer_held(SelectBuffer<CAP>& buffer, SelectState& state, SelectTile<GROUPS>& tile,
                                           unsigned int held, int k, IdOf id_of) {
    // Whole masks, not a bit taken out of `held` for each candidate: the keys above the threshold, then those
    // held among them (every one held before the first cut).
    unsigned int above = 0u;
#pragma unroll
    for (int j = 0; j < GROUPS; ++j)
#pragma unroll
        for (int e = 0; e < kSelectPerThread; ++e)
            above |= static_cast<unsigned int>(tile.keys[j][e] > state.threshold) << (kSelectPerThread * j + e);
    tile.enter = held & (state.cut ? above : 0xffffffffu);
    unsigned int before[GROUPS];
    const unsigned int warp_count = warp_ranks(tile.enter, before);
    unsigned int total;
    const unsigned int base = block_base(buffer.warp_totals[0], warp_count, &total);
    if (state.count + static_cast<int>(total) > SelectBuffer<CAP>::kSize) {
        cut_back(buffer, state, tile, k, id_of);  // count > k: the buffer had room for k
        return;
    }
#pragma unroll
    for (int j = 0; j < GROUPS; ++j) {
        unsigned int at = static_cast<unsigned int>(state.count) + base + before[j];
#pragma unroll
        for (int e = 0; e < kSelectPerThread; ++e)
            if (has_bit(tile.enter, j, e)) {
                buffer.keys[at] = tile.keys[j][e];
                buffer.ids[at] = id_of(j, e);
                ++at;
            }
    }
    state.count += static_cast<int>(total);
    __syncthreads();
}

// offer_held for a tile whose first `count` offsets hold candidates.
template <int CAP, int GROUPS, typename IdOf>
__device__ __forceinline__ void offer_tile(SelectBuffer<CAP>& buffer, SelectState& state, SelectTile<GROUPS>& tile,
                                           int count, int k, IdOf id_of) {
    // A group's 4 offsets are consecutive: the first `left` of them are held, a group's bits at once.
    unsigned int held = 0u;
#pragma unroll
    for (int j = 0; j < GROUPS; ++j) {
        const int left = count - tile_offset<GROUPS>(j, 0);
        const int mine = left <= 0 ? 0 : (left < kSelectPerThread ? left : kSelectPerThread);
        held |= ((1u << mine) - 1u) << (kSelectPerThread * j);
    }
    offer_held(buffer, state, tile, held, k, id_of);
}

// After the last tile: the buffer's first min(count, k) entries are the k
// best, ascending id.
template <int CAP>
__device__ __forceinline__ void finish_selection(SelectBuffer<CAP>& buffer, SelectState& state, int k) {
    if (state.count > k) {
        const SelectTile<1> none{};  // no tile: TILE false reads none of it
        cut_back<CAP, 1, false>(buffer, state, none, k, [](int, int) { return -1; });
    }
}

// Loads a tile's candidates into it as keys, and sets tile.enter to those
// held: each group of 4 (t its tile_offset) takes candidates first + stride
// t .. + 3 of those below first + count (stride 1: a tile of consecutive
// candidates, count <= the tile; more: a sample spread over a range). Every
// load of the thread first, then every conversion, so no load waits behind
// another's data.
template <int GROUPS, typename LoadLogits>
__device__ __forceinline__ void load_tile(SelectTile<GROUPS>& tile, long long first, unsigned int count,
                                          unsigned int stride, LoadLogits& load_logits) {
    float logits[GROUPS][kSelectPerThread];
    tile.enter = 0u;
#pragma unroll
    for (int j = 0; j < GROUPS; ++j) {
        // Below count + 4,096 (a sample's last group 4 x 255 strides on), under 2^32: no wrap.
        const int offset = tile_offset<GROUPS>(j, 0);
        const unsigned int at = stride * static_cast<unsigned int>(offset);
        const unsigned int left = at < count ? count - at : 0u;
        const int mine = left < kSelectPerThread ? static_cast<int>(left) : kSelectPerThread;
        // The same place in 64 bits from the signed offset: a tile's groups then load at one address plus
        // constants, where an unsigned sum took its own address arithmetic a group.
        load_logits(first + static_cast<long long>(stride) * offset, logits[j], mine);
        tile.enter |= ((1u << mine) - 1u) << (kSelectPerThread * j);
    }
#pragma unroll
    for (int j = 0; j < GROUPS; ++j)
#pragma unroll
        for (int e = 0; e < kSelectPerThread; ++e) tile.keys[j][e] = order_key(logits[j][e]);
}

// A selection's start from a threshold: the k-th largest key of the
// buffer's first `kept` keys and the tile's entering candidates (k of them
// or more, all among the selection's), or the top digits of it that part
// their k best from the rest or leave `enough` of them or fewer below it
// (kth_largest_key's), a lower bound on
// the selection's k-th largest, so only keys at or above it are offered
// until the first cut-back sets the exact one. The buffer holds no
// candidate after (the kept keys were a scratch copy); its histogram serves
// the radix select. Every thread of the block calls it together; `state`
// comes out the same in every thread.
template <int CAP, int GROUPS>
__device__ __forceinline__ void start_from_kth(SelectBuffer<CAP>& buffer, int kept, const SelectTile<GROUPS>& tile,
                                               int k, SelectState& state, unsigned int enough = 0u) {
    unsigned int greater;
    const unsigned int seed = kth_largest_key(buffer, kept, tile, k, &greater, enough);
    state.cut = seed > 0u;  // a key above seed - 1: at or above the seed
    state.threshold = seed - 1u;
}

// The rank in a sample of `sampled` of a range's `count` candidates whose
// key starts select_best: the share of k the sample holds on average, e,
// and 5 sqrt(e) + 4 more (5 standard deviations of a random sample's count,
// and 4 for a share of a few keys, whose count spreads more than that). On
// logits in no order tied to the sample, the range then holds fewer than k
// keys at or above that rank's key with the chance that a random sample
// holds that rank of its k best (a hypergeometric tail): 1.3 in 10 million
// at 32,768 candidates and k 512, at most 2.2 in 10 million over ranges of
// 4,097 to 4M candidates and k 7 to 2,048, at most 3 in 10 billion over
// the one-tile ranges past the buffer (1,537 to 4,096; the seed's digits
// cut short only lower it); then select_best offers the range again.
__device__ __forceinline__ unsigned int sample_rank(unsigned int k, unsigned int sampled, unsigned int count) {
    const unsigned int share = (k * sampled + count - 1u) / count;  // k, sampled <= 4,096
    return share + static_cast<unsigned int>(ceilf(5.0f * sqrtf(static_cast<float>(share)))) + 4u;
}

// The k best of candidates lo .. hi - 1, a tile of GROUPS * kSelectChunk at
// a time, where load_logits(first, logits, count) gives the logits of
// candidates first .. first + count - 1 (count <= kSelectPerThread, first -
// lo a multiple of 4; the others any value, never offered): each thread's
// loads of a tile are issued together. Leaves min(hi - lo, k) entries in the
// buffer.
//
// A range of more candidates than the buffer holds (CAP + 1,024: one that
// would cut back at least once) starts from a threshold taken from a sample
// of its candidates: every stride-th group of 4, a chunk's worth (1,024)
// spread over the range (read first; the tiles read those sectors again,
// from L2 where it still holds them), and in it the key of sample_rank (the
// range's k-th largest key's place in the sample, and a margin), or its top
// digits once a radix round's digit holds an eighth of that rank or fewer
// (two rounds on standard normal logits, more where they sit far from zero
// for their spread). Only keys at or above it are offered: on random logits
// about k + 5 sqrt(k stride) + 4 stride of them and up to k / 8 stride more
// where the digits were cut short, so a range whose buffer (CAP + 1,024
// entries) has that room cuts back once, at its end, in whatever order its
// logits rise (by the model's trace on random rows: up to about 24K
// candidates at k 512, where 3 rows in 100 cut back in the stream too, 7 at
// 32K, half at 48K; and 8K at 2,048, 15 in 100 at 12K, 43 at 16K; a sample
// of a tile's worth let in fewer, to 128K and 32K, but its radix rounds cost
// more than the keys it kept out); a wider one cuts back in the stream as
// well. A range of one tile that overflows the buffer (2K candidates at k
// 512, an 8K context's row at kpool 4) cuts back once, at its end, over the
// buffer, not over the buffer and a tile of 16 keys a thread as it did
// unseeded (until 2026-12-07 only ranges of more than one tile sampled).
// When fewer than k keys of the range reach the threshold (no cut-back
// came and the buffer holds fewer than k), the sample was not like the
// range, and the range is offered again from no threshold: the same result,
// its tiles offered twice.
template <int CAP, int GROUPS, typename LoadLogits>
__device__ __forceinline__ SelectState select_best(SelectBuffer<CAP>& buffer, long long lo, long long hi, int k,
                                                   LoadLogits load_logits) {
    constexpr int kTile = GROUPS * kSelectChunk;
    constexpr int kSampleGroups = kSelectChunk / kSelectPerThread;  // groups of 4 a sample takes at most: 256
    SelectState state;
    bool seeded = false;
    if (hi - lo > SelectBuffer<CAP>::kSize) {
        // In 32 bits: a range is at most a row of logits, whose pool ids are int32.
        const unsigned int count = static_cast<unsigned int>(hi - lo);
        const unsigned int groups = (count + kSelectPerThread - 1u) / kSelectPerThread;
        // 2 or more: the range holds more than 1,536 candidates, 384 groups.
        const unsigned int stride = (groups + kSampleGroups - 1u) / kSampleGroups;
        const unsigned int used = (groups + stride - 1u) / stride;                   // groups sampled
        const unsigned int last = kSelectPerThread * stride * (used - 1u);          // the last one's first candidate
        const unsigned int sampled =
            kSelectPerThread * (used - 1u) + (count - last < kSelectPerThread ? count - last : kSelectPerThread);
        const unsigned int rank = sample_rank(static_cast<unsigned int>(k), sampled, count);
        if (rank <= sampled) {  // the same in every thread
            SelectTile<1> tile;
            load_tile(tile, lo, count, stride, load_logits);
            start_from_kth(buffer, 0, tile, static_cast<int>(rank), state, rank / 8u);
            seeded = state.cut;
        }
    }
    for (;;) {  // twice only when the seed was above the range's k-th largest key
        for (long long tile_first = lo; tile_first < hi; tile_first += kTile) {
            const unsigned int count = hi - tile_first < kTile ? static_cast<unsigned int>(hi - tile_first) : kTile;
            SelectTile<GROUPS> tile;
            load_tile(tile, tile_first, count, 1u, load_logits);
            offer_held(buffer, state, tile, tile.enter, k, [tile_first](int j, int e) {
                return static_cast<int>(tile_first + tile_offset<GROUPS>(j, e));
            });
        }
        if (!seeded || state.count >= k) break;  // the same in every thread
        state = SelectState();
        seeded = false;
    }
    finish_selection(buffer, state, k);
    return state;
}

// A token's candidates split over several blocks: each selects its split's
// best into a list of the workspace, and the last of the token's blocks to
// finish selects again over the lists in split order (ascending pool id) and
// writes the row.
//
// The merge starts from a threshold, so few of the lists' entries enter
// its buffer and it seldom cuts back (a 1 x 32K row split 32 ways at top
// 512 offers 16K entries to a 1.5K buffer: without the threshold, 3 cuts
// on random keys and 11 on rising ones; with it, 1 and none). Each list
// publishes two keys beside its count, and the token's k-th largest key is
// at or above both of these bounds:
// - a full list's least key (the list holds k keys at or above it; this
//   one finds it when the best lie in one split, as rising logits put them);
// - the least of the lists' m-th largest keys (or the digits of one that
//   part the list's m best from the rest: kth_largest_key's), m = ceil(k /
//   splits), taken over the lists that hold m (when those lists number at
//   least k / m: their m best each are k keys at or above it; this one finds
//   it when the best are spread over the splits, as random logits spread
//   them).
// Every key at or above the larger bound enters; the rest cannot be selected.
//
// Where the workspace keeps what: a counter per token in the first
// kSelectCounterBytes, a fixed region whatever num_tokens (candidates are
// split only for 128 tokens or fewer), so a buffer reused across batch
// sizes finds zero counters where the last call left them; then per token
// and split a head of kSplitHeadWords words (count, least key of a full
// list, m-th largest key), pool_topk keys and pool_topk ids
// (ops/families/split_selection.py's workspace_bytes lays it out the same).
constexpr long long kSelectCounterBytes = 512;
constexpr int kSplitHeadWords = 4;  // count, least key, m-th largest key, unused: 16 bytes a list

struct SelectWorkspace {
    unsigned int* counters;
    unsigned int* heads;
    unsigned int* keys;
    int* ids;
};

__device__ __forceinline__ long long align16(long long bytes) { return (bytes + 15) / 16 * 16; }

__device__ __forceinline__ SelectWorkspace select_workspace(unsigned char* base, long long num_tokens,
                                                            long long splits, long long pool_topk) {
    const long long lists = num_tokens * splits;
    SelectWorkspace w;
    w.counters = reinterpret_cast<unsigned int*>(base);
    base += kSelectCounterBytes;
    w.heads = reinterpret_cast<unsigned int*>(base);
    base += lists * kSplitHeadWords * 4;
    w.keys = reinterpret_cast<unsigned int*>(base);
    base += align16(lists * pool_topk * 4);
    w.ids = reinterpret_cast<int*>(base);
    return w;
}

// The rank of the key each list publishes as its second bound: the lists'
// m best each, over at least k / m lists, are k keys.
__device__ __forceinline__ int split_bound_rank(long long splits, long long pool_topk) {
    return static_cast<int>((pool_topk + splits - 1) / splits);
}

// Writes this split's best (the buffer's first min(count, pool_topk)
// entries) to its list, and its head: the count, the least key when the
// list is full (else 0) and its m-th largest key (kth_largest_key's, a key
// below it that keeps the same m) when it holds m (else 0).
// True, in every thread of the block, for the last of the token's splits
// to finish, which then merges. The counter is an atomicInc that wraps back
// to 0 at the last split, so the counters stay zero between calls. Every
// thread of the block calls it together.
template <int CAP>
__device__ __forceinline__ bool publish_split(SelectBuffer<CAP>& buffer, const SelectState& state,
                                              const SelectWorkspace& w, long long token, long long split,
                                              long long splits, long long pool_topk) {
    __shared__ unsigned int last_of_token;
    __shared__ unsigned int warp_least[kSelectWarps];
    const long long list = token * splits + split;
    const int k = static_cast<int>(pool_topk);
    const int held = state.count < k ? state.count : k;
    unsigned int least = 0xffffffffu;
    for (int i = static_cast<int>(threadIdx.x); i < held; i += kSelectThreads) {
        const unsigned int key = buffer.keys[i];
        w.keys[list * pool_topk + i] = key;
        w.ids[list * pool_topk + i] = buffer.ids[i];
        least = key < least ? key : least;
    }
#pragma unroll
    for (int mask = 16; mask > 0; mask /= 2) {
        const unsigned int other = __shfl_xor_sync(0xffffffffu, least, mask);
        least = other < least ? other : least;
    }
    if (threadIdx.x % 32 == 0) warp_least[threadIdx.x / 32] = least;
    const int m = split_bound_rank(splits, pool_topk);
    unsigned int mth = 0u;
    if (held >= m) {  // the same in every thread
        const SelectTile<1> none{};  // no tile: TILE false reads none of it
        unsigned int greater;
        mth = kth_largest_key<CAP, 1, false>(buffer, held, none, m, &greater);
    }
    if (threadIdx.x == 0) {
        // A full list (held == k >= m) has been through kth_largest_key, whose barriers make warp_least whole;
        // no other list's least key is published, so warp_least is read only then.
        if (held == k) {
#pragma unroll
            for (int warp = 0; warp < kSelectWarps; ++warp)
                least = warp_least[warp] < least ? warp_least[warp] : least;
        }
        unsigned int* head = w.heads + list * kSplitHeadWords;
        head[0] = static_cast<unsigned int>(held);
        head[1] = held == k ? least : 0u;
        head[2] = mth;
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        last_of_token = atomicInc(w.counters + token, static_cast<unsigned int>(splits - 1)) ==
                        static_cast<unsigned int>(splits - 1);
    __syncthreads();
    const bool last = last_of_token != 0u;
    __syncthreads();  // last_of_token and warp_least are read before a later call writes them
    if (last) __threadfence();
    return last;
}

// The most splits a token's candidates take (ops/families/split_selection.py's MAX_SPLITS: the host never
// launches more; lists past it would be left out).
constexpr int kSelectMaxSplits = 64;
static_assert(kSelectMaxSplits <= 2 * 32 && kSelectThreads >= kSelectMaxSplits, "warps 0 and 1 read the heads");

// Of a warp's lists (one a lane): the largest least key of a full list, the
// least m-th largest key of a list that holds m, and how many lists hold m,
// reduced over the warp. Every lane of the warp calls it together.
__device__ __forceinline__ void reduce_bounds(unsigned int& least, unsigned int& mth, unsigned int& holding) {
#pragma unroll
    for (int mask = 16; mask > 0; mask /= 2) {
        const unsigned int other_least = __shfl_xor_sync(0xffffffffu, least, mask);
        const unsigned int other_mth = __shfl_xor_sync(0xffffffffu, mth, mask);
        least = other_least > least ? other_least : least;
        mth = other_mth < mth ? other_mth : mth;
        holding += __shfl_xor_sync(0xffffffffu, holding, mask);
    }
}

// The merge's starting state: no candidate yet, and the threshold of the
// bounds above (none when both are 0), from the heads of the token's lists;
// their counts into list_counts, each clamped to pool_topk (garbage only
// after garbage). The heads are loaded together, one list a thread (warps
// 0 and 1). Every thread of the block calls it together.
__device__ __forceinline__ SelectState merge_threshold(const SelectWorkspace& w, long long token, long long splits,
                                                       long long pool_topk, int (&list_counts)[kSelectMaxSplits]) {
    __shared__ unsigned int warp_bounds[2][3];
    const int k = static_cast<int>(pool_topk);
    const int lists = splits < kSelectMaxSplits ? static_cast<int>(splits) : kSelectMaxSplits;
    const int m = split_bound_rank(splits, pool_topk);
    const int s = static_cast<int>(threadIdx.x);
    unsigned int least = 0u, mth = 0xffffffffu, holding = 0u;
    if (s < lists) {
        const unsigned int* head = w.heads + (token * splits + s) * kSplitHeadWords;
        const int read = static_cast<int>(kp_load_cg(head));
        const unsigned int list_least = kp_load_cg(head + 1), list_mth = kp_load_cg(head + 2);
        const int count = read < 0 ? 0 : (read > k ? k : read);
        list_counts[s] = count;
        least = count == k ? list_least : 0u;
        holding = count >= m ? 1u : 0u;
        mth = count >= m ? list_mth : 0xffffffffu;
    }
    reduce_bounds(least, mth, holding);  // in every warp (converged shuffles); warps past the lists add nothing
    if (threadIdx.x % 32 == 0 && threadIdx.x < 64) {
        warp_bounds[threadIdx.x / 32][0] = least;
        warp_bounds[threadIdx.x / 32][1] = mth;
        warp_bounds[threadIdx.x / 32][2] = holding;
    }
    __syncthreads();
    unsigned int seed = warp_bounds[0][0] > warp_bounds[1][0] ? warp_bounds[0][0] : warp_bounds[1][0];
    const unsigned int spread = warp_bounds[0][1] < warp_bounds[1][1] ? warp_bounds[0][1] : warp_bounds[1][1];
    const long long lists_holding = static_cast<long long>(warp_bounds[0][2]) + warp_bounds[1][2];
    if (lists_holding * m >= k && spread > seed) seed = spread;
    __syncthreads();  // warp_bounds is read before a later call writes it
    SelectState start;
    start.cut = seed > 0u;  // a key above seed - 1: at or above the seed
    start.threshold = seed - 1u;
    return start;
}

// Groups a thread takes of the merge's tiles: 2 x kSelectChunk list slots
// loaded at once, so the 16,384 slots of 32 lists of 512 take 8 round
// trips, not one a list (4 groups spill kpool_index_topk on sm_90).
constexpr int kSelectMergeGroups = 2;

// The best of the token's lists, in split order (ascending pool id, each
// list's ids above the last's): left in the buffer as select_best leaves
// it. First the threshold (merge_threshold); then the lists' slots (list s,
// entry i at s * pool_topk + i, a candidate where i < its count) a tile at
// a time, each thread's keys and ids loaded together. Every thread of the
// block calls it together.
template <int CAP>
__device__ __forceinline__ SelectState merge_splits(SelectBuffer<CAP>& buffer, const SelectWorkspace& w,
                                                    long long token, long long splits, long long pool_topk) {
    constexpr int kTile = kSelectMergeGroups * kSelectChunk;
    __shared__ int list_counts[kSelectMaxSplits];
    const int k = static_cast<int>(pool_topk);
    const int lists = splits < kSelectMaxSplits ? static_cast<int>(splits) : kSelectMaxSplits;
    SelectState merged = merge_threshold(w, token, splits, pool_topk, list_counts);
    const unsigned int* keys = w.keys + token * splits * pool_topk;
    const int* ids = w.ids + token * splits * pool_topk;
    const int slots = lists * k;  // at most kSelectMaxSplits x 4096
    for (int tile_first = 0; tile_first < slots; tile_first += kTile) {
        SelectTile<kSelectMergeGroups> tile;
        int tile_ids[kSelectMergeGroups][kSelectPerThread];
        unsigned int held = 0u;
#pragma unroll
        for (int j = 0; j < kSelectMergeGroups; ++j)
#pragma unroll
            for (int e = 0; e < kSelectPerThread; ++e) {
                const int slot = tile_first + tile_offset<kSelectMergeGroups>(j, e);
                const int list = slot < slots ? slot / k : 0;
                const bool in_list = slot < slots && slot - list * k < list_counts[list];
                tile.keys[j][e] = in_list ? kp_load_cg(keys + slot) : 0u;
                tile_ids[j][e] = in_list ? kp_load_cg(ids + slot) : -1;
                held |= static_cast<unsigned int>(in_list) << (kSelectPerThread * j + e);
            }
        offer_held(buffer, merged, tile, held, k, [&tile_ids](int j, int e) { return tile_ids[j][e]; });
    }
    finish_selection(buffer, merged, k);
    return merged;
}

// A token's candidates split over `splits` blocks (1: nothing to do): this
// block's best into its list, and in the last of the token's blocks the
// merge, its result in state. False in the token's other blocks, which are
// done. Every thread of the block calls it together.
template <int CAP>
__device__ __forceinline__ bool gather_splits(SelectBuffer<CAP>& buffer, SelectState& state, unsigned char* workspace,
                                              long long num_tokens, long long token, long long split,
                                              long long splits, long long pool_topk) {
    if (splits <= 1) return true;
    const SelectWorkspace w = select_workspace(workspace, num_tokens, splits, pool_topk);
    if (!publish_split(buffer, state, w, token, split, splits, pool_topk)) return false;
    state = merge_splits(buffer, w, token, splits, pool_topk);
    return true;
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
    // Columns and kpool fit 32 bits (pool_topk <= 4096, kpool <= 1024).
    const ExpandTarget target =
        expand_target<PAGED>(block_table, max_blocks, block_table_stride, block_size, width, pool_topk * kpool, kpool);
    const ExpandRow row = block_expand_row(PAGED || width > pool_topk * kpool, token, input_row_offsets,
                                           cache_lengths, batch, num_tokens, kpool);
    const unsigned int chosen = static_cast<unsigned int>(selected);
    write_expanded_row<PAGED, COMPACT>(
        row, target,
        [&buffer, all, chosen](unsigned int slot) -> int {
            return slot < chosen ? (all ? static_cast<int>(slot) : buffer.ids[slot]) : -1;
        },
        positions + token * width, COMPACT ? counts + token : nullptr);  // counts is null without COMPACT
}

}  // namespace kp

#endif  // KPOOL_SELECT_CUH
