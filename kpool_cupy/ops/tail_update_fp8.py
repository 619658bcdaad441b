"""kpool_tail_update_fp8, described once: the decode step with the FP8 epilogue fused, into rows or a paged cache."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import FLOAT32, INT32
from ..kernel import codes
from ..kernel.geometry import group_geometry
from ..kernel.names import RING_SOURCE, ring_fp8_kernel_name
from .checks import check_no_overlap
from .fp8_target import (
    BLOCK_TABLE_IN,
    CACHE,
    ROUND_SCALE,
    SCALES_OUT,
    UINT8,
    VALUES_OUT,
    Fp8Target,
    check_destinations,
    check_rotation_head_dim,
    check_target,
    sink_arguments,
    value_rows_vector,
)
from .operands import APE, RING, RING_GATE, SLOT_IDX, ring, ring_vector
from .ring_checks import check_slot_values
from .spec import VALIDATE, Backend, Launch, OpSpec, OutputShape, is_pair
from .tail_update import CLOSED, POSITIONS, STEP_K, TailUpdateCall, check_position_values, check_tail_update_args


@dataclass(frozen=True)
class TailUpdateFp8Call:
    """What the checks learned about a kpool_tail_update_fp8 call."""

    step: TailUpdateCall
    target: Fp8Target
    round_scale: bool


def check_tail_update_fp8_args(
    tail: Any, k: Any, gate: Any, ape: Any, positions: Any, slot_idx: Any, cache: Any, block_table: Any, out: Any,
    out_scale: Any, closed: Any, round_scale: Any,
) -> TailUpdateFp8Call:  # fmt: skip
    step = check_tail_update_args(tail, k, gate, ape, positions, slot_idx, None, closed)
    check_rotation_head_dim("k", step.head_dim)
    target = check_target(
        step.head_dim,
        out=out,
        out_scale=out_scale,
        cache=cache,
        block_table=block_table,
        batch=step.requests,
        leading=(step.requests, step.pools_per_request),
        takes_slots=False,
    )
    return TailUpdateFp8Call(step, target, bool(round_scale))


def output_shapes(call: TailUpdateFp8Call) -> dict[str, OutputShape]:
    step = call.step
    shape = (step.requests, step.pools_per_request)
    shapes = {} if call.target.to_cache else {"out": ((*shape, step.head_dim), UINT8), "out_scale": (shape, FLOAT32)}
    return shapes | {"closed": (shape, INT32)}


def tail_update_fp8_launch(call: TailUpdateFp8Call, operands: dict[str, Any]) -> Launch:
    """The launch of ``kpool_tail_update_fp8``, arguments in kernels/kpool_ring.cu's order."""
    o, step = operands, call.step
    arguments = (
        *ring(o, step.max_slots),
        o["k"],
        codes.stride(o["k"], 0),
        codes.stride(o["k"], 1),
        o["gate"],
        codes.stride(o["gate"], 0),
        codes.stride(o["gate"], 1),
        *codes.rows(o["ape"]),
        o["positions"],
        o["slot_idx"],
        np.int64(step.requests),
        np.int32(step.next_n),
        *sink_arguments(call.target, o),
        o["closed"],
        np.int32(step.pools_per_request),
        np.int32(call.round_scale),
    )
    vector = codes.vector_mask(k=o["k"], gate=o["gate"], ape=o["ape"], **ring_vector(o))
    if value_rows_vector(call.target, o):
        vector |= codes.VectorAccess.OUT
    name = ring_fp8_kernel_name(
        "kpool_tail_update_fp8",
        step.dtype,
        step.gate_dtype,
        step.head_dim,
        step.kpool,
        vector,
        call.target.kind,
        (*codes.index_dtypes(o["positions"], o["slot_idx"]), call.target.destination_dtype),
        split=is_pair(o["tail"]),
    )
    geometry = group_geometry(step.head_dim, step.requests)
    return Launch("kpool_tail_update_fp8", RING_SOURCE, name, geometry, arguments, call, operands)


def closing_pools(steps: np.ndarray, kpool: int, pools_per_request: int) -> tuple[np.ndarray, np.ndarray]:
    """The pools a step closes (host positions): each one's request and pool id, as the kernel walks them."""
    closes = (steps >= 0) & (steps % kpool == kpool - 1)
    closes &= np.cumsum(closes, axis=1) <= pools_per_request
    requests, columns = np.nonzero(closes)
    return requests, steps[requests, columns] // kpool


def run(backend: Backend, arrays: tuple[Any, ...], *, round_scale: Any, validate: bool) -> Any:
    """Validate (positions, slots, where pools land), allocate zeroed outputs, launch."""
    tail, k, gate, ape, positions, slot_idx, cache, block_table, out, out_scale, closed = arrays
    call = check_tail_update_fp8_args(*arrays, round_scale)
    step = call.step
    check_no_overlap(PARAMETERS, arrays)
    if validate:
        ring_slots, flat = backend.host_copies([slot_idx, positions.reshape(-1)])
        steps = flat.reshape(step.requests, step.next_n)
        check_position_values(steps, step.kpool, step.pools_per_request)
        check_slot_values(ring_slots, step.max_slots, writers=(steps >= 0).any(axis=1))
        if call.target.to_cache:
            table = backend.host_copies([block_table.reshape(-1)])[0].reshape(block_table.shape)
            requests, ids = closing_pools(steps, step.kpool, step.pools_per_request)
            check_destinations(call.target, None, table, requests, requests, ids)
    shapes = output_shapes(call)
    if not call.target.to_cache and out is None:
        out, out_scale = backend.zeros(*shapes["out"]), backend.zeros(*shapes["out_scale"])
    closed = backend.zeros(*shapes["closed"]) if closed is None else closed
    if step.requests and step.next_n:
        operands = {"tail": tail, "k": k, "gate": gate, "ape": ape, "positions": positions}
        operands |= {"slot_idx": slot_idx, "closed": closed}
        operands |= {"cache": cache, "block_table": block_table, "out": out, "out_scale": out_scale}
        backend.launch(tail_update_fp8_launch(call, operands))
    return closed if call.target.to_cache else (out, out_scale, closed)


GPU_DOC = """The decode step into FP8 keys: :func:`kpool_tail_update` with the FP8 epilogue fused.

The ring, positions and closings are :func:`kpool_tail_update`'s (every
ring form, speculative steps included); each closed pool's bytes and scale
are :func:`kpool_compress_fp8`'s for the same pool, bit for bit (head_dim a
power of two from 8 to 256).

Parameters
----------
round_scale
    As :func:`kpool_compress_fp8`.
cache, block_table
    As :func:`kpool_compress_fp8`, given together: request r's pool q goes
    to slot ``block_table[r, q // block_size] * block_size + q % block_size``
    (row r of the call is block table row r).
out, out_scale
    Without ``cache``: uint8 ``[R, ceil(next_n / kpool), head_dim]`` and
    float32 ``[R, ceil(next_n / kpool)]``, C-contiguous, given together;
    new zeroed ones otherwise.
closed
    Optional int32 ``[R, ceil(next_n / kpool)]``.
validate
    As :func:`kpool_tail_update`, and every closed pool lands in the cache in
    a slot of its own.

Returns
-------
(values, scales, closed), or closed when writing the cache
    closed lists the pool ids closed in order, padded with -1 (those rows
    are left alone).
"""

EMULATE_DOC = """:func:`kpool_cupy.kpool_tail_update_fp8`, running the CUDA kernel on the CPU (host arrays)."""
REFERENCE_DOC = """:func:`kpool_cupy.kpool_tail_update_fp8` in NumPy (host arrays)."""
DOCS = {"cupy": GPU_DOC, "emulate": EMULATE_DOC, "reference": REFERENCE_DOC}

PARAMETERS = (
    RING,
    STEP_K,
    RING_GATE,
    APE,
    POSITIONS,
    SLOT_IDX,
    ROUND_SCALE,
    CACHE,
    BLOCK_TABLE_IN,
    VALUES_OUT,
    SCALES_OUT,
    CLOSED,
    VALIDATE,
)


def describe(arrays: tuple[Any, ...], options: Mapping[str, Any]) -> TailUpdateFp8Call:
    return check_tail_update_fp8_args(*arrays, options["round_scale"])


SPEC = OpSpec("kpool_tail_update_fp8", PARAMETERS, ("values", "scales", "closed"), run, DOCS, output_shapes, describe)
