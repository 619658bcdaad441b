"""Walks the FP8 table of docs/validation.md on both CPU backends (and the GPU path where one exists)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from model import BF16, make_batch
from validation_tables import Row, table

from kpool_cupy import emulate, reference

FUNCTIONS = {
    "compress_fp8": "kpool_compress_fp8",
    "hadamard_quant": "hadamard_quant_fp8",
    "ring_close_fp8": "kpool_ring_close_fp8",
    "tail_update_fp8": "kpool_tail_update_fp8",
}

HEAD_DIM, KPOOL = 16, 4
WIDTH = HEAD_DIM + 4  # a cache entry's bytes in its page: values, then (at the page's end) a float32 scale
NUM_BLOCKS, BLOCK_SIZE = 4, 2  # 8 slots for the good call's 4 pools


def good(function: str) -> dict:
    """A valid call of ``function``.

    compress_fp8: kpool 4, head_dim 16; 13 tokens from position 0 (pools 0,
    1, 2) and 6 from position 3 (pool 1), so 4 pools, and request 0's pool 2
    lies in its second block of 2 slots. hadamard_quant: 5 rows of 16.
    """
    if function == "hadamard_quant":
        return {"x": np.random.default_rng(0).standard_normal((5, HEAD_DIM)).astype(BF16)}
    rng = np.random.default_rng(1)
    tail = rng.standard_normal((4, 2, KPOOL, HEAD_DIM)).astype(BF16)
    if function == "ring_close_fp8":  # request 0 closes pool 0 (cached 2), request 1 pool 1 (cached 7)
        batch = make_batch([5, 6], [2, 7], head_dim=HEAD_DIM, kpool=KPOOL, seed=3)
        return dict(tail=tail, k=batch.k, gate=batch.gate, ape=batch.ape, input_row_offsets=batch.input_row_offsets,
                    cache_lengths=batch.cache_lengths, slot_idx=np.array([0, 1], np.int32))  # fmt: skip
    if function == "tail_update_fp8":  # request 0 closes pool 0 at position 3, request 1 pool 1 at 7
        step = rng.standard_normal((2, 3, HEAD_DIM)).astype(BF16)
        ape = rng.standard_normal((KPOOL, HEAD_DIM)).astype(np.float32)
        positions, slot_idx = np.array([[1, 2, 3], [5, 6, 7]], np.int32), np.array([0, 1], np.int32)
        return dict(tail=tail, k=step, gate=step.copy(), ape=ape, positions=positions, slot_idx=slot_idx)
    batch = make_batch([13, 6], [0, 3], head_dim=HEAD_DIM, kpool=KPOOL, seed=2)
    return dict(
        k=batch.k,
        gate=batch.gate,
        ape=batch.ape,
        input_row_offsets=batch.input_row_offsets,
        cache_lengths=batch.cache_lengths,
    )


def _cache():
    return np.zeros((NUM_BLOCKS, BLOCK_SIZE, WIDTH), np.uint8)


def _slots():
    return np.array([5, 0, 3, 7], np.int64)


def _table():
    # Slots 2, 3 (request 0, block 0), 6 (request 0, block 1) and 5 (request 1, block 0).
    return np.array([[1, 3], [2, 0]], np.int32)


def _to_cache(a, **changes):
    """The call writing a cache through slots (the default) or ``changes``, each None to drop it."""
    a.update(cache=_cache(), slots=_slots())
    a.update(changes)
    for name in [name for name, value in a.items() if value is None]:
        del a[name]


def _to_table(a, table):
    """The call writing a cache through ``table`` instead of slots."""
    _to_cache(a, slots=None, block_table=table)


def _with_rows(a, out=None, out_scale=None):
    a["out"] = np.zeros((4, HEAD_DIM), np.uint8) if out is None else out
    a["out_scale"] = np.zeros(4, np.float32) if out_scale is None else out_scale


def _wide(head_dim: int):
    def mutate(a):
        batch = make_batch([13, 6], [0, 3], head_dim=head_dim, kpool=KPOOL, seed=2)
        a.update(k=batch.k, gate=batch.gate, ape=batch.ape)

    return mutate


def _read_only(array):
    array.flags.writeable = False
    return array


def _float32_cache():
    # float32 elements at a byte cache's strides: only the dtype is wrong, so only the dtype check can refuse it.
    floats = np.zeros(NUM_BLOCKS * BLOCK_SIZE * WIDTH, np.float32)
    return np.lib.stride_tricks.as_strided(floats, _cache().shape, _cache().strides)


def _unaligned_cache():
    buffer = np.zeros(NUM_BLOCKS * BLOCK_SIZE * WIDTH + 4, np.uint8)
    return buffer[1 : 1 + NUM_BLOCKS * BLOCK_SIZE * WIDTH].reshape(NUM_BLOCKS, BLOCK_SIZE, WIDTH)


def _cache_over_k(a):
    # k's rows are made of the same buffer as the cache: the cache's 160 bytes are k's first 5 rows.
    buffer = np.zeros(a["k"].shape[0] * HEAD_DIM * 2, np.uint8)
    a["k"] = buffer.view(BF16).reshape(-1, HEAD_DIM)
    _to_cache(a, cache=buffer[: NUM_BLOCKS * BLOCK_SIZE * WIDTH].reshape(NUM_BLOCKS, BLOCK_SIZE, WIDTH))
    a["validate"] = False  # the overlap check reads only metadata


def _ring_wide(a):
    """head_dim 24 everywhere (k, gate, ape, the ring): fine for the plain ring ops, refused by the rotation."""
    a["tail"] = np.zeros((*a["tail"].shape[:-1], 24), BF16)
    a["ape"] = np.zeros((KPOOL, 24), np.float32)
    for name in ("k", "gate"):
        a[name] = np.zeros((*a[name].shape[:-1], 24), BF16)


def _both_requests_on_one_slot(a):
    # Both requests close pool 0 (positions 1 .. 3), their table rows on one page: one slot for two pools.
    a.update(positions=np.array([[1, 2, 3], [1, 2, 3]], np.int32), cache=_cache())
    a["block_table"] = np.array([[1, 0], [1, 0]], np.int32)


MUTATIONS = {
    "k-head-dim-not-power-of-two": _wide(24),
    "k-head-dim-above-256": _wide(512),
    "x-head-dim-not-power-of-two": lambda a: a.update(x=np.zeros((5, 24), BF16)),
    "x-dtype": lambda a: a.update(x=np.zeros((5, HEAD_DIM), np.int8)),
    "cache-dtype": lambda a: _to_cache(a, cache=_float32_cache()),
    "cache-width": lambda a: _to_cache(a, cache=_cache()[:, :, :HEAD_DIM]),
    "cache-rank": lambda a: _to_cache(a, cache=np.zeros((NUM_BLOCKS * BLOCK_SIZE, WIDTH), np.uint8)),
    "cache-entries-strided": lambda a: _to_cache(a, cache=np.zeros((NUM_BLOCKS, 4, WIDTH), np.uint8)[:, ::2]),
    "cache-page-stride": lambda a: _to_cache(
        a,
        cache=np.lib.stride_tricks.as_strided(
            np.zeros(NUM_BLOCKS * 42, np.uint8), (NUM_BLOCKS, BLOCK_SIZE, WIDTH), (42, WIDTH, 1)
        ),
    ),
    "cache-unaligned": lambda a: _to_cache(a, cache=_unaligned_cache()),
    "cache-read-only": lambda a: _to_cache(a, cache=_read_only(_cache())),
    "cache-no-destination": lambda a: _to_cache(a, slots=None),
    "cache-two-destinations": lambda a: _to_cache(a, block_table=_table()),
    "slots-without-cache": lambda a: a.update(slots=_slots()),
    "block-table-without-cache": lambda a: a.update(block_table=_table()),
    "slots-dtype": lambda a: _to_cache(a, slots=_slots().astype(np.float32)),
    "slots-strided": lambda a: _to_cache(a, slots=np.repeat(_slots(), 2)[::2]),
    "slots-short": lambda a: _to_cache(a, slots=_slots()[:3]),
    "slots-past-cache": lambda a: _to_cache(a, slots=np.array([5, 0, NUM_BLOCKS * BLOCK_SIZE, 7], np.int64)),
    "slots-repeated": lambda a: _to_cache(a, slots=np.array([5, 0, 5, 7], np.int64)),
    "block-table-dtype": lambda a: _to_table(a, _table().astype(np.int64)),
    "block-table-rows": lambda a: _to_table(a, np.concatenate([_table(), [[0, 0]]]).astype(np.int32)),
    "block-table-last-dim": lambda a: _to_table(a, np.repeat(_table(), 2, axis=1)[:, ::2]),
    "block-table-past-columns": lambda a: _to_table(a, np.ascontiguousarray(_table()[:, :1])),
    "block-table-past-cache": lambda a: _to_table(a, np.array([[1, NUM_BLOCKS], [2, 0]], np.int32)),
    "fp8-out-without-scale": lambda a: a.update(out=np.zeros((4, HEAD_DIM), np.uint8)),
    "fp8-out-dtype": lambda a: _with_rows(a, out=np.zeros((4, HEAD_DIM), np.float16)),
    "fp8-out-rows": lambda a: _with_rows(a, out=np.zeros((3, HEAD_DIM), np.uint8), out_scale=np.zeros(3, np.float32)),
    "fp8-out-read-only": lambda a: _with_rows(a, out=_read_only(np.zeros((4, HEAD_DIM), np.uint8))),
    "fp8-out-scale-length": lambda a: _with_rows(a, out_scale=np.zeros(3, np.float32)),
    "fp8-out-scale-dtype": lambda a: _with_rows(a, out_scale=np.zeros(4, np.float64)),
    "fp8-out-with-cache": lambda a: _to_cache(a, out=np.zeros((4, HEAD_DIM), np.uint8)),
    "cache-shares-k": _cache_over_k,
    "hadamard-out-shape": lambda a: _with_rows(  # rows far enough apart that only the width is wrong
        a, out=np.zeros((5, HEAD_DIM), np.uint8)[:, : HEAD_DIM // 2], out_scale=np.zeros(5, np.float32)
    ),
    "hadamard-out-rows": lambda a: _with_rows(a),
    "hadamard-scale-without-out": lambda a: a.update(out_scale=np.zeros(5, np.float32)),
    "ring-close-head-dim": _ring_wide,
    "ring-close-slots-length": lambda a: _to_cache(a, slots=np.array([5, 0, 3], np.int64)),
    "ring-close-slots-repeated": lambda a: _to_cache(a, slots=np.array([3, 3], np.int64)),
    "ring-close-table-past-cache": lambda a: _to_table(a, np.array([[NUM_BLOCKS, 0], [2, 0]], np.int32)),
    "ring-close-out-rows": lambda a: _with_rows(
        a, out=np.zeros((1, HEAD_DIM), np.uint8), out_scale=np.zeros(1, np.float32)
    ),
    "ring-close-closed-short": lambda a: a.update(closed=np.zeros(1, np.int32)),
    "tail-update-head-dim": _ring_wide,
    "tail-update-cache-without-table": lambda a: a.update(cache=_cache()),
    "tail-update-out-shape": lambda a: _with_rows(
        a, out=np.zeros((2, 2, HEAD_DIM), np.uint8), out_scale=np.zeros((2, 2), np.float32)
    ),
    "tail-update-out-scale-shape": lambda a: _with_rows(
        a, out=np.zeros((2, 1, HEAD_DIM), np.uint8), out_scale=np.zeros(2, np.float32)
    ),
    "tail-update-out-noncontiguous": lambda a: _with_rows(
        a, out=np.zeros((2, 2, HEAD_DIM), np.uint8)[:, ::2], out_scale=np.zeros((2, 1), np.float32)
    ),
    "tail-update-table-rows": lambda a: a.update(cache=_cache(), block_table=np.zeros((3, 2), np.int32)),
    "tail-update-table-repeated": _both_requests_on_one_slot,
    "tail-update-closed-shape": lambda a: a.update(closed=np.zeros(2, np.int32)),
}

# Rows whose bad layout cupy.asarray copies away (it makes a contiguous, aligned, writable copy sharing nothing).
HOST_ONLY = {
    "cache-entries-strided": "CuPy copies a strided host array contiguous",
    "cache-page-stride": "CuPy copies a strided host array contiguous",
    "cache-unaligned": "CuPy's copy starts aligned",
    "cache-read-only": "CuPy has no read-only arrays",
    "slots-strided": "CuPy copies a strided host array contiguous",
    "block-table-last-dim": "CuPy copies a strided host array contiguous",
    "fp8-out-read-only": "CuPy has no read-only arrays",
    "tail-update-out-noncontiguous": "CuPy copies a strided host array contiguous",
    "cache-shares-k": "copies share nothing",
}

ROWS = table("FP8 functions")


def _call(module, function: str, args: dict):
    return getattr(module, FUNCTIONS[function])(**args)


def _expect(module, function: str, args: dict, argument: str, error: type[Exception]) -> None:
    with pytest.raises(error, match=rf"^Invalid {re.escape(argument)}: expected .+, got .+"):
        _call(module, function, args)


def test_table_and_mutations_match():
    assert len(ROWS) >= 30, "the FP8 table in docs/validation.md did not parse"
    assert sorted(r.id for r in ROWS) == sorted(MUTATIONS)
    assert {r.function for r in ROWS} <= set(FUNCTIONS), {r.function for r in ROWS}
    assert set(HOST_ONLY) <= set(MUTATIONS)


def good_calls():
    """The control calls: each way an FP8 op writes, and -1 slots (skipped pools, which may repeat)."""
    rows, cache, table = good("compress_fp8"), good("compress_fp8"), good("compress_fp8")
    _with_rows(rows)
    _to_cache(cache, slots=np.array([5, -1, 3, -1], np.int64))
    _to_table(table, _table())
    query, query_rows = good("hadamard_quant"), good("hadamard_quant")
    _with_rows(query_rows, out=np.zeros((5, HEAD_DIM), np.uint8), out_scale=np.zeros(5, np.float32))
    ring_rows, ring_cache, step_cache = good("ring_close_fp8"), good("ring_close_fp8"), good("tail_update_fp8")
    _with_rows(ring_rows, out=np.zeros((2, HEAD_DIM), np.uint8), out_scale=np.zeros(2, np.float32))
    _to_cache(ring_cache, slots=np.array([5, -1], np.int64))
    _to_table(step_cache, _table())
    return [
        ("ring_close_fp8", good("ring_close_fp8")),
        ("ring_close_fp8", ring_rows),
        ("ring_close_fp8", ring_cache),
        ("tail_update_fp8", good("tail_update_fp8")),
        ("tail_update_fp8", step_cache),
        ("compress_fp8", good("compress_fp8")),
        ("compress_fp8", rows),
        ("compress_fp8", cache),
        ("compress_fp8", table),
        ("hadamard_quant", query),
        ("hadamard_quant", query_rows),
    ]


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_good_calls_pass(module):
    # The control for every row: each unmutated call (new rows, given rows, slots, a block table) is accepted.
    for function, args in good_calls():
        _call(module, function, args)


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_call_names_the_argument(module, row: Row):
    args = good(row.function)
    MUTATIONS[row.id](args)
    _expect(module, row.function, args, row.argument, row.error)


def _on_device(args: dict) -> dict:
    import cupy

    return {name: cupy.asarray(value) if isinstance(value, np.ndarray) else value for name, value in args.items()}


@pytest.mark.gpu
def test_gpu_good_calls_pass():
    import kpool_cupy

    for function, args in good_calls():
        _call(kpool_cupy, function, _on_device(args))


@pytest.mark.gpu
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_gpu_bad_call_names_the_argument(row: Row):
    import kpool_cupy

    if row.id in HOST_ONLY:
        pytest.skip(HOST_ONLY[row.id])
    args = good(row.function)
    MUTATIONS[row.id](args)
    _expect(kpool_cupy, row.function, _on_device(args), row.argument, row.error)
