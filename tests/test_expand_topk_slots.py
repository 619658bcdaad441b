"""Expand top-k into physical cache slots through a block table, and compacted rows with counts.

After top-k, a paged-attention engine needs each selected position as a
slot of its KV cache: page ``block_table[b, p // block_size]``, entry
``p % block_size``; some engines also pack each row's valid entries to the
left and keep a count per query. The model below is written plainly, one
token and one column at a time, independent of both backends.
"""

from __future__ import annotations

import numpy as np
import pytest

from kpool_cupy import emulate, reference

BACKENDS = [emulate, reference]
IDS = ["emulate", "reference"]


def _model(ids, offsets, cache, kpool, tail, table, size, compact):
    tokens, topk = ids.shape
    width = topk * kpool + (kpool - 1 if tail else 0)
    rows = []
    for t in range(tokens):
        b = int(np.searchsorted(offsets, t, side="right") - 1)
        row = []
        for column in range(width):
            if column < topk * kpool:
                pool = int(ids[t, column // kpool])
                p = pool * kpool + column % kpool if pool >= 0 else -1
            else:
                visible = int(cache[b]) + t - int(offsets[b]) + 1
                i = column - topk * kpool
                p = visible - visible % kpool + i if i < visible % kpool else -1
            if table is not None and p >= 0:
                block = p // size
                entry = int(table[b, block]) if block < table.shape[1] else -1
                p = entry * size + p % size if entry >= 0 else -1
            row.append(p)
        if compact:
            kept = [p for p in row if p >= 0]
            row = kept + [-1] * (width - len(kept))
        rows.append(row)
    return np.array(rows, np.int32).reshape(tokens, width)


def _case(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 5, size=3)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    cache = rng.integers(0, 40, size=3).astype(np.int32)
    ids = rng.integers(-1, 12, size=(int(offsets[-1]), 3)).astype(np.int32)
    table = rng.integers(-1, 50, size=(3, 16)).astype(np.int32)  # -1: a page not mapped
    return ids, offsets, cache, table


@pytest.mark.parametrize("module", BACKENDS, ids=IDS)
@pytest.mark.parametrize("tail", [False, True], ids=["no-tail", "tail"])
@pytest.mark.parametrize("paged", [False, True], ids=["positions", "slots"])
@pytest.mark.parametrize("compact", [False, True], ids=["dense", "compact"])
def test_expand_matches_the_plain_model(module, tail, paged, compact):
    for seed in range(6):
        ids, offsets, cache, table = _case(seed)
        kwargs = dict(kpool=4, always_select_tail=tail, compact=compact)
        if paged:
            kwargs |= dict(block_table=table, block_size=4)
        got = module.kpool_expand_topk(ids, offsets, cache, **kwargs)
        want = _model(ids, offsets, cache, 4, tail, table if paged else None, 4, compact)
        positions, counts = got if compact else (got, None)
        np.testing.assert_array_equal(positions, want, err_msg=f"seed {seed}")
        if compact:
            np.testing.assert_array_equal(counts, (want >= 0).sum(axis=1))


@pytest.mark.parametrize("module", BACKENDS, ids=IDS)
def test_a_block_past_the_table_is_an_error_when_validated_and_minus_one_when_not(module):
    ids = np.array([[4]], np.int32)  # positions 16..19 with kpool 4: block 4 of block_size 4
    args = (ids, np.array([0, 1], np.int32), np.array([0], np.int32))
    table = np.arange(4, dtype=np.int32)[None]  # four pages: blocks 0..3
    with pytest.raises(ValueError, match="Invalid block_table: expected a block for every selected position"):
        module.kpool_expand_topk(*args, kpool=4, block_table=table, block_size=4)
    got = module.kpool_expand_topk(*args, kpool=4, block_table=table, block_size=4, validate=False)
    assert (got == -1).all()


@pytest.mark.parametrize("module", BACKENDS, ids=IDS)
@pytest.mark.parametrize("big", [2**40, 2**61, 2**62, 2**63 - 1], ids=["2^40", "2^61", "2^62", "2^63-1"])
def test_an_id_whose_positions_pass_int32_is_minus_one_validated_or_not(module, big):
    # As the docstring says (-1 in all its columns, like a -1 id), with validate=True too: the table check skips
    # it as the kernel does. A hostile round found the check multiplying such ids by kpool in int64, so 2^40 was
    # refused and 2^61, 2^62 (whose products wrapped) accepted.
    ids = np.array([[1], [big]], np.int64)
    args = (ids, np.array([0, 2], np.int64), np.array([5], np.int64))
    table = np.array([[0, 1, 2, 3]], np.int32)
    got = module.kpool_expand_topk(*args, kpool=4, block_table=table, block_size=4)
    np.testing.assert_array_equal(got, [[4, 5, 6, 7], [-1, -1, -1, -1]])


@pytest.mark.parametrize("module", BACKENDS, ids=IDS)
@pytest.mark.parametrize("cached", [2**31 - 3, 2**31 + 1], ids=["tail-to-int32", "tail-past-int32"])
def test_tail_positions_past_int32_are_minus_one_validated_or_not(module, cached):
    # The review of the id fix: the table check still asked a block for tail positions past int32, which the
    # kernel writes as -1 (2^31 + 1 cached: the tail is 2^31 only). A 2048-column table of 2^20-slot blocks
    # covers every position up to 2^31 - 1.
    args = (np.array([[-1]], np.int32), np.array([0, 1], np.int32), np.array([cached], np.int64))
    options = dict(kpool=4, always_select_tail=True, block_table=np.zeros((1, 2048), np.int32), block_size=2**20)
    want = module.kpool_expand_topk(*args, **options, validate=False)
    np.testing.assert_array_equal(module.kpool_expand_topk(*args, **options), want)
    assert (want[0, 4:] >= 0).sum() == (2 if cached < 2**31 else 0)


@pytest.mark.parametrize("module", BACKENDS, ids=IDS)
def test_slots_near_the_int32_limit_are_minus_one_not_wrapped(module):
    table = np.array([[2**31 // 8]], np.int32)  # page * 8 is 2^31: past int32
    got = module.kpool_expand_topk(
        np.array([[0]], np.int32), np.array([0, 1], np.int32), np.array([0], np.int32), kpool=4,
        block_table=table, block_size=8,
    )  # fmt: skip
    assert (got == -1).all()


def test_garbage_with_a_block_table_lands_the_same_on_both_backends():
    # validate=False: unsorted, negative and overshooting offsets, cache
    # lengths near 2^62, table entries from -2^31 to 2^31 - 1. The NumPy
    # kernel must write what the emulated kernel writes, element for element.
    rng = np.random.default_rng(11)
    for case in range(60):
        tokens, batch = int(rng.integers(0, 7)), int(rng.integers(1, 4))
        offsets = rng.integers(-3, 9, size=batch + 1).astype(np.int64)
        cache = rng.choice([0, 5, 2**62 - 1, -4], size=batch).astype(np.int64)
        ids = rng.integers(-2, 2**29, size=(tokens, 2)).astype(np.int64)
        table = rng.integers(-(2**31), 2**31, size=(batch, int(rng.integers(1, 5))), dtype=np.int64).astype(np.int32)
        kwargs = dict(kpool=3, always_select_tail=bool(case % 2), compact=bool(case % 3 == 0), validate=False)
        kwargs |= dict(block_table=table, block_size=int(rng.integers(1, 9)))
        got = emulate.kpool_expand_topk(ids, offsets, cache, **kwargs)
        want = reference.kpool_expand_topk(ids, offsets, cache, **kwargs)
        got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"case {case}")


@pytest.mark.parametrize("module", BACKENDS, ids=IDS)
def test_a_tail_that_a_complete_pool_covers_needs_no_block(module):
    # Cache 3 and one token: 4 visible positions, one complete pool, so the
    # tail columns are all -1 and need no page; one page of 2 slots serves.
    args = (np.array([[-1]], np.int32), np.array([0, 1], np.int32), np.array([3], np.int32))
    table = np.array([[5]], np.int32)
    got = module.kpool_expand_topk(*args, kpool=4, always_select_tail=True, block_table=table, block_size=2)
    assert (got == -1).all()
    # Cache 4: visible 5, the tail holds position 4, in block 2: past the table.
    args = (args[0], args[1], np.array([4], np.int32))
    with pytest.raises(ValueError, match="Invalid block_table"):
        module.kpool_expand_topk(*args, kpool=4, always_select_tail=True, block_table=table, block_size=2)


@pytest.mark.parametrize("module", BACKENDS, ids=IDS)
def test_a_column_sliced_block_table_is_taken_as_the_fp8_ops_take_it(module):
    # One block-table rule for expand and the FP8 cache writers: the last dim
    # contiguous, rows at any stride. A column slice of an engine's wider
    # table was refused here though the FP8 ops took it.
    for seed in range(4):
        ids, offsets, cache, table = _case(seed)
        wide = np.full((3, 40), -7, np.int32)
        wide[:, 5:21] = table
        sliced = wide[:, 5:21]
        got = module.kpool_expand_topk(ids, offsets, cache, kpool=4, block_table=sliced, block_size=4, validate=False)
        np.testing.assert_array_equal(got, _model(ids, offsets, cache, 4, False, table, 4, False), err_msg=str(seed))
    with pytest.raises(ValueError, match="Invalid block_table: expected a contiguous last dim"):
        module.kpool_expand_topk(ids, offsets, cache, kpool=4, block_table=wide[:, ::2], block_size=4)
