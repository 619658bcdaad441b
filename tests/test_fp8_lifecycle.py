"""The FP8 writers across a request's life (issue 12): ring close, compress and tail update into one paged cache.

An engine fills its FP8 indexer cache with one call per prefill chunk
(ring close, compress, seed tail) and one per decode step (tail update),
each writing through the request's block table. After the whole schedule
the cache must hold exactly the bytes one ``kpool_compress_fp8`` over each
whole sequence writes: every writer pools through the same helper in member
order and shares the epilogue, so the bytes agree exactly, not to a
tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16, F32

from kpool_cupy import emulate, reference

HEAD_DIM, KPOOL, BLOCK_SIZE = 64, 4, 4


def _ring(form: str, max_slots: int, rows: int, dtype, gate_dtype):
    """A ring of each form the decode-path issue added: one array, a split pair, padded slots and rows."""
    if form == "one":
        return np.zeros((max_slots, 2, rows, HEAD_DIM), dtype)
    if form == "split":
        return (np.zeros((max_slots, rows, HEAD_DIM), dtype), np.zeros((max_slots, rows, HEAD_DIM), gate_dtype))
    padded = np.zeros((max_slots + 1, 2, rows + 3, HEAD_DIM + 8), dtype)  # every stride padded
    return padded[1:, :, 2 : 2 + rows, 8:]


def _life(module, form: str, ring_rows: int, seed: int):
    rng = np.random.default_rng(seed)
    gate_dtype = F32 if form == "split" else BF16
    lengths = [int(n) for n in rng.integers(1, 40, 5)]
    prefill = [int(rng.integers(0, n + 1)) for n in lengths]
    keys = [rng.standard_normal((n, HEAD_DIM)).astype(BF16) for n in lengths]
    gates = [(3 * rng.standard_normal((n, HEAD_DIM))).astype(gate_dtype) for n in lengths]
    ape = rng.standard_normal((KPOOL, HEAD_DIM)).astype(np.float32)
    max_blocks = max(lengths) // KPOOL // BLOCK_SIZE + 1
    pages = rng.permutation(len(lengths) * max_blocks + 3)[: len(lengths) * max_blocks]
    table = pages.reshape(len(lengths), max_blocks).astype(np.int32)  # each request's pages, shuffled
    cache = rng.integers(0, 256, (len(lengths) * max_blocks + 3, BLOCK_SIZE, HEAD_DIM + 4), dtype=np.uint8)
    start = cache.copy()
    tail = _ring(form, len(lengths) + 2, ring_rows, BF16, gate_dtype)
    slot_of = rng.permutation(len(lengths) + 2)[: len(lengths)]
    done = [0] * len(lengths)

    while any(d < p for d, p in zip(done, prefill, strict=True)):
        batch = [b for b in range(len(lengths)) if done[b] < prefill[b] and rng.random() < 0.8]
        if not batch:
            continue
        rng.shuffle(batch)
        chunks = [int(rng.integers(0, prefill[b] - done[b] + 1)) for b in batch]
        offsets = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int64)
        cached = np.array([done[b] for b in batch], np.int64)
        slots = slot_of[batch].astype(np.int32)
        k = np.concatenate([keys[b][done[b] : done[b] + n] for b, n in zip(batch, chunks, strict=True)])
        gate = np.concatenate([gates[b][done[b] : done[b] + n] for b, n in zip(batch, chunks, strict=True)])
        rows = table[batch]
        module.kpool_ring_close_fp8(tail, k, gate, ape, offsets, cached, slots, cache=cache, block_table=rows)
        module.kpool_compress_fp8(k, gate, ape, offsets, cached, cache=cache, block_table=rows)
        module.kpool_seed_tail(tail, k, gate, offsets, cached, slots, kpool=KPOOL)
        for b, n in zip(batch, chunks, strict=True):
            done[b] += n

    while any(d < n for d, n in zip(done, lengths, strict=True)):
        batch = [b for b in range(len(lengths)) if done[b] < lengths[b]]
        rng.shuffle(batch)
        next_n = int(rng.integers(1, ring_rows - KPOOL + 2))  # a ring of kpool + n - 1 rows takes n a step
        k = np.zeros((len(batch), next_n, HEAD_DIM), BF16)
        gate = np.zeros((len(batch), next_n, HEAD_DIM), gate_dtype)
        positions = np.full((len(batch), next_n), -1, np.int32)
        for r, b in enumerate(batch):
            take = min(next_n, lengths[b] - done[b])
            k[r, :take], gate[r, :take] = keys[b][done[b] : done[b] + take], gates[b][done[b] : done[b] + take]
            positions[r, :take] = np.arange(done[b], done[b] + take)
            done[b] += take
        slots = slot_of[batch].astype(np.int32)
        closed = module.kpool_tail_update_fp8(
            tail, k, gate, ape, positions, slots, cache=cache, block_table=table[batch]
        )
        assert closed.shape == (len(batch), -(-next_n // KPOOL))

    # One compress over every whole sequence, into the cache as it was.
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    want = start.copy()
    module.kpool_compress_fp8(
        np.concatenate(keys), np.concatenate(gates), ape, offsets, np.zeros(len(lengths), np.int64), cache=want,
        block_table=table,
    )  # fmt: skip
    return cache, want, start


@pytest.mark.parametrize(("form", "ring_rows"), [("one", KPOOL), ("split", KPOOL + 2), ("padded", KPOOL + 1)])
@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_chunked_prefill_then_decode_fills_the_cache_with_one_compress_bytes(module, form, ring_rows):
    for seed in range(3):
        cache, want, start = _life(module, form, ring_rows, seed)
        assert not np.array_equal(want, start)  # the schedule wrote pools at all
        assert np.array_equal(cache, want), f"seed {seed}: {int((cache != want).sum())} bytes differ"


def _ring_call(rng, gate_dtype=BF16):
    """One ring close call: requests mid-pool with enough tokens, one not closing, one with too few."""
    lengths, cached = [6, 2, 5, 9], [1, 0, 3, 2]
    k = rng.standard_normal((sum(lengths), HEAD_DIM)).astype(BF16)
    gate = (3 * rng.standard_normal((sum(lengths), HEAD_DIM))).astype(gate_dtype)
    ape = rng.standard_normal((KPOOL, HEAD_DIM)).astype(np.float32)
    tail = rng.standard_normal((6, 2, KPOOL, HEAD_DIM)).astype(BF16)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return tail, k, gate, ape, offsets, np.array(cached, np.int32), np.array([4, 0, 2, 5], np.int32)
