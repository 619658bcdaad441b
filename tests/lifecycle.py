"""A whole request's life on one backend: prefill in chunks, then decode, with shuffled batches.

Every pool any call closes is recorded per request; the test compares them
with one kpool_compress of each whole sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType

import numpy as np


@dataclass
class Sequence:
    keys: np.ndarray  # [length, head_dim]
    gates: np.ndarray
    slot: int
    prefill: int  # tokens handed over in prefill chunks; the rest are decoded
    done: int = 0  # tokens handed over so far
    pools: dict[int, bytes] = field(default_factory=dict)

    def record(self, pool: int, row: np.ndarray) -> None:
        assert pool not in self.pools, f"pool {pool} closed twice"
        self.pools[pool] = row.tobytes()


def prefill_step(backend: ModuleType, tail, ape, batch: list[Sequence], chunks: list[int]) -> None:
    """Ring close, compress, seed tail: one prefill call over ``batch`` taking ``chunks`` tokens each."""
    kpool = ape.shape[0]
    offsets = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int64)
    cache = np.array([s.done for s in batch], np.int64)
    slots = np.array([s.slot for s in batch], np.int32)
    k = np.concatenate([s.keys[s.done : s.done + n] for s, n in zip(batch, chunks, strict=True)])
    gate = np.concatenate([s.gates[s.done : s.done + n] for s, n in zip(batch, chunks, strict=True)])
    pooled, closed = backend.kpool_ring_close(tail, k, gate, ape, offsets, cache, slots)
    for b, sequence in enumerate(batch):
        if closed[b] >= 0:
            sequence.record(int(closed[b]), pooled[b])
    compressed = backend.kpool_compress(k, gate, ape, offsets, cache)
    row = 0
    for sequence, n in zip(batch, chunks, strict=True):
        for pool in range(-(-sequence.done // kpool), (sequence.done + n) // kpool):
            sequence.record(pool, compressed[row])
            row += 1
    assert row == compressed.shape[0]
    backend.kpool_seed_tail(tail, k, gate, offsets, cache, slots)
    for sequence, n in zip(batch, chunks, strict=True):
        sequence.done += n


def decode_step(backend: ModuleType, tail, ape, batch: list[Sequence], next_n: int) -> None:
    """One tail update over ``batch``, up to ``next_n`` tokens each, the rest padding."""
    head_dim = ape.shape[1]
    dtype = batch[0].keys.dtype
    k = np.zeros((len(batch), next_n, head_dim), dtype)
    gate = np.zeros_like(k)
    positions = np.full((len(batch), next_n), -1, np.int32)
    for r, sequence in enumerate(batch):
        take = min(next_n, len(sequence.keys) - sequence.done)
        k[r, :take] = sequence.keys[sequence.done : sequence.done + take]
        gate[r, :take] = sequence.gates[sequence.done : sequence.done + take]
        positions[r, :take] = np.arange(sequence.done, sequence.done + take)
        sequence.done += take
    slots = np.array([s.slot for s in batch], np.int32)
    pooled, closed = backend.kpool_tail_update(tail, k, gate, ape, positions, slots)
    for r, sequence in enumerate(batch):
        for j in range(closed.shape[1]):
            if closed[r, j] >= 0:
                sequence.record(int(closed[r, j]), pooled[r, j])


def run_life(
    backend: ModuleType, sequences: list[Sequence], ape: np.ndarray, max_slots: int, rng, zeros=np.zeros
) -> None:
    """Prefill every sequence in random chunks, then decode it in random steps, batches shuffled each call.

    ``zeros`` makes the ring, so a GPU backend can keep it on the device.
    """
    kpool, head_dim = ape.shape
    tail = zeros((max_slots, 2, kpool, head_dim), sequences[0].keys.dtype)
    while any(s.done < s.prefill for s in sequences):
        batch = [s for s in sequences if s.done < s.prefill and rng.random() < 0.8]
        if not batch:
            continue
        rng.shuffle(batch)
        chunks = [int(rng.integers(0, s.prefill - s.done + 1)) for s in batch]
        prefill_step(backend, tail, ape, batch, chunks)
    while any(s.done < len(s.keys) for s in sequences):
        batch = [s for s in sequences if s.done < len(s.keys)]
        rng.shuffle(batch)
        decode_step(backend, tail, ape, batch, int(rng.integers(1, 4)))
