"""The pool lifecycle: chunked prefill and decode build the same pools, bit for bit, as one call."""

from __future__ import annotations

import numpy as np
import pytest
from lifecycle import Sequence, decode_step, prefill_step, run_life
from model import BF16, F16, F32

from kpool_cupy import emulate, reference

BACKENDS = {"emulate": emulate, "reference": reference}


def _sequences(rng, count: int, head_dim: int, dtype) -> list[Sequence]:
    slots = rng.permutation(count + 3)[:count]  # slots are not request rows
    sequences = []
    for i in range(count):
        length = int(rng.integers(0, 40))
        sequences.append(
            Sequence(
                keys=rng.standard_normal((length, head_dim)).astype(dtype),
                gates=(3 * rng.standard_normal((length, head_dim))).astype(dtype),
                slot=int(slots[i]),
                prefill=int(rng.integers(0, length + 1)),
            )
        )
    return sequences


def _assert_same_as_one_call(backend, sequences, ape):
    kpool = ape.shape[0]
    for i, sequence in enumerate(sequences):
        length = len(sequence.keys)
        whole = backend.kpool_compress(
            sequence.keys, sequence.gates, ape, np.array([0, length], np.int64), np.array([0], np.int64)
        )
        assert sorted(sequence.pools) == list(range(length // kpool)), f"sequence {i}: pools {sorted(sequence.pools)}"
        for pool in range(length // kpool):
            assert sequence.pools[pool] == whole[pool].tobytes(), f"sequence {i}, pool {pool} differs"


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("kpool", [1, 2, 4, 8])
@pytest.mark.parametrize("seed", range(6))
def test_chunked_prefill_then_decode_equals_one_call(backend, kpool, seed):
    # Random chunk sizes off the pool grid, decode steps of 1-3 tokens with
    # padding, batch order shuffled every call while each request keeps its slot.
    rng = np.random.default_rng(1000 * kpool + seed)
    dtype = [BF16, F16, F32][seed % 3]
    sequences = _sequences(rng, 5, 16, dtype)
    ape = rng.standard_normal((kpool, 16)).astype(np.float32)
    run_life(BACKENDS[backend], sequences, ape, max_slots=8, rng=rng)
    assert sum(len(s.pools) for s in sequences) > 0, "the schedule closed no pool at all"
    _assert_same_as_one_call(BACKENDS[backend], sequences, ape)


def _one(rng, length, head_dim=32, slot=0, prefill=0):
    return Sequence(
        keys=rng.standard_normal((length, head_dim)).astype(BF16),
        gates=(3 * rng.standard_normal((length, head_dim))).astype(BF16),
        slot=slot,
        prefill=prefill,
    )


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_decode_output_equals_prefill_output(backend):
    rng = np.random.default_rng(1)
    ape = rng.standard_normal((4, 32)).astype(np.float32)
    sequence = _one(rng, 17)
    tail = np.zeros((1, 2, 4, 32), BF16)
    while sequence.done < 17:
        decode_step(BACKENDS[backend], tail, ape, [sequence], 1)
    _assert_same_as_one_call(BACKENDS[backend], [sequence], ape)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_neighbouring_rings_do_not_mix(backend):
    # Adjacent slots, decoded together: each request sees only its own ring.
    rng = np.random.default_rng(2)
    ape = rng.standard_normal((4, 32)).astype(np.float32)
    a, b = _one(rng, 13, slot=1, prefill=3), _one(rng, 11, slot=2, prefill=6)
    tail = np.zeros((4, 2, 4, 32), BF16)
    prefill_step(BACKENDS[backend], tail, ape, [a, b], [3, 6])
    while a.done < 13 or b.done < 11:
        decode_step(BACKENDS[backend], tail, ape, [s for s in (a, b) if s.done < len(s.keys)], 1)
    _assert_same_as_one_call(BACKENDS[backend], [a, b], ape)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_batch_that_swaps_rows_changes_nothing(backend):
    rng = np.random.default_rng(3)
    ape = rng.standard_normal((4, 32)).astype(np.float32)
    results = []
    for order in ((0, 1), (1, 0)):
        local = np.random.default_rng(30)
        pair = [_one(local, 10, slot=0, prefill=2), _one(local, 10, slot=1, prefill=5)]
        tail = np.zeros((2, 2, 4, 32), BF16)
        prefill_step(BACKENDS[backend], tail, ape, pair, [2, 5])
        swapped = [pair[i] for i in order]
        while any(s.done < 10 for s in pair):
            decode_step(BACKENDS[backend], tail, ape, swapped, 2)
        results.append([dict(s.pools) for s in pair])
    assert results[0] == results[1]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("next_n", [2, 8])
def test_speculative_steps_match_single_steps(backend, next_n):
    rng = np.random.default_rng(4)
    ape = rng.standard_normal((4, 32)).astype(np.float32)
    pools = []
    for step in (1, next_n):
        sequence = _one(np.random.default_rng(40), 24, prefill=5)
        tail = np.zeros((1, 2, 4, 32), BF16)
        prefill_step(BACKENDS[backend], tail, ape, [sequence], [5])
        while sequence.done < 24:
            decode_step(BACKENDS[backend], tail, ape, [sequence], step)
        pools.append(sequence.pools)
    assert pools[0] == pools[1] and len(pools[0]) == 6


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_padding_leaves_the_ring_byte_identical(backend):
    rng = np.random.default_rng(5)
    ape = rng.standard_normal((4, 32)).astype(np.float32)
    tail = rng.standard_normal((2, 2, 4, 32)).astype(BF16)
    before = tail.copy()
    k = rng.standard_normal((2, 3, 32)).astype(BF16)
    positions = np.full((2, 3), -1, np.int32)
    _, closed = BACKENDS[backend].kpool_tail_update(tail, k, k, ape, positions, np.array([0, 1], np.int32))
    assert np.array_equal(tail.view(np.uint16), before.view(np.uint16))
    assert np.all(closed == -1)


def _expand_by_hand(pool_ids, offsets, cache, kpool, tail):
    rows = []
    for b in range(len(cache)):
        for local in range(offsets[b + 1] - offsets[b]):
            token = offsets[b] + local
            row = []
            for p in pool_ids[token]:
                row += [p * kpool + j if p >= 0 else -1 for j in range(kpool)]
            if tail:
                visible = cache[b] + local + 1
                count = visible % kpool
                row += [visible - count + i if i < count else -1 for i in range(kpool - 1)]
            rows.append(row)
    return np.array(rows, np.int32)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("tail", [False, True])
def test_expand_topk_upstream_case(backend, tail):
    # Cache lengths 0, 6, 7 and 9, pool_topk 512: width 2048 (+3 = 2051).
    rng = np.random.default_rng(7)
    lengths, cache, kpool = [5, 3, 1, 6], [0, 6, 7, 9], 4
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    pool_ids = rng.integers(-1, 50, (sum(lengths), 512)).astype(np.int32)
    pool_ids[:, ::7] = -1  # plenty of unselected slots
    got = BACKENDS[backend].kpool_expand_topk(
        pool_ids, offsets, np.array(cache, np.int32), kpool=kpool, always_select_tail=tail
    )
    assert got.shape == (sum(lengths), 2051 if tail else 2048) and got.dtype == np.int32
    np.testing.assert_array_equal(got, _expand_by_hand(pool_ids, offsets, cache, kpool, tail))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("kpool", [3, 4, 5])
def test_expand_never_clamps(backend, kpool):
    # -1 and any other negative id, and ids whose last position would not fit
    # int32, stay -1 in every column; the largest id that fits expands whole.
    fits = (2**31 - 1 - (kpool - 1)) // kpool
    pool_ids = np.array([[-1, -5, fits + 1, fits, 3]], np.int64)
    got = BACKENDS[backend].kpool_expand_topk(
        pool_ids, np.array([0, 1], np.int32), np.array([0], np.int32), kpool=kpool
    )
    np.testing.assert_array_equal(got[0, : 3 * kpool], -1)
    np.testing.assert_array_equal(got[0, 3 * kpool : 4 * kpool], fits * kpool + np.arange(kpool))
    assert got[0, 4 * kpool - 1] <= 2**31 - 1
    np.testing.assert_array_equal(got[0, 4 * kpool :], 3 * kpool + np.arange(kpool))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_padded_rows_may_share_a_slot(backend):
    # All-padding rows write nothing, so they may point at one dummy slot.
    rng = np.random.default_rng(9)
    tail = np.zeros((3, 2, 4, 32), BF16)
    k = rng.standard_normal((4, 1, 32)).astype(BF16)
    positions = np.array([[3], [-1], [-1], [7]], np.int32)
    slots = np.array([0, 2, 2, 1], np.int32)
    _, closed = BACKENDS[backend].kpool_tail_update(tail, k, k, rng.standard_normal((4, 32)).astype(np.float32),
                                                    positions, slots)  # fmt: skip
    np.testing.assert_array_equal(closed[:, 0], [0, -1, -1, 1])
    assert not tail[2].any()


@pytest.mark.slow
@pytest.mark.parametrize("kpool", [2, 4])
def test_bit_identity_does_not_depend_on_the_host_compilers_contraction(monkeypatch, kpool):
    # Issue 9, finding 7: built to contract multiply-adds freely (as NVRTC does
    # by default), a pool closed from the ring differed by an ulp from the
    # same pool built by compress. Contraction is explicit in the kernels
    # (fmaf) and off everywhere else, whatever flags the user adds.
    monkeypatch.setenv(emulate.FLAGS_VARIABLE, "-march=native -ffp-contract=fast")
    for seed in range(4):
        rng = np.random.default_rng(77 + seed)
        sequences = _sequences(rng, 5, 16, F32)
        ape = rng.standard_normal((kpool, 16)).astype(np.float32)
        run_life(emulate, sequences, ape, max_slots=8, rng=rng)
        _assert_same_as_one_call(emulate, sequences, ape)
