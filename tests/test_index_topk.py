"""kpool_index_topk: the selection rule, against a plain model written here, on both CPU backends."""

from __future__ import annotations

import numpy as np
import pytest
from selection_model import model

from kpool_cupy import emulate, reference
from kpool_cupy.emulator.launch import recording

BACKENDS = [emulate, reference]
SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40], np.float32)


def _same(got, want):
    if isinstance(want, tuple):
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), (got, want)
    else:
        np.testing.assert_array_equal(got, want)


def _rows(rng, tokens: int, width: int, kind: str) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal((tokens, width)).astype(np.float32)
    if kind == "ties":
        return rng.integers(-2, 3, (tokens, width)).astype(np.float32)
    if kind == "special":
        return rng.choice(SPECIAL, (tokens, width))
    if kind == "ascending":  # every chunk beats the last: the buffer is cut back at every chance
        return np.tile(np.arange(width, dtype=np.float32), (tokens, 1))
    return np.zeros((tokens, width), np.float32)  # one tie across the row: the lowest ids win


def _batch(rng, counts, lengths, kpool, kind, extra_columns=0):
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    lengths = np.asarray(lengths, np.int32)
    top = max(((int(c) + n) // kpool for c, n in zip(lengths, counts, strict=True)), default=0)
    return _rows(rng, int(offsets[-1]), top + extra_columns, kind), offsets, lengths


@pytest.mark.parametrize("backend", BACKENDS, ids=["emulate", "reference"])
@pytest.mark.parametrize("kind", ["normal", "ties", "special", "ascending", "zeros"])
@pytest.mark.parametrize("pool_topk", [1, 5, 512, 1500])
def test_selection_equals_the_plain_model(backend, kind, pool_topk):
    # Three requests, rows from no visible pool to ~4,500 pools: fewer candidates than pool_topk (all taken),
    # and many more (cut back several times), with every expand mode in turn.
    rng = np.random.default_rng(pool_topk)
    kpool = 2
    logits, offsets, lengths = _batch(rng, (3, 0, 4, 2), (0, 7, 9000, 2500), kpool, kind, extra_columns=3)
    modes = [{}, {"always_select_tail": True}, {"compact": True}, {"always_select_tail": True, "compact": True}]
    for i, mode in enumerate(modes):
        if i % 2:
            mode |= {"block_table": rng.permutation(4 * 600).astype(np.int32).reshape(4, 600), "block_size": 16}
        want = model(logits, offsets, lengths, kpool=kpool, pool_topk=pool_topk, **mode)
        got = backend.kpool_index_topk(logits, offsets, lengths, kpool=kpool, pool_topk=pool_topk, **mode)
        _same(got, want)


@pytest.mark.parametrize("backend", BACKENDS, ids=["emulate", "reference"])
def test_the_order_rule_on_a_hand_made_row(backend):
    # Pools 0..6: -0.0, +0.0, NaN, -NaN, -inf, 1, 1 (kpool 1, a token that sees all 7).
    row = np.array([[-0.0, 0.0, np.nan, -np.nan, -np.inf, 1.0, 1.0]], np.float32)
    offsets, lengths = np.array([0, 1], np.int32), np.array([6], np.int32)
    picks = {
        1: [5],  # equal ones: the lower id
        3: [0, 5, 6],  # then -0.0 and +0.0 tie: the lower id
        5: [0, 1, 4, 5, 6],  # -inf above NaN
        6: [0, 1, 2, 4, 5, 6],  # NaN of either sign: by id
    }
    for pool_topk, want in picks.items():
        got = backend.kpool_index_topk(row, offsets, lengths, kpool=1, pool_topk=pool_topk)
        assert got[0, : len(want)].tolist() == want and (got[0, len(want) :] == -1).all(), (pool_topk, got)


@pytest.mark.parametrize("backend", BACKENDS, ids=["emulate", "reference"])
def test_unseen_pools_are_never_selected_and_few_candidates_are_all_taken(backend):
    # Token t of a request with 5 cached positions sees (6 + t) // 2 pools; every column past them is +inf.
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((4, 12)).astype(np.float32)
    offsets, lengths = np.array([0, 4], np.int32), np.array([5], np.int32)
    visible = (5 + np.arange(4) + 1) // 2  # 3, 3, 4, 4
    logits[np.arange(12)[None, :] >= visible[:, None]] = np.inf
    got = backend.kpool_index_topk(logits, offsets, lengths, kpool=2, pool_topk=2)
    for t in range(4):
        assert set(got[t].tolist()) - {-1} <= set(range(2 * visible[t])), got[t]
    # pool_topk at least the visible pools: every one, in order, whatever the logits (NaN here).
    logits[:] = np.nan
    got = backend.kpool_index_topk(logits, offsets, lengths, kpool=2, pool_topk=4)
    np.testing.assert_array_equal(got[0], [0, 1, 2, 3, 4, 5, -1, -1])
    # Without validation, logits narrower than the visible pools: the candidates stop at their width.
    narrow = rng.standard_normal((4, 2)).astype(np.float32)
    with pytest.raises(ValueError, match="logits"):
        backend.kpool_index_topk(narrow, offsets, lengths, kpool=2, pool_topk=1)
    got = backend.kpool_index_topk(narrow, offsets, lengths, kpool=2, pool_topk=1, validate=False)
    np.testing.assert_array_equal(got, model(narrow, offsets, lengths, kpool=2, pool_topk=1))


def test_a_long_row_is_the_same_under_the_reversed_thread_schedule(monkeypatch):
    # The buffer is shared by 256 threads between barriers; a missing barrier would read a neighbour's
    # slot before or after its write, depending on the order the threads run in. Both orders, one answer.
    rng = np.random.default_rng(5)
    logits, offsets, lengths = _batch(rng, (2, 1), (20000, 6000), 1, "ties")
    logits[1] = np.arange(logits.shape[1], dtype=np.float32)  # ascending: a cut-back at every chunk
    call = {"kpool": 1, "pool_topk": 700, "compact": True, "always_select_tail": True}
    want = model(logits, offsets, lengths, **call)
    _same(emulate.kpool_index_topk(logits, offsets, lengths, **call), want)
    monkeypatch.setenv(emulate.FLAGS_VARIABLE, "-DKP_FIBERS_REVERSED")
    _same(emulate.kpool_index_topk(logits, offsets, lengths, **call), want)


def test_aligned_rows_take_16_byte_loads_and_others_the_same_answer_without():
    rng = np.random.default_rng(6)
    wide = rng.standard_normal((3, 4104)).astype(np.float32)  # rows 16 KiB + 32 bytes apart
    offsets, lengths = np.array([0, 3], np.int32), np.array([4098], np.int32)
    accesses = {}
    for view, vector in ((wide[:, :4100], True), (wide[:, 1:], False)):
        with recording() as launches:
            got = emulate.kpool_index_topk(view, offsets, lengths, kpool=1, pool_topk=30, validate=False)
        assert launches[0].kernel_name.startswith(f"kpool_index_topk<512, {int(vector)},"), launches
        accesses[vector] = launches[0].vector_accesses
        np.testing.assert_array_equal(got, model(view, offsets, lengths, kpool=1, pool_topk=30))
    # Both write their positions 16 bytes at a time; the aligned rows' logits arrive 16 bytes at a time too.
    assert accesses[True] > accesses[False] > 0, accesses


@pytest.mark.parametrize("backend", BACKENDS, ids=["emulate", "reference"])
def test_index_dtypes_and_an_empty_batch(backend):
    rng = np.random.default_rng(7)
    logits, offsets, lengths = _batch(rng, (2, 3), (40, 9), 4, "normal")
    want = model(logits, offsets, lengths, kpool=4, pool_topk=3)
    for dtype in (np.uint32, np.int64):
        got = backend.kpool_index_topk(logits, offsets.astype(dtype), lengths.astype(dtype), kpool=4, pool_topk=3)
        np.testing.assert_array_equal(got, want)
    empty = backend.kpool_index_topk(np.zeros((0, 5), np.float32), np.array([0], np.int32), np.zeros(0, np.int32),
                                     kpool=4, pool_topk=3, compact=True)  # fmt: skip
    assert empty[0].shape == (0, 12) and empty[1].shape == (0,)
