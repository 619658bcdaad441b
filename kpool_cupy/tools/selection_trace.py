"""What one block's streaming selection does on given logits (kernels/kpool_select.cuh's ``select_best`` in
kpool_index_topk; a token's offers in kpool_index_select_fp8): how many tiles it offers, and at which buffer fill
it cuts back. The selection's result never depends on this; its cost does (a cut-back is a radix select over the
buffer, ten tiles' worth of instructions), so ``scripts/bench_model.py`` counts the cut-backs the benchmark's
logits make instead of one at every tile.

The rule, as the kernels' comments state it: keys are ``order_key``'s; a selection may start from a seed's k-th
largest key (a key at or above it is offered): select_best's range of more than one tile from its last tile's
candidates, a fused select's token from the chunks that hold its last k; each tile's offered keys join the buffer
(``CAP + kSelectChunk`` entries) or, where they would not fit, the buffer and they are cut back to their ``k``
best and only keys above the k-th largest are offered after; after the last tile a buffer of more than ``k`` is
cut back once more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SELECT_CHUNK = 1024  # kp::kSelectChunk: candidates of one group a block (256 threads x 4)
SELECT_THREADS = 256  # kp::kSelectThreads: a histogram round's entries a trip
RADIX_ROUNDS = 4  # kth_largest_key's 8-bit rounds over a 32-bit key
SEED_CHUNKS = 3  # kpool_index_select.cu's kSeedChunks: a row this many seeds' worth takes a seed
ROUND_BARRIERS = 6  # a round's: histogram cleared, filled, the exclusive sum's two, the digit found and read


def order_keys(logits: np.ndarray) -> np.ndarray:
    """kp::order_key of each float32 logit: larger logits larger keys, -0.0 as +0.0, every NaN 0."""
    bits = np.ascontiguousarray(logits, dtype=np.float32).view(np.uint32)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    keys = np.where(bits & np.uint32(0x80000000), np.uint32(0x80000000) - magnitude, bits | np.uint32(0x80000000))
    return np.where(magnitude > 0x7F800000, np.uint32(0), keys).astype(np.uint32)


def _kth_largest(keys: np.ndarray, k: int) -> int:
    return int(np.partition(keys, keys.size - k)[keys.size - k])


@dataclass(frozen=True)
class SelectionTrace:
    """One range's selection: ``tiles`` offered; ``seeded`` when it started from a threshold (a radix select over
    a tile, no buffer); ``cuts`` the buffer's count at each cut-back in a tile's offer, ``finish`` at the cut
    after the last tile (None: none)."""

    tiles: int
    seeded: bool
    cuts: tuple[int, ...]
    finish: int | None

    def barriers(self) -> int:
        """The block-wide barriers it passes (kernels/kpool_select.cuh): a radix select ROUND_BARRIERS a round;
        an offer two (its block sum, its append) or, cut back, its block sum and the cut's; a cut its radix
        select, one a buffer chunk it compacts, one for the tile's candidates and one after."""

        def cut(count: int) -> int:
            return RADIX_ROUNDS * ROUND_BARRIERS + -(-count // SELECT_CHUNK) + 2

        seed = RADIX_ROUNDS * ROUND_BARRIERS if self.seeded else 0
        offers = 2 * (self.tiles - len(self.cuts)) + sum(1 + cut(count) for count in self.cuts)
        return seed + offers + (cut(self.finish) if self.finish is not None else 0)


def trace_select_best(logits: np.ndarray, k: int, tile: int, cap: int) -> SelectionTrace:
    """select_best over one range of ``logits`` (float32, ascending pool id) at ``pool_topk`` k, ``tile``
    candidates a tile (kTile) and a buffer for ``cap``: seeded from the last whole tile's candidates (from the
    last multiple of 4 that leaves one) where the range holds more than a tile and they number k."""
    seed_first = (logits.size - tile) // 4 * 4
    seeded = logits.size > tile and min(logits.size - seed_first, tile) >= k
    return trace_offers(logits, k, tile, cap, (seed_first, tile) if seeded else None)


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
    size = cap + SELECT_CHUNK
    cut, threshold = False, 0
    if seed is not None:
        kth = _kth_largest(keys[seed[0] : seed[0] + seed[1]], k)
        cut, threshold = kth > 0, (kth - 1) % 2**32
    buffer = np.empty(0, np.uint32)
    cuts = []
    for first in range(0, keys.size, tile):
        part = keys[first : first + tile]
        entering = part[part > threshold] if cut else part
        both = np.concatenate([buffer, entering])
        if both.size > size:
            cuts.append(buffer.size)
            threshold = _kth_largest(both, k)
            buffer = np.sort(both)[-k:]  # the k best (which of tied keys stay does not change the next fill)
            cut = True
        else:
            buffer = both
    finish = buffer.size if buffer.size > k else None
    return SelectionTrace(-(-keys.size // tile), seed is not None, tuple(cuts), finish)
