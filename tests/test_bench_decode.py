"""The benchmark's decode side on the CPU: its shapes, byte counts and inputs, and its two composites run with
NumPy against kpool_cupy.reference.

No test here times anything or asserts a speed.
"""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16, assert_close_to_model

from kpool_cupy import reference
from kpool_cupy.bench.lifecycle import (
    BLOCK_SIZE,
    POOL_TOPK,
    DecodeShape,
    composite_expand,
    composite_tail_update,
    decode_shapes,
    expand_bytes,
    max_abs_difference,
    paged_inputs,
    step_positions,
    tail_update_bytes,
)

ROW = 128 * 2  # one bfloat16 row of head_dim 128


def test_a_shape_without_a_ring_keeps_kpool_rows_and_its_name():
    # Existing records keep their names, so results stay comparable across runs.
    shape = DecodeShape(64, 2)
    assert shape.ring == shape.kpool == 4 and shape.name == "decode-64x2" and shape.pools == 1
    assert DecodeShape(64, 4, ring=8).name == "decode-64x4-ring8"


@pytest.mark.parametrize(("next_n", "ring"), [(1, 3), (5, 4), (5, 7)])
def test_a_ring_shorter_than_the_pools_a_step_closes_is_refused(next_n, ring):
    # The composite stashes the whole step before pooling: with fewer than
    # pools * kpool rows a step token overwrites a member of a pool it closes.
    with pytest.raises(ValueError, match="Invalid ring"):
        DecodeShape(1, next_n, kpool=4, ring=ring)


def test_decode_shapes_add_next_n_2_and_4_on_a_ring_of_two_pools():
    shapes = decode_shapes()
    assert {(s.next_n, s.ring) for s in shapes if s.ring != s.kpool} == {(2, 8), (4, 8)}
    # The entries before the ring's stay as they were.
    assert {(s.requests, s.next_n) for s in shapes if s.ring == s.kpool} == {
        (r, n) for r in (1, 8, 64, 512) for n in (1, 2)
    }
    assert len({s.name for s in shapes}) == len(shapes)
    quick = decode_shapes(quick=True)
    assert set(quick) < set(shapes) and any(s.ring == 2 * s.kpool and s.next_n < s.kpool for s in quick)


def test_tail_update_bytes_do_not_depend_on_the_ring():
    # next_n 4 at kpool 4 brings every member of the one pool it closes: nothing is read back.
    shape = DecodeShape(8, 4, ring=8)
    assert tail_update_bytes(shape) == 8 * 4 * 2 * ROW * 2 + 8 * ROW
    assert tail_update_bytes(DecodeShape(8, 2, ring=8)) == tail_update_bytes(DecodeShape(8, 2))


def test_tail_update_bytes_when_a_step_closes_two_pools():
    # next_n 5 at kpool 4 closes two pools: 8 members, 3 from earlier steps; two pooled rows.
    shape = DecodeShape(3, 5, ring=8)
    assert shape.pools == 2
    assert tail_update_bytes(shape) == 3 * 5 * 2 * ROW * 2 + 3 * (3 * 2 * ROW + 2 * ROW)


@pytest.mark.parametrize(
    ("kpool", "ring", "next_n"), [(4, 4, 1), (4, 4, 4), (4, 8, 2), (4, 8, 4), (4, 8, 5), (2, 5, 3)]
)
def test_the_benchmark_positions_close_what_the_byte_count_counts(kpool, ring, next_n):
    # The byte count assumes every request closes `pools` pools whose members
    # outside the step number pools * kpool - next_n; the reference says which
    # pools the benchmark's positions close.
    shape = DecodeShape(6, next_n, head_dim=8, kpool=kpool, ring=ring)
    positions = step_positions(np, np.random.default_rng(4), 1, shape)[0]
    tail = np.zeros((6, 2, ring, 8), BF16)
    step = np.zeros((6, next_n, 8), BF16)
    ape = np.zeros((kpool, 8), np.float32)
    _, closed = reference.kpool_tail_update(tail, step, step, ape, positions, np.arange(6, dtype=np.int32))
    assert (closed >= 0).all() and closed.shape == (6, shape.pools)
    members = closed[..., None].astype(np.int64) * kpool + np.arange(kpool)
    older = [np.setdiff1d(members[r], positions[r]).size for r in range(6)]
    assert older == [shape.pools * kpool - next_n] * 6


# Rings of kpool and of 2 * kpool rows at next_n 1, 2, 4 (the benchmark's);
# two pools in one step; a ring that is no multiple of kpool, so members wrap.
TAIL_CASES = [(4, 4, 1), (4, 4, 2), (4, 4, 4), (4, 8, 2), (4, 8, 4), (4, 8, 5), (2, 5, 3), (3, 7, 6)]


@pytest.mark.parametrize(("kpool", "ring", "next_n"), TAIL_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_composite_tail_update_matches_the_reference(kpool, ring, next_n, seed):
    rng = np.random.default_rng(seed)
    requests, max_slots, head_dim = 5, 9, 16
    shape = DecodeShape(requests, next_n, head_dim=head_dim, kpool=kpool, ring=ring)
    positions = step_positions(np, rng, 1, shape)[0]
    k = rng.standard_normal((requests, next_n, head_dim)).astype(BF16)
    gate = (3 * rng.standard_normal((requests, next_n, head_dim))).astype(BF16)
    ape = rng.standard_normal((kpool, head_dim)).astype(np.float32)
    # Random rings, so the members from earlier steps count; slots shuffled, some slots unused.
    tail = (3 * rng.standard_normal((max_slots, 2, ring, head_dim))).astype(BF16)
    slots = rng.permutation(max_slots)[:requests].astype(np.int32)
    ours, theirs = tail.copy(), tail.copy()
    want, _ = reference.kpool_tail_update(ours, k, gate, ape, positions, slots)
    got = composite_tail_update(np, theirs, k, gate, ape, positions, slots, kpool)
    assert got.shape == want.shape == (requests, shape.pools, head_dim)
    # The composite stashed the step where the op did.
    np.testing.assert_array_equal(theirs.view(np.uint16), ours.view(np.uint16))
    assert_close_to_model(got.reshape(-1, head_dim), want.reshape(-1, head_dim).astype(np.float64), BF16)
    assert max_abs_difference(np, got, want) < 0.1


def test_composite_tail_update_refuses_a_ring_too_short_for_its_step():
    tail = np.zeros((1, 2, 4, 8), BF16)
    step = np.zeros((1, 5, 8), BF16)
    positions = np.arange(3, 8, dtype=np.int32)[None]
    with pytest.raises(ValueError, match="at least 8 rows"):
        composite_tail_update(np, tail, step, step, np.zeros((4, 8), np.float32), positions, np.zeros(1, np.int32), 4)


def _token_requests(offsets: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


@pytest.mark.parametrize("kpool", [1, 3, 4])
def test_composite_expand_matches_the_reference(kpool):
    # -1 ids (some rows all -1) stay -1 in all their columns.
    rng = np.random.default_rng(kpool)
    ids = rng.integers(-1, 500, (7, 12)).astype(np.int32)
    ids[2] = -1
    offsets, cache = np.array([0, 7], np.int32), np.zeros(1, np.int32)
    want = reference.kpool_expand_topk(ids, offsets, cache, kpool=kpool)
    got = composite_expand(np, ids, np.arange(kpool, dtype=np.int64))
    assert got.dtype == want.dtype == np.int32
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("kpool", "block_size"), [(4, 16), (4, 3), (1, 1), (3, 4)])
def test_composite_expand_through_a_block_table_matches_the_reference(kpool, block_size):
    # Several tokens per request, pages shuffled across requests, unallocated
    # (-1) entries; block sizes that are and are not multiples of kpool, so
    # a pool can straddle two pages.
    rng = np.random.default_rng(block_size)
    offsets = np.array([0, 3, 4, 4, 9], np.int32)  # request 2 has no token
    cache = np.array([5, 0, 7, 30], np.int32)
    batch, max_blocks = 4, 10
    pools = max_blocks * block_size // kpool  # every pool's positions inside the table
    ids = rng.integers(-1, pools, (9, 6)).astype(np.int32)
    table = rng.permutation(batch * max_blocks).astype(np.int32).reshape(batch, max_blocks)
    table[rng.random(table.shape) < 0.2] = -1
    want = reference.kpool_expand_topk(ids, offsets, cache, kpool=kpool, block_table=table, block_size=block_size)
    member = np.arange(kpool, dtype=np.int64)
    got = composite_expand(np, ids, member, table, block_size, _token_requests(offsets))
    np.testing.assert_array_equal(got, want)
    assert (want == -1).any() and (want >= 0).any()
    assert max_abs_difference(np, got, want) == 0.0


def test_paged_inputs_select_one_pool_in_every_page_through_a_shuffled_table():
    # What expand_bytes counts: one block-table entry per selected pool, none
    # shared, since each token's pools lie in distinct pages of its request.
    kpool, tokens, pages, count = 4, 3, 32, 2
    ids, tables = paged_inputs(np, np.random.default_rng(5), count, tokens, pages, kpool, BLOCK_SIZE)
    assert ids.shape == tables.shape == (count, tokens, pages) and ids.dtype == tables.dtype == np.int32
    page_of = ids.astype(np.int64) * kpool // BLOCK_SIZE
    np.testing.assert_array_equal(np.sort(page_of, axis=-1), np.broadcast_to(np.arange(pages), page_of.shape))
    for table in tables:  # each set's table: a shuffle of all its pages
        np.testing.assert_array_equal(np.sort(table.ravel()), np.arange(tokens * pages))
        assert not np.array_equal(table.ravel(), np.arange(tokens * pages))
    # The benchmark's call: one token per request, the context the table's whole reach.
    offsets = np.arange(tokens + 1, dtype=np.int32)
    cache = np.full(tokens, pages * BLOCK_SIZE - 1, np.int32)
    member, request = np.arange(kpool, dtype=np.int64), np.arange(tokens)
    for s in range(count):
        paging = {"block_table": tables[s], "block_size": BLOCK_SIZE}
        want = reference.kpool_expand_topk(ids[s], offsets, cache, kpool=kpool, **paging)
        got = composite_expand(np, ids[s], member, tables[s], BLOCK_SIZE, request)
        np.testing.assert_array_equal(got, want)
        assert (want >= 0).all()


def test_expand_bytes_count_the_block_table_once_per_selected_pool():
    assert expand_bytes(10, POOL_TOPK, 4) == 10 * 512 * 4 + 10 * 2048 * 4
    assert expand_bytes(10, POOL_TOPK, 4, paged=True) == expand_bytes(10, POOL_TOPK, 4) + 10 * 512 * 4


def test_max_abs_difference_is_exact_for_integers_and_refuses_other_shapes():
    # float32 could not tell 2^30 + 1 from 2^30.
    big = np.array([1 << 30, 5], np.int32)
    assert max_abs_difference(np, big + np.array([1, 0], np.int32), big) == 1.0
    assert max_abs_difference(np, big, big) == 0.0
    halves = np.array([0.5, -2.0], BF16)
    assert max_abs_difference(np, halves, np.array([0.25, -2.0], BF16)) == 0.25
    assert max_abs_difference(np, np.zeros((0, 3), np.int32), np.zeros((0, 3), np.int32)) == 0.0
    with pytest.raises(ValueError, match="shape"):
        max_abs_difference(np, np.zeros((2, 1, 3)), np.zeros((2, 3)))
