"""kpool_seed_tail: each call stashes its last tokens, so a ring ends the same however a prompt is chunked."""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16

from kpool_cupy import emulate, reference

BACKENDS = {"emulate": emulate, "reference": reference}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize(
    ("ring", "split"),
    [(8, (3, 4)), (6, (18,)), (6, (10, 8)), (6, (15, 3)), (6, (1, 16, 1)), (6, (5, 5, 5, 3))],
)
def test_seeding_a_ring_in_chunks_equals_seeding_it_at_once(backend, ring, split):
    # Seed tail takes no kpool: it stashes each call's last min(n, ring)
    # tokens, so however a prompt is chunked the ring ends the same (18
    # tokens into a 6-row ring: positions 12..17, rows 0..5; 7 tokens into
    # an 8-row ring: rows 0..6, row 7 untouched).
    tokens = sum(split)
    rng = np.random.default_rng(tokens + len(split))
    keys = rng.standard_normal((tokens, 16)).astype(BF16)
    gates = rng.standard_normal((tokens, 16)).astype(BF16)
    once, chunked = np.zeros((1, 2, ring, 16), BF16), np.zeros((1, 2, ring, 16), BF16)
    slot = np.array([0], np.int32)
    run = BACKENDS[backend].kpool_seed_tail
    run(once, keys, gates, np.array([0, tokens], np.int64), np.array([0], np.int64), slot)
    start = 0
    for n in split:
        end = start + n
        run(chunked, keys[start:end], gates[start:end], np.array([0, n], np.int64), np.array([start]), slot)
        start = end
    assert np.array_equal(once.view(np.uint16), chunked.view(np.uint16))
    last = range(max(tokens - ring, 0), tokens)  # position p at row p % ring
    assert np.array_equal(once[0, 0, [p % ring for p in last]], keys[list(last)])
    assert not once[0, :, tokens:].any()  # rows no position reached


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_seed_tail_without_kpool_on_a_longer_ring_keeps_the_next_pool_right(backend):
    # kpool 4, a 6-row ring, 18 prefill tokens and seed tail without kpool=:
    # the pool the next two decoded tokens close (positions 16..19) is the
    # one a single compress over all 20 tokens builds.
    module = BACKENDS[backend]
    rng = np.random.default_rng(18)
    keys = rng.standard_normal((20, 16)).astype(BF16)
    gates = (3 * rng.standard_normal((20, 16))).astype(BF16)
    ape = rng.standard_normal((4, 16)).astype(np.float32)
    tail, slot = np.zeros((1, 2, 6, 16), BF16), np.array([0], np.int32)
    module.kpool_seed_tail(tail, keys[:18], gates[:18], np.array([0, 18], np.int64), np.array([0], np.int64), slot)
    positions = np.array([[18, 19]], np.int32)
    pooled, closed = module.kpool_tail_update(tail, keys[None, 18:], gates[None, 18:], ape, positions, slot)
    whole = module.kpool_compress(keys, gates, ape, np.array([0, 20], np.int64), np.array([0], np.int64))
    assert closed.tolist() == [[4]]
    assert pooled[0, 0].tobytes() == whole[4].tobytes()
