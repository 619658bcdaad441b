"""What one block's streaming selection does on given logits (kernels/kpool_select.cuh's ``select_best`` in
kpool_index_topk; a token's offers in kpool_index_select_fp8): how many tiles it offers, and at which buffer fill
it cuts back. The selection's result never depends on this; its cost does (a cut-back is a radix select over the
buffer, ten tiles' worth of instructions), so ``scripts/bench_model.py`` counts the cut-backs the benchmark's
logits make instead of one at every tile.

The rule, as the kernels' comments state it: keys are ``order_key``'s; a selection may start from a seed's key (a
key at or above it is offered): select_best's range of more than one tile from a sample of it (every stride-th
group of 4, a chunk's worth: its ``sample_rank``-th largest key, or that key's top digits once a radix round's
digit holds an eighth of the rank or fewer, and the range offered again from no seed when fewer than k of its
keys reach that), a fused select's token from the k-th largest key of the chunks that hold its last k; each
tile's offered keys join the buffer (``CAP + kSelectChunk`` entries) or, where they would not fit, the buffer and
they are cut back to their ``k`` best and only keys above the k-th largest are offered after; after the last tile
a buffer of more than ``k`` is cut back once more. Each of those k-th largest keys is ``radix_select``'s: its
digits up to the first round whose digit holds exactly the keys still wanted, the rest 0 (a key at or below the
k-th largest that keeps the same k), in as many rounds.
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


def order_keys(logits: np.ndarray) -> np.ndarray:
    """kp::order_key of each float32 logit: larger logits larger keys, -0.0 as +0.0, every NaN 0."""
    bits = np.ascontiguousarray(logits, dtype=np.float32).view(np.uint32)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    keys = np.where(bits & np.uint32(0x80000000), np.uint32(0x80000000) - magnitude, bits | np.uint32(0x80000000))
    return np.where(magnitude > 0x7F800000, np.uint32(0), keys).astype(np.uint32)


@dataclass(frozen=True)
class SelectionTrace:
    """One range's selection: ``tiles`` offered (a range offered again counted twice); ``seeded`` when it started
    from a threshold (a radix select of ``seed_rounds`` rounds over select_best's sample or the fused select's
    seed chunks, no buffer); ``cuts`` the buffer's count at each cut-back in a tile's offer, ``finish`` at the cut
    after the last tile (None: none); ``cut_rounds`` and ``finish_rounds`` the rounds their radix selects took
    (``radix_select``; empty: RADIX_ROUNDS each)."""

    tiles: int
    seeded: bool
    cuts: tuple[int, ...]
    finish: int | None
    seed_rounds: int = RADIX_ROUNDS
    cut_rounds: tuple[int, ...] = ()
    finish_rounds: int = RADIX_ROUNDS

    def rounds(self) -> tuple[int, ...]:
        """Each cut-back's radix select's rounds, in ``cuts``'s order."""
        return self.cut_rounds or (RADIX_ROUNDS,) * len(self.cuts)

    def barriers(self) -> int:
        """The block-wide barriers it passes (kernels/kpool_select.cuh): a radix select ROUND_BARRIERS a round;
        an offer two (its block sum, its append) or, cut back, its block sum and the cut's; a cut its radix
        select, one a buffer chunk it compacts, one for the tile's candidates (the finish has no tile) and one
        after."""

        def cut(count: int, rounds: int, tile: int = 1) -> int:
            return rounds * ROUND_BARRIERS + -(-count // SELECT_CHUNK) + tile + 1

        seed = self.seed_rounds * ROUND_BARRIERS if self.seeded else 0
        pairs = zip(self.cuts, self.rounds(), strict=True)
        offers = 2 * (self.tiles - len(self.cuts)) + sum(1 + cut(n, r) for n, r in pairs)
        return seed + offers + (cut(self.finish, self.finish_rounds, tile=0) if self.finish is not None else 0)


def sample_rank(k: int, sampled: int, count: int) -> int:
    """kp::sample_rank: the share of k that ``sampled`` of ``count`` candidates hold on average, rounded up, and
    SAMPLE_SPREAD square roots of it (float32's square root, rounded up) and SAMPLE_SLACK more."""
    share = -(-k * sampled // count)
    return share + int(np.ceil(np.float32(SAMPLE_SPREAD) * np.sqrt(np.float32(share)))) + SAMPLE_SLACK


def radix_select(keys: np.ndarray, k: int, enough: int = 0) -> tuple[int, int]:
    """kp::kth_largest_key's search over ``keys`` (k of them or more) for the k-th largest, ended after the first
    8-bit round whose digit holds exactly the keys the rank still wants (every key at or above its digits is among
    the k largest: a cut keeps exactly those) or, with ``enough`` above 0, ``enough`` keys or fewer, or whose digits
    so far are all 0: the digits found (the rest 0; the k-th largest itself after four rounds) and the rounds it
    took."""
    prefix, wanted, rounds = 0, k, 0
    for shift in (24, 16, 8, 0):
        rounds += 1
        high = np.uint64(0xFFFFFFFF) << np.uint64(shift + 8) & np.uint64(0xFFFFFFFF)
        matching = keys[(keys.astype(np.uint64) & high) == prefix]
        counts = np.bincount((matching >> np.uint32(shift)) & np.uint32(255), minlength=256)[::-1]
        above = np.cumsum(counts) - counts  # the keys in higher digits, digit 255 first
        at = int(np.nonzero((above < wanted) & (above + counts >= wanted))[0][0])
        prefix |= (255 - at) << shift
        wanted -= int(above[at])
        if counts[at] == wanted or counts[at] <= enough or (enough > 0 and prefix == 0):
            break
    return prefix, rounds


def sample_positions(count: int) -> np.ndarray:
    """The candidates select_best samples of a range of ``count`` (more than a tile): the first of every
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
    candidates a tile (kTile) and a buffer for ``cap``: a range of more than a tile seeded from its sample
    (``sample_positions``) where that holds ``sample_rank`` keys, and offered again from no seed where fewer than
    k keys reach the seed."""
    keys = order_keys(logits)
    tiles = -(-keys.size // tile)
    sample = keys[sample_positions(keys.size)] if keys.size > tile else keys[:0]
    rank = sample_rank(k, sample.size, keys.size) if sample.size else 0
    if not 0 < rank <= sample.size:
        return _traced(tiles, None, _offers(keys, k, tile, cap, None))
    seed, rounds = radix_select(sample, rank, rank // SAMPLE_ENOUGH)
    threshold = seed - 1 if seed > 0 else None  # a seed of 0: every key is offered
    offers = _offers(keys, k, tile, cap, threshold)
    if threshold is not None and not offers.cuts and int(np.count_nonzero(keys >= seed)) < k:
        offers = _offers(keys, k, tile, cap, None)  # fewer than k reached the seed: again from none
        tiles *= 2
    return _traced(tiles, rounds, offers)


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
    threshold, rounds = None, None
    if seed is not None:
        found, rounds = radix_select(keys[seed[0] : seed[0] + seed[1]], k)
        threshold = found - 1 if found > 0 else None
    return _traced(-(-keys.size // tile), rounds, _offers(keys, k, tile, cap, threshold))


@dataclass(frozen=True)
class _Offers:
    cuts: tuple[int, ...]
    cut_rounds: tuple[int, ...]
    finish: int | None
    finish_rounds: int


def _traced(tiles: int, seed_rounds: int | None, offers: _Offers) -> SelectionTrace:
    """The trace of ``tiles`` offers that started from a seed found in ``seed_rounds`` rounds (None: no seed)."""
    seeded = seed_rounds is not None
    rounds = seed_rounds if seeded else RADIX_ROUNDS
    return SelectionTrace(tiles, seeded, offers.cuts, offers.finish, rounds, offers.cut_rounds, offers.finish_rounds)


def _offers(keys: np.ndarray, k: int, tile: int, cap: int, threshold: int | None) -> _Offers:
    """The cut-backs' buffer fills and the finish's of offering ``keys`` a tile at a time, only those above
    ``threshold`` (None: every one), then above each cut's (``radix_select``'s digits: the k-th largest key or
    a key below it that keeps the same k), and the rounds each cut's radix select took."""
    size = cap + SELECT_CHUNK
    buffer = np.empty(0, np.uint32)
    cuts, rounds = [], []
    for first in range(0, keys.size, tile):
        part = keys[first : first + tile]
        entering = part if threshold is None else part[part > threshold]
        both = np.concatenate([buffer, entering])
        if both.size > size:
            cuts.append(buffer.size)
            threshold, took = radix_select(both, k)
            rounds.append(took)
            buffer = np.sort(both)[-k:]  # the k best (which of tied keys stay does not change the next fill)
        else:
            buffer = both
    if buffer.size <= k:
        return _Offers(tuple(cuts), tuple(rounds), None, RADIX_ROUNDS)
    return _Offers(tuple(cuts), tuple(rounds), buffer.size, radix_select(buffer, k)[1])
