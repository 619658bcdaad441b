"""What one block's streaming selection does on given logits (kernels/kpool_select.cuh's ``select_best`` in
kpool_index_topk; a token's offers in kpool_index_select_fp8): how many tiles it offers, and at which buffer fill
it cuts back. The selection's result never depends on this; its cost does (a cut-back is a radix select over the
buffer, ten tiles' worth of instructions), so ``scripts/bench_model.py`` counts the cut-backs the benchmark's
logits make instead of one at every tile.

The rule, as the kernels' comments state it: keys are ``order_key``'s; a selection may start from a seed's key (a
key at or above it is offered): select_best's range of more than its buffer holds from a sample of it (every
stride-th group of 4, a chunk's worth: its ``sample_rank``-th largest key, or that key's top digits once a radix
round's digit holds an eighth of the rank or fewer, and the range offered again from no seed when fewer than k of
its keys reach that), a fused select's token from the k-th largest key of the chunks that hold its last k; each
tile's offered keys join the buffer (``CAP + kSelectChunk`` entries) or, where they would not fit, the buffer and
they are cut back to their ``k`` best and only keys above the k-th largest are offered after; after the last tile
a buffer of more than ``k`` is cut back once more. Each of those k-th largest keys is ``radix_select``'s: its
digits up to the first round whose digit holds exactly the keys still wanted, the rest 0 (a key at or below the
k-th largest that keeps the same k), in as many rounds, or the key itself at the first round whose keys are all
one key (``Search``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SELECT_CHUNK = 1024  # kp::kSelectChunk: candidates of one group a block (256 threads x 4)
SELECT_THREADS = 256  # kp::kSelectThreads: a histogram round's entries a trip
RADIX_ROUNDS = 4  # kth_largest_key's 8-bit rounds over a 32-bit key
SAMPLE_SPREAD = 5  # sample_rank's standard deviations of margin
SAMPLE_SLACK = 4  # and its keys more
SAMPLE_GROUPS = SELECT_CHUNK // 4  # select_best's sample: at most this many groups of 4, a chunk's worth
SAMPLE_ENOUGH = 8  # select_best's seed stops at a digit holding its rank over this or fewer keys
SEED_CHUNKS = 3  # kpool_index_select.cu's kSeedChunks: a row this many seeds' worth takes a seed
ROUND_BARRIERS = 6  # a round's: histogram cleared, filled, the exclusive sum's two, the digit found and read
TIED_ROUND_BARRIERS = 2  # a round that ends at its tie check: histogram cleared, filled
MERGE_TILE = 2 * SELECT_CHUNK  # kp::kSelectMergeGroups x kSelectChunk: the list slots a merge tile takes
MAX_LISTS = 64  # kp::kSelectMaxSplits: the lists a merge reads
PUBLISH_BARRIERS = 3  # publish_split's own: after the head's writing, after the counter, before a later call
MERGE_START_BARRIERS = 2  # merge_threshold's: the warps' bounds written, then read before a later call


def order_keys(logits: np.ndarray) -> np.ndarray:
    """kp::order_key of each float32 logit: larger logits larger keys, -0.0 as +0.0, every NaN 0."""
    bits = np.ascontiguousarray(logits, dtype=np.float32).view(np.uint32)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    keys = np.where(bits & np.uint32(0x80000000), np.uint32(0x80000000) - magnitude, bits | np.uint32(0x80000000))
    return np.where(magnitude > 0x7F800000, np.uint32(0), keys).astype(np.uint32)


@dataclass(frozen=True)
class Search:
    """One radix select (kp::kth_largest_key): the ``rounds`` it entered, the last ending whole or (``tied``) at its
    tie check, after its histogram's fill, where every key the round counted was one key."""

    rounds: int = RADIX_ROUNDS
    tied: bool = False

    def barriers(self) -> int:
        """Its block-wide barriers: ROUND_BARRIERS a whole round, TIED_ROUND_BARRIERS the one that ends tied."""
        return self.rounds * ROUND_BARRIERS - (ROUND_BARRIERS - TIED_ROUND_BARRIERS) * self.tied


FOUR_ROUNDS = Search()  # a radix select's every round, whole: what a count without a trace takes


@dataclass(frozen=True)
class SelectionTrace:
    """One range's selection: ``tiles`` offered (a range offered again counted twice); ``seeded`` when it started
    from a threshold (the radix select ``seed`` over select_best's sample or the fused select's seed chunks, no
    buffer); ``cuts`` the buffer's count at each cut-back in a tile's offer, ``finish`` at the cut after the last
    tile (None: none); ``cut_searches`` and ``finish_search`` their radix selects (``radix_select``'s; empty:
    four whole rounds each)."""

    tiles: int
    seeded: bool
    cuts: tuple[int, ...]
    finish: int | None
    seed: Search = FOUR_ROUNDS
    cut_searches: tuple[Search, ...] = ()
    finish_search: Search = FOUR_ROUNDS

    def searches(self) -> tuple[Search, ...]:
        """Each cut-back's radix select, in ``cuts``'s order."""
        return self.cut_searches or (FOUR_ROUNDS,) * len(self.cuts)

    def barriers(self) -> int:
        """The block-wide barriers it passes (kernels/kpool_select.cuh): a radix select ROUND_BARRIERS a round;
        an offer two (its block sum, its append) or, cut back, its block sum and the cut's; a cut its radix
        select, one a buffer chunk it compacts, one for the tile's candidates (the finish has no tile) and one
        after."""

        def cut(count: int, search: Search, tile: int = 1) -> int:
            return search.barriers() + -(-count // SELECT_CHUNK) + tile + 1

        seed = self.seed.barriers() if self.seeded else 0
        pairs = zip(self.cuts, self.searches(), strict=True)
        offers = 2 * (self.tiles - len(self.cuts)) + sum(1 + cut(n, r) for n, r in pairs)
        return seed + offers + (cut(self.finish, self.finish_search, tile=0) if self.finish is not None else 0)


def sample_rank(k: int, sampled: int, count: int) -> int:
    """kp::sample_rank: the share of k that ``sampled`` of ``count`` candidates hold on average, rounded up, and
    SAMPLE_SPREAD square roots of it (float32's square root, rounded up) and SAMPLE_SLACK more."""
    share = -(-k * sampled // count)
    return share + int(np.ceil(np.float32(SAMPLE_SPREAD) * np.sqrt(np.float32(share)))) + SAMPLE_SLACK


def radix_select(keys: np.ndarray, k: int, enough: int = 0) -> tuple[int, Search]:
    """kp::kth_largest_key's search over ``keys`` (k of them or more) for the k-th largest: 8-bit rounds over the
    keys that match the digits found so far, ended at the first round whose matching keys are all one key (that
    key: the k-th largest; found after the round's fill) or after the first round whose digit holds exactly the
    keys the rank still wants (every key at or above its digits is among the k largest: a cut keeps exactly those)
    or, with ``enough`` above 0, ``enough`` keys or fewer, or whose digits so far are all 0: the key or the digits
    found (the rest 0; the k-th largest itself after four rounds), and the search."""
    prefix, wanted, rounds = 0, k, 0
    for shift in (24, 16, 8, 0):
        rounds += 1
        high = np.uint64(0xFFFFFFFF) << np.uint64(shift + 8) & np.uint64(0xFFFFFFFF)
        matching = keys[(keys.astype(np.uint64) & high) == prefix]
        if matching.min() == matching.max():
            return int(matching[0]), Search(rounds, tied=True)
        counts = np.bincount((matching >> np.uint32(shift)) & np.uint32(255), minlength=256)[::-1]
        above = np.cumsum(counts) - counts  # the keys in higher digits, digit 255 first
        at = int(np.nonzero((above < wanted) & (above + counts >= wanted))[0][0])
        prefix |= (255 - at) << shift
        wanted -= int(above[at])
        if counts[at] == wanted or counts[at] <= enough or (enough > 0 and prefix == 0):
            break
    return prefix, Search(rounds)


def sample_positions(count: int) -> np.ndarray:
    """The candidates select_best samples of a range of ``count`` (more than its buffer holds): the first of every
    stride-th group of 4, stride the fewest that leaves SAMPLE_GROUPS groups or fewer, and the next 3."""
    groups = -(-count // 4)
    stride = -(-groups // SAMPLE_GROUPS)
    first = 4 * stride * np.arange(-(-groups // stride))
    positions = (first[:, None] + np.arange(4)).ravel()
    return positions[positions < count]


def split_ranges(candidates: int, splits: int, tile: int) -> list[tuple[int, int]]:
    """The candidates each of a row's ``splits`` blocks selects among in kpool_index_topk (kpool_index_topk.cu):
    whole tiles of ``tile``, as many to each block, the last block's range ending at the row's."""
    tiles = -(-candidates // tile)
    per_split = -(-tiles // splits)
    lows = [min(split * per_split * tile, candidates) for split in range(splits)]
    return [(lo, min(lo + per_split * tile, candidates)) for lo in lows]


def trace_select_best(logits: np.ndarray, k: int, tile: int, cap: int) -> SelectionTrace:
    """select_best over one range of ``logits`` (float32, ascending pool id) at ``pool_topk`` k, ``tile``
    candidates a tile (kTile) and a buffer for ``cap``: a range of more than the buffer holds (``cap`` and a chunk)
    seeded from its sample (``sample_positions``) where that holds ``sample_rank`` keys, and offered again from no
    seed where fewer than k keys reach the seed."""
    keys = order_keys(logits)
    tiles = -(-keys.size // tile)
    sample = keys[sample_positions(keys.size)] if keys.size > cap + SELECT_CHUNK else keys[:0]
    rank = sample_rank(k, sample.size, keys.size) if sample.size else 0
    if not 0 < rank <= sample.size:
        return _traced(tiles, None, _offers(keys, k, tile, cap, None))
    seed, search = radix_select(sample, rank, rank // SAMPLE_ENOUGH)
    threshold = seed - 1 if seed > 0 else None  # a seed of 0: every key is offered
    offers = _offers(keys, k, tile, cap, threshold)
    if threshold is not None and not offers.cuts and int(np.count_nonzero(keys >= seed)) < k:
        offers = _offers(keys, k, tile, cap, None)  # fewer than k reached the seed: again from none
        tiles *= 2
    return _traced(tiles, search, offers)


@dataclass(frozen=True)
class SplitTrace:
    """A row split over blocks in kpool_index_topk (kernels/kpool_select.cuh's gather_splits): each block's
    select_best (``blocks``), the size of the list it publishes (``held``) and the radix select that found its m-th
    largest key (``published``; None where it holds fewer than m and searches none), and the last block's
    ``merge`` of the lists (tiles of MERGE_TILE list slots, from the lists' threshold; never seeded)."""

    blocks: tuple[SelectionTrace, ...]
    held: tuple[int, ...]
    published: tuple[Search | None, ...]
    merge: SelectionTrace

    def barriers(self) -> int:
        """The block-wide barriers the row's blocks pass, summed over them: each block's select_best and publish
        (its m-th key's radix select and PUBLISH_BARRIERS), the last one's merge (its threshold's
        MERGE_START_BARRIERS, its offers and finish as ``SelectionTrace.barriers`` counts them)."""
        blocks = sum(trace.barriers() for trace in self.blocks)
        publish = sum(PUBLISH_BARRIERS + (search.barriers() if search else 0) for search in self.published)
        return blocks + publish + MERGE_START_BARRIERS + self.merge.barriers()


def best_keys(keys: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` best of ``keys`` (a larger key first, a lower index among equal ones), in index order: what a
    block's selection leaves in its buffer and publishes as its list."""
    order = np.lexsort((np.arange(keys.size), -keys.astype(np.int64)))
    return keys[np.sort(order[:k])]


def trace_split_row(logits: np.ndarray, k: int, splits: int, tile: int, cap: int) -> SplitTrace:
    """kpool_index_topk over one row of ``logits`` (float32, ascending pool id) split over ``splits`` blocks
    (``split_ranges``), ``tile`` candidates a tile, a buffer for ``cap``: each block's select_best and list; each
    list's m-th largest key (m = ceil(k / splits), by ``radix_select``, where it holds m); the merge's threshold
    (merge_threshold: the largest least key of a full list, or the least of the m-th keys where the lists holding
    m hold k in all and it is larger; a key at or above it is offered) and its offers of the lists' slots (list s,
    entry i at slot s k + i, a tile of MERGE_TILE slots at a time; the first MAX_LISTS lists, as the kernel reads
    them, though the host never splits a row more)."""
    keys = order_keys(logits)
    ranges = split_ranges(keys.size, splits, tile)
    blocks = tuple(trace_select_best(logits[lo:hi], k, tile, cap) for lo, hi in ranges)
    lists = [best_keys(keys[lo:hi], k) for lo, hi in ranges]
    m = -(-k // splits)
    searched = [radix_select(kept, m) if kept.size >= m else None for kept in lists]
    merged, heads = lists[:MAX_LISTS], searched[:MAX_LISTS]
    seed = max((int(kept.min()) for kept in merged if kept.size == k), default=0)
    mths = [found for found, _ in filter(None, heads)]
    if mths and len(mths) * m >= k and min(mths) > seed:
        seed = min(mths)
    slots = np.zeros(len(merged) * k, np.uint32)
    held = np.zeros(slots.size, bool)
    for s, kept in enumerate(merged):
        slots[s * k : s * k + kept.size] = kept
        held[s * k : s * k + kept.size] = True
    parts = [slots[f : f + MERGE_TILE][held[f : f + MERGE_TILE]] for f in range(0, slots.size, MERGE_TILE)]
    merge = _traced(len(parts), None, _offered(parts, k, cap, seed - 1 if seed > 0 else None))
    return SplitTrace(
        blocks, tuple(kept.size for kept in lists), tuple(None if s is None else s[1] for s in searched), merge
    )


def trace_fused_select(logits: np.ndarray, k: int, cap: int) -> SelectionTrace:
    """One token's selection in a block of kpool_index_select_fp8 that holds its whole row (one split) of
    ``logits`` (its visible pools'): chunks of SELECT_CHUNK; seeded from the chunks that hold its last k
    candidates (as many chunks as hold k, from the one k before its end) where its row holds kSeedChunks (3)
    times their worth (kernels/kpool_index_select.cu)."""
    seed_chunks = -(-k // SELECT_CHUNK)
    seeded = logits.size >= SEED_CHUNKS * seed_chunks * SELECT_CHUNK
    seed_base = (logits.size - k) // SELECT_CHUNK * SELECT_CHUNK
    return trace_offers(logits, k, SELECT_CHUNK, cap, (seed_base, seed_chunks * SELECT_CHUNK) if seeded else None)


def trace_offers(logits: np.ndarray, k: int, tile: int, cap: int, seed: tuple[int, int] | None) -> SelectionTrace:
    """A streaming selection over ``logits`` at k, a tile of ``tile`` candidates an offer, a buffer for ``cap``;
    ``seed`` (first, count): it starts from the k-th largest key of those candidates (None: from none)."""
    keys = order_keys(logits)
    threshold, search = None, None
    if seed is not None:
        found, search = radix_select(keys[seed[0] : seed[0] + seed[1]], k)
        threshold = found - 1 if found > 0 else None
    return _traced(-(-keys.size // tile), search, _offers(keys, k, tile, cap, threshold))


@dataclass(frozen=True)
class _Offers:
    cuts: tuple[int, ...]
    cut_searches: tuple[Search, ...]
    finish: int | None
    finish_search: Search


def _traced(tiles: int, seed: Search | None, offers: _Offers) -> SelectionTrace:
    """The trace of ``tiles`` offers that started from a seed found by the search ``seed`` (None: no seed)."""
    seeded = seed is not None
    return SelectionTrace(
        tiles, seeded, offers.cuts, offers.finish, seed or FOUR_ROUNDS, offers.cut_searches, offers.finish_search
    )


def _offers(keys: np.ndarray, k: int, tile: int, cap: int, threshold: int | None) -> _Offers:
    """``_offered`` of ``keys`` a tile at a time."""
    return _offered([keys[first : first + tile] for first in range(0, keys.size, tile)], k, cap, threshold)


def _offered(parts: list[np.ndarray], k: int, cap: int, threshold: int | None) -> _Offers:
    """The cut-backs' buffer fills and the finish's of offering the keys of each of ``parts`` in turn, only those
    above ``threshold`` (None: every one), then above each cut's (``radix_select``'s digits: the k-th largest key
    or a key below it that keeps the same k), and each cut's radix select."""
    size = cap + SELECT_CHUNK
    buffer = np.empty(0, np.uint32)
    cuts, searches = [], []
    for part in parts:
        entering = part if threshold is None else part[part > threshold]
        both = np.concatenate([buffer, entering])
        if both.size > size:
            cuts.append(buffer.size)
            threshold, search = radix_select(both, k)
            searches.append(search)
            buffer = np.sort(both)[-k:]  # the k best (which of tied keys stay does not change the next fill)
        else:
            buffer = both
    if buffer.size <= k:
        return _Offers(tuple(cuts), tuple(searches), None, FOUR_ROUNDS)
    return _Offers(tuple(cuts), tuple(searches), buffer.size, radix_select(buffer, k)[1])
