"""Validation of the ring and expand functions, built from the same checks as kpool_compress's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._dtypes import ELEMENT_CTYPES, FLOAT32, dtype_name
from ._validate import (
    MAX_HEAD_DIM,
    check_ape,
    check_batch_index,
    check_index,
    check_keys,
    check_out,
    dtype_fail,
    fail,
    require_array,
)

INT32 = np.dtype(np.int32)
SLOT_DTYPES = (np.dtype(np.int32), np.dtype(np.uint32))
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class RingCall:
    """What the validator learned about a ring call."""

    head_dim: int
    kpool: int
    requests: int
    max_slots: int
    dtype: np.dtype
    out_dtype: np.dtype
    total_tokens: int = 0  # token-row calls (ring close, seed tail)
    next_n: int = 0  # tail update
    pools_per_request: int = 0  # tail update


def _contiguous(name: str, array: Any) -> None:
    if array.size == 0:
        return
    expected = array.dtype.itemsize
    for size, stride in zip(reversed(array.shape), reversed(array.strides), strict=True):
        if size > 1 and stride != expected:
            raise fail(name, "a C-contiguous array", f"strides {tuple(array.strides)}")
        expected *= size


def _writable(name: str, array: Any) -> None:
    flags = getattr(array, "flags", None)
    if flags is not None and not getattr(flags, "writeable", True):
        raise fail(name, "a writable array", "a read-only one")


def check_tail(tail: Any, dtype: np.dtype, kpool: int | None, head_dim: int, *, writes: bool) -> tuple[int, int]:
    """The ring ``[max_slots, 2, kpool, head_dim]`` in the dtype of k, C-contiguous; returns (max_slots, kpool)."""
    require_array("tail", tail)
    if np.dtype(tail.dtype) != dtype:
        raise dtype_fail(
            "tail", f"dtype {dtype_name(dtype)} like k (the ring stores raw values)", dtype_name(tail.dtype)
        )
    kpool_text = "kpool" if kpool is None else str(kpool)
    expected = f"shape [max_slots, 2, {kpool_text}, {head_dim}]"
    if tail.ndim != 4 or tail.shape[1] != 2 or tail.shape[3] != head_dim or tail.shape[2] < 1:
        raise fail("tail", expected, f"shape {tuple(tail.shape)}")
    if kpool is not None and tail.shape[2] != kpool:
        raise fail("tail", expected + " (kpool from ape)", f"shape {tuple(tail.shape)}")
    _contiguous("tail", tail)
    if writes:
        _writable("tail", tail)
    return int(tail.shape[0]), int(tail.shape[2])


def _check_slots(slot_idx: Any, requests: int) -> None:
    require_array("slot_idx", slot_idx)
    if slot_idx.dtype not in SLOT_DTYPES:
        raise dtype_fail("slot_idx", "dtype int32 or uint32", slot_idx.dtype)
    check_index("slot_idx", slot_idx, requests)


def _check_closed(closed: Any, shape: tuple[int, ...], exact: bool) -> None:
    require_array("closed", closed)
    if closed.dtype != INT32:
        raise dtype_fail("closed", "dtype int32", closed.dtype)
    ok = tuple(closed.shape) == shape if exact else closed.ndim == 1 and closed.shape[0] >= shape[0]
    if not ok:
        raise fail(
            "closed", f"shape {list(shape)}" if exact else f"shape [>= {shape[0]}]", f"shape {tuple(closed.shape)}"
        )
    _contiguous("closed", closed)
    _writable("closed", closed)


def check_ring_close_args(
    tail: Any, k: Any, gate: Any, ape: Any, input_row_offsets: Any, cache_lengths: Any, slot_idx: Any, out: Any,
    closed: Any,
) -> RingCall:  # fmt: skip
    head_dim = check_keys(k, gate, same_dtype=True)
    kpool = check_ape(ape, head_dim)
    batch = check_batch_index(input_row_offsets, cache_lengths)
    max_slots, _ = check_tail(tail, np.dtype(k.dtype), kpool, head_dim, writes=False)
    _check_slots(slot_idx, batch)
    out_dtype = check_out(out, np.dtype(k.dtype), head_dim, ">= batch")
    if out is not None and out.shape[0] < batch:
        raise fail("out", f"at least {batch} rows (one per request)", f"{out.shape[0]} rows")
    if closed is not None:
        _check_closed(closed, (batch,), exact=False)
    return RingCall(head_dim, kpool, batch, max_slots, np.dtype(k.dtype), out_dtype, total_tokens=int(k.shape[0]))


def check_seed_tail_args(
    tail: Any, k: Any, gate: Any, input_row_offsets: Any, cache_lengths: Any, slot_idx: Any
) -> RingCall:
    head_dim = check_keys(k, gate, same_dtype=True)
    batch = check_batch_index(input_row_offsets, cache_lengths)
    max_slots, kpool = check_tail(tail, np.dtype(k.dtype), None, head_dim, writes=True)
    _check_slots(slot_idx, batch)
    return RingCall(
        head_dim, kpool, batch, max_slots, np.dtype(k.dtype), np.dtype(k.dtype), total_tokens=int(k.shape[0])
    )


def _check_step_tokens(name: str, array: Any, dtypes: tuple[np.dtype, ...]) -> None:
    """``[requests, next_n, head_dim]``, last dim contiguous, the other strides whole elements."""
    require_array(name, array)
    if array.dtype not in dtypes:
        raise dtype_fail(name, "dtype " + " or ".join(dtype_name(d) for d in dtypes), dtype_name(array.dtype))
    if array.ndim != 3:
        raise fail(name, "a 3-D array [requests, next_n, head_dim]", f"shape {tuple(array.shape)}")
    if array.size and array.shape[2] > 1 and array.strides[2] != array.dtype.itemsize:
        raise fail(
            name, f"a contiguous last dim (stride {array.dtype.itemsize} bytes)", f"stride {array.strides[2]} bytes"
        )
    if array.size and any(s % array.dtype.itemsize for s in array.strides[:2]):
        raise fail(name, f"strides that are multiples of {array.dtype.itemsize} bytes", f"strides {array.strides}")


def check_tail_update_args(
    tail: Any, k: Any, gate: Any, ape: Any, positions: Any, slot_idx: Any, out: Any, closed: Any
) -> RingCall:
    _check_step_tokens("k", k, tuple(ELEMENT_CTYPES))
    requests, next_n, head_dim = (int(d) for d in k.shape)
    if head_dim <= 0 or head_dim % 8 != 0 or head_dim > MAX_HEAD_DIM:
        raise fail("k", f"head_dim (k.shape[2]) a positive multiple of 8 up to {MAX_HEAD_DIM}", head_dim)
    _check_step_tokens("gate", gate, (np.dtype(k.dtype),))
    if tuple(gate.shape) != tuple(k.shape):
        raise fail("gate", f"shape {tuple(k.shape)} like k", f"shape {tuple(gate.shape)}")
    kpool = check_ape(ape, head_dim)
    max_slots, _ = check_tail(tail, np.dtype(k.dtype), kpool, head_dim, writes=True)
    require_array("positions", positions)
    if positions.dtype != INT32:
        raise dtype_fail("positions", "dtype int32", positions.dtype)
    if tuple(positions.shape) != (requests, next_n):
        raise fail(
            "positions", f"shape [{requests}, {next_n}] like k's first two dims", f"shape {tuple(positions.shape)}"
        )
    _contiguous("positions", positions)
    _check_slots(slot_idx, requests)
    pools = -(-next_n // kpool)
    out_dtype = np.dtype(k.dtype)
    if out is not None:
        allowed = (out_dtype,) if out_dtype == FLOAT32 else (out_dtype, FLOAT32)
        require_array("out", out)
        if out.dtype not in allowed:
            raise dtype_fail("out", "dtype " + " or ".join(dtype_name(d) for d in allowed), dtype_name(out.dtype))
        if tuple(out.shape) != (requests, pools, head_dim):
            raise fail("out", f"shape [{requests}, {pools}, {head_dim}]", f"shape {tuple(out.shape)}")
        _contiguous("out", out)
        _writable("out", out)
        out_dtype = np.dtype(out.dtype)
    if closed is not None:
        _check_closed(closed, (requests, pools), exact=True)
    return RingCall(
        head_dim, kpool, requests, max_slots, np.dtype(k.dtype), out_dtype, next_n=next_n, pools_per_request=pools
    )


def check_expand_args(pool_ids: Any, input_row_offsets: Any, cache_lengths: Any, kpool: Any) -> tuple[int, int]:
    """Returns (batch, pool_topk)."""
    from ._pools import check_kpool

    check_kpool(kpool)
    require_array("pool_ids", pool_ids)
    if pool_ids.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise dtype_fail("pool_ids", "dtype int32 or int64", pool_ids.dtype)
    if pool_ids.ndim != 2:
        raise fail("pool_ids", "a 2-D array [total_tokens, pool_topk]", f"shape {tuple(pool_ids.shape)}")
    _contiguous("pool_ids", pool_ids)
    batch = check_batch_index(input_row_offsets, cache_lengths)
    return batch, int(pool_ids.shape[1])


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


def check_closed_pool_ids(cache_lengths: np.ndarray, kpool: int) -> None:
    """Pool ids go out as int32: the pending pool c // kpool must fit."""
    too_big = cache_lengths.astype(np.int64) // kpool > INT32_MAX
    if too_big.any():
        b = int(np.argmax(too_big))
        raise fail(
            "cache_lengths",
            f"pool ids c // kpool <= {INT32_MAX} (closed is int32)",
            f"{int(cache_lengths[b])} at index {b}",
        )


def check_position_values(positions: np.ndarray, kpool: int, pools_per_request: int) -> None:
    """Positions >= 0 or -1, closing at most the pools the output has room for (a close past them would be
    lost while the ring moves on)."""
    bad = positions < -1
    if bad.any():
        r, t = (int(i) for i in np.argwhere(bad)[0])
        raise fail("positions", "positions >= 0, or -1 for padding", f"{int(positions[r, t])} at [{r}, {t}]")
    closes = ((positions >= 0) & (positions % kpool == kpool - 1)).sum(axis=1)
    if (closes > pools_per_request).any():
        r = int(np.argmax(closes > pools_per_request))
        raise fail(
            "positions",
            f"at most {pools_per_request} pool closings per request (ceil(next_n / kpool))",
            f"{int(closes[r])} in request {r}: {positions[r].tolist()}",
        )
