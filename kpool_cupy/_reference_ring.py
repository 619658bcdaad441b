"""The NumPy reference of ring close, seed tail, tail update and expand top-k.

Vectorized over requests and tokens; the only loops run over ring positions
(fewer than kpool) and over a decode step's next_n tokens, which must be
walked in order. Pools are reduced by ``reference.pool_members``, the function
the reference's kpool_compress uses, so the reference agrees with itself bit
for bit across the lifecycle. The same bounds checks as the kernels make
garbage inputs with ``validate=False`` touch nothing outside the arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import HostArrays
from ._ring_driver import run_expand_topk, run_ring_close, run_seed_tail, run_tail_update
from ._validate import check_host_arrays
from ._validate_ring import INT32_MAX, RingCall

_ACCUMULATE = np.float32  # the kernels' arithmetic


def _pool(keys: np.ndarray, gates: np.ndarray, ape: np.ndarray) -> np.ndarray:
    from .reference import pool_members

    return pool_members(keys, gates, ape, _ACCUMULATE)


def _requests(call: RingCall, input_row_offsets, cache_lengths, slot_idx):
    """Per request: row range, cached length, slot, and whether all of them are usable."""
    offsets = np.asarray(input_row_offsets).astype(np.int64)
    cached = np.asarray(cache_lengths).astype(np.int64)
    slots = np.asarray(slot_idx).astype(np.int64)
    begin, end = offsets[:-1], offsets[1:]
    usable = (begin >= 0) & (end <= call.total_tokens) & (begin <= end) & (cached >= 0)
    usable &= (slots >= 0) & (slots < call.max_slots)
    return begin, end, cached, slots, usable


class _ReferenceRing(HostArrays):
    def ring_close(self, call: RingCall, arrays: tuple[Any, ...], out: np.ndarray, closed: np.ndarray) -> None:
        tail, k, gate, ape, input_row_offsets, cache_lengths, slot_idx = arrays
        begin, end, cached, slots, usable = _requests(call, input_row_offsets, cache_lengths, slot_idx)
        kpool = call.kpool
        phase = np.where(usable, cached, 0) % kpool
        closes = usable & (phase != 0) & (end - begin >= kpool - phase) & (cached // kpool <= INT32_MAX)
        closed[: call.requests] = np.where(closes, cached // kpool, -1)
        chosen = np.flatnonzero(closes)
        members = np.arange(kpool)
        from_ring = members[None] < phase[chosen][:, None]  # [closing, kpool]
        rows = np.where(from_ring, 0, begin[chosen][:, None] + members - phase[chosen][:, None])
        keys = np.where(from_ring[..., None], tail[slots[chosen], 0], k[rows])
        gates = np.where(from_ring[..., None], tail[slots[chosen], 1], gate[rows])
        with np.errstate(over="ignore"):
            out[chosen] = _pool(keys, gates, ape).astype(out.dtype)

    def seed_tail(self, call: RingCall, arrays: tuple[Any, ...]) -> None:
        tail, k, gate, input_row_offsets, cache_lengths, slot_idx = arrays
        begin, end, cached, slots, usable = _requests(call, input_row_offsets, cache_lengths, slot_idx)
        usable &= cached <= np.iinfo(np.int64).max - (end - begin)  # c + n must not wrap
        last = cached + np.where(usable, end - begin, 0)
        start = np.maximum(last // call.kpool * call.kpool, cached)
        for step in range(call.kpool - 1):  # at most kpool - 1 trailing tokens per request
            position = start + step
            active = np.flatnonzero(usable & (position < last))
            rows = begin[active] + position[active] - cached[active]
            ring = position[active] % call.kpool
            tail[slots[active], 0, ring] = k[rows]
            tail[slots[active], 1, ring] = gate[rows]

    def tail_update(self, call: RingCall, arrays: tuple[Any, ...], out: np.ndarray, closed: np.ndarray) -> None:
        tail, k, gate, ape, positions, slot_idx = arrays
        slots = np.asarray(slot_idx).astype(np.int64)
        slot_ok = (slots >= 0) & (slots < call.max_slots)
        written = np.zeros(call.requests, dtype=np.int64)
        closed[...] = -1
        for t in range(call.next_n):  # a step's tokens, in order
            position = positions[:, t].astype(np.int64)
            real = np.flatnonzero(slot_ok & (position >= 0))  # padding touches nothing
            ring = position[real] % call.kpool
            tail[slots[real], 0, ring] = k[real, t]
            tail[slots[real], 1, ring] = gate[real, t]
            closing = real[(ring == call.kpool - 1) & (written[real] < call.pools_per_request)]
            if closing.size:
                pooled = _pool(tail[slots[closing], 0], tail[slots[closing], 1], ape)
                with np.errstate(over="ignore"):
                    out[closing, written[closing]] = pooled.astype(out.dtype)
                closed[closing, written[closing]] = position[closing] // call.kpool
                written[closing] += 1

    def expand_topk(
        self, pool_topk: int, kpool: int, arrays: tuple[Any, ...], batch: int, positions: np.ndarray
    ) -> None:
        pool_ids, input_row_offsets, cache_lengths = arrays
        tokens = positions.shape[0]
        ids = pool_ids.astype(np.int64)
        fits = (ids >= 0) & (ids <= (INT32_MAX - (kpool - 1)) // kpool)  # the last position included
        first = np.where(fits, ids * kpool, -1)[..., None]
        expanded = np.where(first >= 0, first + np.arange(kpool), -1).reshape(tokens, pool_topk * kpool)
        positions[:, : pool_topk * kpool] = expanded
        extra = positions.shape[1] - pool_topk * kpool
        if extra == 0:
            return
        if batch == 0:
            positions[:, pool_topk * kpool :] = -1
            return
        offsets = np.asarray(input_row_offsets).astype(np.int64)
        cached = np.asarray(cache_lengths).astype(np.int64)
        token = np.arange(tokens)
        request = np.clip(np.searchsorted(offsets[:batch], token, side="right") - 1, 0, batch - 1)
        begin, end, c = offsets[request], offsets[request + 1], cached[request]
        known = (begin >= 0) & (begin <= token) & (token < end) & (c >= 0) & (c < 2**62)
        visible = np.where(known, c + token - begin + 1, 0)
        count = visible % kpool
        column = np.arange(extra)
        tail_positions = np.where(column < count[:, None], (visible - count)[:, None] + column, -1)
        tail_positions = np.where(known[:, None] & (tail_positions <= INT32_MAX), tail_positions, -1)
        positions[:, pool_topk * kpool :] = tail_positions


def kpool_ring_close(
    tail: np.ndarray,
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    slot_idx: np.ndarray,
    *,
    out: np.ndarray | None = None,
    closed: np.ndarray | None = None,
    validate: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Close each request's pending pool from its ring and the call's first tokens (NumPy).

    Same contract as :func:`kpool_cupy.kpool_ring_close`.
    """
    check_host_arrays("reference", tail=tail, k=k, gate=gate, ape=ape, input_row_offsets=input_row_offsets,
          cache_lengths=cache_lengths, slot_idx=slot_idx, out=out, closed=closed)  # fmt: skip
    return run_ring_close(
        _ReferenceRing(), tail, k, gate, ape, input_row_offsets, cache_lengths, slot_idx, out, closed, validate
    )


def kpool_seed_tail(
    tail: np.ndarray,
    k: np.ndarray,
    gate: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    slot_idx: np.ndarray,
    *,
    validate: bool = True,
) -> None:
    """Stash each request's trailing tokens into its ring (NumPy).

    Same contract as :func:`kpool_cupy.kpool_seed_tail`.
    """
    check_host_arrays("reference", tail=tail, k=k, gate=gate, input_row_offsets=input_row_offsets,
          cache_lengths=cache_lengths, slot_idx=slot_idx)  # fmt: skip
    run_seed_tail(_ReferenceRing(), tail, k, gate, input_row_offsets, cache_lengths, slot_idx, validate)


def kpool_tail_update(
    tail: np.ndarray,
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    positions: np.ndarray,
    slot_idx: np.ndarray,
    *,
    out: np.ndarray | None = None,
    closed: np.ndarray | None = None,
    validate: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """The decode step (NumPy); same contract as :func:`kpool_cupy.kpool_tail_update`."""
    check_host_arrays("reference", tail=tail, k=k, gate=gate, ape=ape, positions=positions, slot_idx=slot_idx,
          out=out, closed=closed)  # fmt: skip
    return run_tail_update(_ReferenceRing(), tail, k, gate, ape, positions, slot_idx, out, closed, validate)


def kpool_expand_topk(
    pool_ids: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    kpool: int,
    always_select_tail: bool = False,
    validate: bool = True,
) -> np.ndarray:
    """Selected pool ids to token positions (NumPy); same contract as :func:`kpool_cupy.kpool_expand_topk`."""
    check_host_arrays("reference", pool_ids=pool_ids, input_row_offsets=input_row_offsets, cache_lengths=cache_lengths)
    return run_expand_topk(
        _ReferenceRing(), pool_ids, input_row_offsets, cache_lengths, kpool, always_select_tail, validate
    )
