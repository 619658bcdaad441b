"""The flow of the ring and expand calls for the two backends that launch kernels (GPU and emulator).

Validate, check contents when asked, size the outputs, launch. The backends
differ only in where arrays live and how a launch happens.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol

import numpy as np

from ._geometry import LaunchGeometry, flat_geometry, launch_geometry
from ._launch import expand_arguments, ring_close_arguments, seed_tail_arguments, tail_update_arguments
from ._validate import check_rows_and_cache
from ._validate_ring import (
    INT32,
    RingCall,
    check_closed_pool_ids,
    check_expand_args,
    check_position_values,
    check_ring_close_args,
    check_seed_tail_args,
    check_slot_values,
    check_tail_update_args,
)
from ._variants import EXPAND_SOURCE, RING_SOURCE, expand_kernel_name, ring_kernel_name


class RingBackend(Protocol):
    """Where arrays live and how each operation computes; the flow around it is shared."""

    def host_copies(self, arrays: list[Any]) -> list[np.ndarray]: ...

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any: ...

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any: ...

    def ring_close(self, call: RingCall, arrays: tuple[Any, ...], out: Any, closed: Any) -> None: ...

    def seed_tail(self, call: RingCall, arrays: tuple[Any, ...]) -> None: ...

    def tail_update(self, call: RingCall, arrays: tuple[Any, ...], out: Any, closed: Any) -> None: ...

    def expand_topk(self, pool_topk: int, kpool: int, arrays: tuple[Any, ...], batch: int, positions: Any) -> None: ...


class KernelRingBackend(ABC):
    """The four operations as launches of kernels/kpool_ring.cu and kernels/kpool_expand.cu."""

    @abstractmethod
    def launch(self, source: str, name: str, geometry: LaunchGeometry, args: tuple[Any, ...]) -> None: ...

    def ring_close(self, call: RingCall, arrays: tuple[Any, ...], out: Any, closed: Any) -> None:
        name = ring_kernel_name("kpool_ring_close", call.dtype, call.out_dtype, call.head_dim, call.kpool)
        args = ring_close_arguments(call, *arrays, out, closed)
        self.launch(RING_SOURCE, name, launch_geometry(call.head_dim, call.requests), args)

    def seed_tail(self, call: RingCall, arrays: tuple[Any, ...]) -> None:
        name = ring_kernel_name("kpool_seed_tail", call.dtype, None, call.head_dim, call.kpool)
        args = seed_tail_arguments(call, *arrays)
        self.launch(RING_SOURCE, name, launch_geometry(call.head_dim, call.requests), args)

    def tail_update(self, call: RingCall, arrays: tuple[Any, ...], out: Any, closed: Any) -> None:
        name = ring_kernel_name("kpool_tail_update", call.dtype, call.out_dtype, call.head_dim, call.kpool)
        args = tail_update_arguments(call, *arrays, out, closed)
        self.launch(RING_SOURCE, name, launch_geometry(call.head_dim, call.requests), args)

    def expand_topk(self, pool_topk: int, kpool: int, arrays: tuple[Any, ...], batch: int, positions: Any) -> None:
        pool_ids, input_row_offsets, cache_lengths = arrays
        total_tokens = int(positions.shape[0])
        args = expand_arguments(pool_ids, pool_topk, input_row_offsets, cache_lengths, batch, total_tokens, positions)
        self.launch(EXPAND_SOURCE, expand_kernel_name(kpool), flat_geometry(positions.size), args)


def run_ring_close(
    backend: RingBackend, tail, k, gate, ape, input_row_offsets, cache_lengths, slot_idx, out, closed, validate: bool
) -> tuple[Any, Any]:
    call = check_ring_close_args(tail, k, gate, ape, input_row_offsets, cache_lengths, slot_idx, out, closed)
    if validate:
        offsets, lengths, slots = backend.host_copies([input_row_offsets, cache_lengths, slot_idx])
        check_rows_and_cache(call.total_tokens, offsets, lengths)
        check_slot_values(slots, call.max_slots)
        completes = (lengths % call.kpool != 0) & (np.diff(offsets) >= call.kpool - lengths % call.kpool)
        check_closed_pool_ids(lengths[completes], call.kpool)
    out = backend.zeros((call.requests, call.head_dim), call.out_dtype) if out is None else out
    closed = backend.zeros((call.requests,), INT32) if closed is None else closed
    if call.requests:
        backend.ring_close(call, (tail, k, gate, ape, input_row_offsets, cache_lengths, slot_idx), out, closed)
    return out, closed


def run_seed_tail(
    backend: RingBackend, tail, k, gate, input_row_offsets, cache_lengths, slot_idx, validate: bool
) -> None:
    call = check_seed_tail_args(tail, k, gate, input_row_offsets, cache_lengths, slot_idx)
    if validate:
        offsets, lengths, slots = backend.host_copies([input_row_offsets, cache_lengths, slot_idx])
        check_rows_and_cache(call.total_tokens, offsets, lengths)
        end = lengths + np.diff(offsets)
        check_slot_values(slots, call.max_slots, writers=end > np.maximum(end // call.kpool * call.kpool, lengths))
    if call.requests:
        backend.seed_tail(call, (tail, k, gate, input_row_offsets, cache_lengths, slot_idx))


def run_tail_update(
    backend: RingBackend, tail, k, gate, ape, positions, slot_idx, out, closed, validate: bool
) -> tuple[Any, Any]:
    call = check_tail_update_args(tail, k, gate, ape, positions, slot_idx, out, closed)
    if validate:
        slots, flat = backend.host_copies([slot_idx, positions.reshape(-1)])
        steps = flat.reshape(call.requests, call.next_n)
        check_position_values(steps, call.kpool, call.pools_per_request)
        check_slot_values(slots, call.max_slots, writers=(steps >= 0).any(axis=1))
    shape = (call.requests, call.pools_per_request)
    out = backend.zeros((*shape, call.head_dim), call.out_dtype) if out is None else out
    closed = backend.zeros(shape, INT32) if closed is None else closed
    if call.requests and call.next_n:
        backend.tail_update(call, (tail, k, gate, ape, positions, slot_idx), out, closed)
    return out, closed


def expand_width(pool_topk: int, kpool: int, always_select_tail: bool) -> int:
    return pool_topk * kpool + (kpool - 1 if always_select_tail else 0)


def run_expand_topk(
    backend: RingBackend, pool_ids, input_row_offsets, cache_lengths, kpool, always_select_tail: bool, validate: bool
) -> Any:
    batch, pool_topk = check_expand_args(pool_ids, input_row_offsets, cache_lengths, kpool)
    total_tokens = int(pool_ids.shape[0])
    if validate:
        offsets, lengths = backend.host_copies([input_row_offsets, cache_lengths])
        check_rows_and_cache(total_tokens, offsets, lengths)
    # Every element is written, so no zero fill (ring close and tail update
    # zero theirs: the rows of pools that did not close are left alone).
    positions = backend.empty((total_tokens, expand_width(pool_topk, int(kpool), always_select_tail)), INT32)
    if positions.size:
        backend.expand_topk(pool_topk, int(kpool), (pool_ids, input_row_offsets, cache_lengths), batch, positions)
    return positions
