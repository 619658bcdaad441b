"""Checks shared by the ring ops (ring close, seed tail, tail update): the ring, the slots, ``closed``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...dtypes import INT32, dtype_name
from ..framework.checks import as_size, check_contiguous, check_index, check_writable, dtype_fail, fail, require_array
from ..framework.spec import is_pair, pair_error

# The most rows a ring may have: far above kpool + next_n - 1 for any real
# speculative decoder, and small enough that row arithmetic stays far from
# 64-bit limits.
MAX_RING = 1 << 16


def check_no_internal_overlap(name: str, array: Any) -> None:
    """Distinct elements at distinct bytes, so a write to one cannot land in another.

    Sorted by |stride|, each dimension's stride must clear everything the
    smaller ones span: a sufficient rule that every layout a ring or a cache
    view really has (C order, padded rows, padded slots, transposed halves)
    passes.
    """
    if array.size == 0:  # nothing is written, and NumPy may report any strides
        return
    span = array.dtype.itemsize
    for stride, size in sorted((abs(s), n) for n, s in zip(array.shape, array.strides, strict=True) if n > 1):
        if stride < span:
            raise fail(
                name,
                "elements that do not overlap (each stride clears the smaller dims)",
                f"byte strides {array.strides}",
            )
        span += stride * (size - 1)


def _check_layout(name: str, array: Any, rows: int, span: int) -> None:
    """Last dim contiguous, strides in whole elements, a slot spanning fewer than 2^31 elements."""
    itemsize = array.dtype.itemsize
    if array.size and array.shape[-1] > 1 and array.strides[-1] != itemsize:
        raise fail(name, f"a contiguous last dim (stride {itemsize} bytes)", f"stride {array.strides[-1]} bytes")
    if array.size and any(s % itemsize for s in array.strides):
        raise fail(name, f"strides that are multiples of {itemsize} bytes", f"byte strides {array.strides}")
    # The decode kernel addresses rows within a slot with 32-bit offsets,
    # the ring's whole length (rows * row stride, its wrap) among them.
    if array.size and span >= 2**31:
        raise fail(
            name, "a slot spanning fewer than 2^31 elements (rows x row stride, halves, head_dim)", f"{span} elements"
        )


def _check_ring_array(name: str, array: Any, dtype: np.dtype, what: str, head_dim: int, *, writes: bool) -> int:
    """One array of a split ring, ``[max_slots, ring, head_dim]`` in ``dtype``; returns its ring rows."""
    require_array(name, array)
    if np.dtype(array.dtype) != dtype:
        raise dtype_fail(name, f"dtype {dtype_name(dtype)} like {what}", dtype_name(array.dtype))
    if array.ndim != 3 or array.shape[2] != head_dim or not 1 <= array.shape[1] <= MAX_RING:
        raise fail(name, f"shape [max_slots, ring, {head_dim}], 1 <= ring <= {MAX_RING}", f"shape {tuple(array.shape)}")
    rows = as_size(array.shape[1])
    _check_layout(name, array, rows, rows * abs(array.strides[1]) // array.dtype.itemsize + head_dim)
    if writes:
        check_writable(name, array)
        check_no_internal_overlap(name, array)
    return rows


def check_tail(
    tail: Any, dtype: np.dtype, gate_dtype: np.dtype, kpool: int | None, head_dim: int, *, writes: bool
) -> tuple[int, int, int]:
    """The ring: one array ``[max_slots, 2, ring, head_dim]`` in k's dtype (gate's must be the same), or a
    pair ``(key_ring, gate_ring)`` of ``[max_slots, ring, head_dim]`` in k's and gate's dtypes.

    ``kpool <= ring <= MAX_RING`` rows, any slot, half and row strides (whole
    elements), the last dim contiguous: a view into a padded cache works as
    it is. Returns (max_slots, ring rows, kpool); kpool None means the ring's
    rows.
    """
    if is_pair(tail):
        if len(tail) != 2:
            raise pair_error("tail", tail)
        keys, gates = tail
        rows = _check_ring_array("tail[0]", keys, dtype, "k (the key ring)", head_dim, writes=writes)
        _check_ring_array("tail[1]", gates, gate_dtype, "gate (the gate ring)", head_dim, writes=writes)
        if tuple(gates.shape) != tuple(keys.shape):
            raise fail("tail[1]", f"shape {tuple(keys.shape)} like the key ring", f"shape {tuple(gates.shape)}")
        slots = as_size(keys.shape[0])
    else:
        require_array("tail", tail)
        if np.dtype(tail.dtype) != dtype:
            raise dtype_fail(
                "tail", f"dtype {dtype_name(dtype)} like k (the ring stores raw values)", dtype_name(tail.dtype)
            )
        expected = f"shape [max_slots, 2, ring, {head_dim}], 1 <= ring <= {MAX_RING}"
        if tail.ndim != 4 or tail.shape[1] != 2 or tail.shape[3] != head_dim or not 1 <= tail.shape[2] <= MAX_RING:
            raise fail("tail", expected + " (or a pair (key_ring, gate_ring))", f"shape {tuple(tail.shape)}")
        if gate_dtype != dtype:
            raise dtype_fail(
                "gate",
                f"dtype {dtype_name(dtype)} like k (one ring array holds keys and gate scores in k's dtype; "
                "a pair tail=(key_ring, gate_ring) keeps gate scores in gate's)",
                dtype_name(gate_dtype),
            )
        rows = as_size(tail.shape[2])
        half, row = (abs(tail.strides[axis]) // tail.dtype.itemsize for axis in (1, 2))
        _check_layout("tail", tail, rows, rows * row + half + head_dim)
        if writes:
            check_writable("tail", tail)
            check_no_internal_overlap("tail", tail)
        slots = as_size(tail.shape[0])
    if kpool is not None and rows < kpool:
        raise fail("tail", f"at least kpool = {kpool} ring rows", f"{rows} rows")
    return slots, rows, rows if kpool is None else kpool


def check_slots(slot_idx: Any, requests: int) -> None:
    require_array("slot_idx", slot_idx)
    check_index("slot_idx", slot_idx, requests)


def check_closed(closed: Any, shape: tuple[int, ...], exact: bool) -> None:
    """``closed`` int32, C-contiguous and writable: exactly ``shape``, or 1-D of at least ``shape[0]``."""
    require_array("closed", closed)
    if closed.dtype != INT32:
        raise dtype_fail("closed", "dtype int32", closed.dtype)
    ok = tuple(closed.shape) == shape if exact else closed.ndim == 1 and closed.shape[0] >= shape[0]
    if not ok:
        raise fail(
            "closed", f"shape {list(shape)}" if exact else f"shape [>= {shape[0]}]", f"shape {tuple(closed.shape)}"
        )
    check_contiguous("closed", closed)
    check_writable("closed", closed)


def check_slot_values(slots: np.ndarray, max_slots: int, *, writers: np.ndarray | None = None) -> None:
    """Slots inside the ring; requests that write it (``writers``, a mask) need a slot each, or their writes
    would race. Requests that write nothing (all padding, no tokens to stash) may share one, as padded
    rows of a captured graph often do."""
    values = slots.astype(np.int64)
    bad = (values < 0) | (values >= max_slots)
    if bad.any():
        r = int(np.argmax(bad))
        raise fail("slot_idx", f"values in [0, {max_slots}) (tail.shape[0])", f"{int(values[r])} at index {r}")
    if writers is not None:
        written = values[writers]
        if np.unique(written).size != written.size:
            raise fail("slot_idx", "one slot per request that writes the ring", f"repeated slots in {written.tolist()}")
