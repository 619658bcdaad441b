"""In a uint32 index array where -1 means something, the all-ones value is -1, on every backend and kernel.

positions' -1 is padding, a slot or pool id of -1 is none; their uint32
form 0xFFFFFFFF must read the same, not as position 4294967295 (which
would overwrite ring row (2^32 - 1) % ring and report a closed pool).
Offsets and lengths keep their full uint32 range.
"""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16

from kpool_cupy import emulate, reference

BACKENDS = {"emulate": emulate, "reference": reference}
ALL_ONES = np.uint32(0xFFFFFFFF)


def _step(rng, requests=3, next_n=3, kpool=4):
    k = rng.standard_normal((requests, next_n, 16)).astype(BF16)
    gate = rng.standard_normal((requests, next_n, 16)).astype(BF16)
    ape = rng.standard_normal((kpool, 16)).astype(np.float32)
    # Request 0 closes pool 0 at position 3; request 1 is padding after one
    # token; request 2 is all padding.
    positions = np.array([[1, 2, 3], [5, -1, -1], [-1, -1, -1]], np.int64)
    return k, gate, ape, positions


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("validate", [True, False])
def test_uint32_all_ones_positions_are_padding_like_int32_minus_one(backend, validate):
    module = BACKENDS[backend]
    rng = np.random.default_rng(32)
    k, gate, ape, positions = _step(rng)
    rings = {}
    results = {}
    for dtype in (np.int32, np.uint32):
        tail = rng.standard_normal((3, 2, 6, 16)).astype(BF16) if not rings else rings[np.int32][0].copy()
        before = tail.copy()
        given = (
            positions.astype(dtype) if dtype is np.int32 else np.where(positions < 0, ALL_ONES, positions).astype(dtype)
        )
        slots = np.array([0, 1, 2], dtype)
        pooled, closed = module.kpool_tail_update(tail, k, gate, ape, given, slots, validate=validate)
        rings[dtype] = (before, tail)
        results[dtype] = (pooled.tobytes(), closed.tolist())
    assert results[np.uint32] == results[np.int32]
    assert results[np.int32][1] == [[0], [-1], [-1]]
    before, tail = rings[np.uint32]
    assert np.array_equal(tail[2].view(np.uint16), before[2].view(np.uint16))  # all padding: ring untouched
    assert np.array_equal(tail[1, :, [0, 2, 3, 4]].view(np.uint16), before[1, :, [0, 2, 3, 4]].view(np.uint16))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("function", ["kpool_ring_close", "kpool_seed_tail"])
def test_uint32_all_ones_slot_is_minus_one(backend, function):
    # validate=True refuses it as -1 (not as slot 4294967295); validate=False skips the request as it skips -1.
    module = BACKENDS[backend]
    rng = np.random.default_rng(7)
    k = rng.standard_normal((6, 16)).astype(BF16)
    ape = rng.standard_normal((4, 16)).astype(np.float32)
    offsets, lengths = np.array([0, 3, 6], np.uint32), np.array([2, 5], np.uint32)
    tail = rng.standard_normal((2, 2, 4, 16)).astype(BF16)
    slots = np.array([0, ALL_ONES], np.uint32)
    args = (
        (tail, k, k, ape, offsets, lengths, slots)
        if function == "kpool_ring_close"
        else (tail, k, k, offsets, lengths, slots)
    )
    with pytest.raises(ValueError, match=r"Invalid slot_idx: .* got -1 at index 1"):
        getattr(module, function)(*args)
    before = tail.copy()
    getattr(module, function)(*args, validate=False)
    assert np.array_equal(tail[1].view(np.uint16), before[1].view(np.uint16))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_uint32_all_ones_pool_id_expands_to_minus_one(backend):
    module = BACKENDS[backend]
    pool_ids = np.array([[0, ALL_ONES], [ALL_ONES, 1]], np.uint32)
    got = module.kpool_expand_topk(pool_ids, np.array([0, 2], np.int64), np.array([8], np.int64), kpool=2)
    assert got.tolist() == [[0, 1, -1, -1], [-1, -1, 2, 3]]
