"""Checks shared by the ring ops (ring close, seed tail, tail update): the ring, the slots, ``closed``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import INT32, MAX_KPOOL, dtype_name
from .checks import check_contiguous, check_index, check_writable, dtype_fail, fail, require_array


def check_tail(tail: Any, dtype: np.dtype, kpool: int | None, head_dim: int, *, writes: bool) -> tuple[int, int]:
    """The ring ``[max_slots, 2, kpool, head_dim]`` in the dtype of k, C-contiguous; returns (max_slots, kpool)."""
    require_array("tail", tail)
    if np.dtype(tail.dtype) != dtype:
        raise dtype_fail(
            "tail", f"dtype {dtype_name(dtype)} like k (the ring stores raw values)", dtype_name(tail.dtype)
        )
    kpool_text = "kpool" if kpool is None else str(kpool)
    expected = f"shape [max_slots, 2, {kpool_text}, {head_dim}]"
    if tail.ndim != 4 or tail.shape[1] != 2 or tail.shape[3] != head_dim or not 1 <= tail.shape[2] <= MAX_KPOOL:
        raise fail("tail", expected, f"shape {tuple(tail.shape)}")
    if kpool is not None and tail.shape[2] != kpool:
        raise fail("tail", expected + " (kpool from ape)", f"shape {tuple(tail.shape)}")
    check_contiguous("tail", tail)
    if writes:
        check_writable("tail", tail)
    return int(tail.shape[0]), int(tail.shape[2])


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
