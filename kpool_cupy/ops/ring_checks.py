"""Checks shared by the ring ops (ring close, seed tail, tail update): the ring, the slots, ``closed``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import INT32, dtype_name
from .checks import check_contiguous, check_index, check_writable, dtype_fail, fail, require_array

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
                name, "elements that do not overlap (each stride clears the smaller dims)", f"strides {array.strides}"
            )
        span += stride * (size - 1)


def check_tail(tail: Any, dtype: np.dtype, kpool: int | None, head_dim: int, *, writes: bool) -> tuple[int, int, int]:
    """The ring ``[max_slots, 2, ring, head_dim]`` in the dtype of k, ``kpool <= ring <= MAX_RING`` rows.

    Any slot, half and row strides (whole elements), the last dim contiguous:
    a view into a padded cache works as it is. Returns (max_slots, ring rows,
    kpool); kpool None means the ring's rows.
    """
    require_array("tail", tail)
    if np.dtype(tail.dtype) != dtype:
        raise dtype_fail(
            "tail", f"dtype {dtype_name(dtype)} like k (the ring stores raw values)", dtype_name(tail.dtype)
        )
    expected = f"shape [max_slots, 2, ring, {head_dim}]"
    if tail.ndim != 4 or tail.shape[1] != 2 or tail.shape[3] != head_dim or not 1 <= tail.shape[2] <= MAX_RING:
        raise fail("tail", expected + f", 1 <= ring <= {MAX_RING}", f"shape {tuple(tail.shape)}")
    rows = int(tail.shape[2])
    if kpool is not None and rows < kpool:
        raise fail("tail", f"at least kpool = {kpool} ring rows (tail.shape[2])", f"{rows} rows")
    itemsize = tail.dtype.itemsize
    if tail.size and head_dim > 1 and tail.strides[3] != itemsize:
        raise fail("tail", f"a contiguous last dim (stride {itemsize} bytes)", f"stride {tail.strides[3]} bytes")
    if tail.size and any(s % itemsize for s in tail.strides):
        raise fail("tail", f"strides that are multiples of {itemsize} bytes", f"strides {tail.strides}")
    # The decode kernel addresses rows within a slot with 32-bit offsets,
    # the ring's whole length (rows * row stride, its wrap) among them.
    half, row = abs(tail.strides[1]) // itemsize, abs(tail.strides[2]) // itemsize
    span = rows * row + half + head_dim
    if tail.size and span >= 2**31:
        raise fail(
            "tail", "a slot spanning fewer than 2^31 elements (rows x row stride, halves, head_dim)", f"{span} elements"
        )
    if writes:
        check_writable("tail", tail)
        check_no_internal_overlap("tail", tail)
    return int(tail.shape[0]), rows, rows if kpool is None else kpool


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
    would race. Requests that write nothing (all padding, no trailing tokens) may share one, as padded
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
