"""kpool_ring_close_fp8, described once: ring close with the FP8 epilogue fused, into rows or a paged cache."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import FLOAT32, INT32
from ..kernel import codes
from ..kernel.geometry import group_geometry
from ..kernel.names import RING_SOURCE, ring_fp8_kernel_name
from .checks import check_no_overlap, check_rows_and_cache, fail
from .fp8_target import (
    BLOCK_TABLE_IN,
    CACHE,
    ROUND_SCALE,
    SCALES_OUT,
    SLOTS,
    TABLE,
    UINT8,
    VALUES_OUT,
    Fp8Target,
    check_destinations,
    check_rotation_head_dim,
    check_target,
    sink_arguments,
    value_rows_vector,
)
from .operands import (
    APE,
    CACHE_LENGTHS,
    INPUT_ROW_OFFSETS,
    RING_GATE,
    RING_READ,
    SLOT_IDX,
    TOKEN_K,
    requests,
    ring_and_tokens,
    ring_vector,
)
from .ring_checks import check_slot_values
from .ring_close import CLOSED, RingCloseCall, check_closed_pool_ids, check_ring_close_args
from .spec import VALIDATE, Backend, Launch, Operand, OpSpec, OutputShape


@dataclass(frozen=True)
class RingCloseFp8Call:
    """What the checks learned about a kpool_ring_close_fp8 call."""

    closing: RingCloseCall
    target: Fp8Target
    round_scale: bool


def check_ring_close_fp8_args(
    tail: Any, k: Any, gate: Any, ape: Any, input_row_offsets: Any, cache_lengths: Any, slot_idx: Any, cache: Any,
    slots: Any, block_table: Any, out: Any, out_scale: Any, closed: Any, round_scale: Any,
) -> RingCloseFp8Call:  # fmt: skip
    closing = check_ring_close_args(tail, k, gate, ape, input_row_offsets, cache_lengths, slot_idx, None, closed)
    check_rotation_head_dim("k", closing.head_dim)
    target = check_target(
        closing.head_dim,
        out=out,
        out_scale=out_scale,
        cache=cache,
        slots=slots,
        block_table=block_table,
        batch=closing.batch,
        slot_rows=closing.batch,
    )
    if out is not None and out.shape[0] < closing.batch:
        raise fail("out", f"at least {closing.batch} rows (one per request)", f"{out.shape[0]} rows")
    return RingCloseFp8Call(closing, target, bool(round_scale))


def output_shapes(call: RingCloseFp8Call) -> dict[str, OutputShape]:
    batch, head_dim = call.closing.batch, call.closing.head_dim
    shapes = {} if call.target.to_cache else {"out": ((batch, head_dim), UINT8), "out_scale": ((batch,), FLOAT32)}
    return shapes | {"closed": ((batch,), INT32)}


def ring_close_fp8_launch(call: RingCloseFp8Call, operands: dict[str, Any]) -> Launch:
    """The launch of ``kpool_ring_close_fp8``, arguments in kernels/kpool_ring.cu's order."""
    o, closing = operands, call.closing
    arguments = (
        *ring_and_tokens(o, closing.max_slots),
        *codes.rows(o["ape"]),
        *requests(o, closing.batch, closing.total_tokens),
        *sink_arguments(call.target, o),
        o["closed"],
        np.int32(call.round_scale),
    )
    vector = codes.vector_mask(k=o["k"], gate=o["gate"], ape=o["ape"], **ring_vector(o))
    if value_rows_vector(call.target, o):
        vector |= codes.VectorAccess.OUT
    indexes = codes.index_dtypes(o["input_row_offsets"], o["cache_lengths"], o["slot_idx"])
    name = ring_fp8_kernel_name(
        "kpool_ring_close_fp8",
        closing.dtype,
        closing.gate_dtype,
        closing.head_dim,
        closing.kpool,
        vector,
        call.target.kind,
        (*indexes, call.target.destination_dtype),
    )
    geometry = group_geometry(closing.head_dim, closing.batch)
    return Launch("kpool_ring_close_fp8", RING_SOURCE, name, geometry, arguments, call, operands)


def check_closing_destinations(
    backend: Backend, call: RingCloseFp8Call, slots: Any, block_table: Any, lengths: np.ndarray, closes: np.ndarray
) -> None:
    """With validate=True: every pool the call closes lands in the cache, each in a slot of its own."""
    target = call.target
    chosen = np.flatnonzero(closes)
    ids = lengths[chosen] // call.closing.kpool
    if target.kind == SLOTS:
        check_destinations(target, backend.host_copies([slots])[0], None, chosen, chosen, ids)
    elif target.kind == TABLE:
        table = backend.host_copies([block_table.reshape(-1)])[0].reshape(block_table.shape)
        check_destinations(target, None, table, chosen, chosen, ids)


def run(backend: Backend, arrays: tuple[Any, ...], *, round_scale: Any, validate: bool) -> Any:
    """Validate (offsets, slots, pool ids, where pools land), allocate zeroed outputs, launch."""
    tail, k, gate, ape, input_row_offsets, cache_lengths, slot_idx, cache, slots, block_table = arrays[:10]
    out, out_scale, closed = arrays[10:]
    call = check_ring_close_fp8_args(*arrays, round_scale)
    closing = call.closing
    check_no_overlap(PARAMETERS, arrays)
    if validate:
        offsets, lengths, ring_slots = backend.host_copies([input_row_offsets, cache_lengths, slot_idx])
        check_rows_and_cache(closing.total_tokens, offsets, lengths)
        check_slot_values(ring_slots, closing.max_slots)
        phase = lengths % closing.kpool
        completes = (phase != 0) & (np.diff(offsets) >= closing.kpool - phase)
        check_closed_pool_ids(lengths, completes, closing.kpool)
        check_closing_destinations(backend, call, slots, block_table, lengths, completes)
    # Zeroed: the rows of requests that close nothing are left alone.
    shapes = output_shapes(call)
    if not call.target.to_cache and out is None:
        out, out_scale = backend.zeros(*shapes["out"]), backend.zeros(*shapes["out_scale"])
    closed = backend.zeros(*shapes["closed"]) if closed is None else closed
    if closing.batch:
        operands = {"tail": tail, "k": k, "gate": gate, "ape": ape, "input_row_offsets": input_row_offsets}
        operands |= {"cache_lengths": cache_lengths, "slot_idx": slot_idx, "closed": closed}
        operands |= {"cache": cache, "slots": slots, "block_table": block_table, "out": out, "out_scale": out_scale}
        backend.launch(ring_close_fp8_launch(call, operands))
    return closed if call.target.to_cache else (out, out_scale, closed)


GPU_DOC = """Close each request's pending pool into an FP8 key: :func:`kpool_ring_close` with the FP8 epilogue fused.

The pool is :func:`kpool_ring_close`'s; its bytes and scale are
:func:`kpool_compress_fp8`'s for the same pool, bit for bit (head_dim a
power of two from 8 to 256). ``tail``, ``k``, ``gate``, ``ape``,
offsets, lengths and ``slot_idx`` as :func:`kpool_ring_close`; every ring
form (longer, split, padded) is taken.

Parameters
----------
round_scale
    As :func:`kpool_compress_fp8`.
cache
    As :func:`kpool_compress_fp8`; request b's pool goes to slot
    ``slots[b]`` (int64 or int32 ``[batch]``, -1 skips) or through
    ``block_table`` row b.
out, out_scale
    Without ``cache``: uint8 ``[>= batch, head_dim]`` and float32 ``[out
    rows]``, given together; new zeroed ones otherwise.
closed
    Optional int32 ``[>= batch]``: the pool id closed, or -1.
validate
    As :func:`kpool_ring_close`, and every closed pool lands in the cache in
    a slot of its own.

Returns
-------
(values, scales, closed), or closed when writing the cache
    values uint8 ``[batch, head_dim]``, scales float32 ``[batch]``; rows of
    requests that close nothing are left alone.
"""

EMULATE_DOC = """:func:`kpool_cupy.kpool_ring_close_fp8`, running the CUDA kernel on the CPU (host arrays)."""
REFERENCE_DOC = """:func:`kpool_cupy.kpool_ring_close_fp8` in NumPy (host arrays)."""
DOCS = {"cupy": GPU_DOC, "emulate": EMULATE_DOC, "reference": REFERENCE_DOC}

RING_SLOTS = Operand("slots", "[batch] int64 or int32: each request's cache slot, -1 to skip", optional=True)
PARAMETERS = (
    RING_READ,
    TOKEN_K,
    RING_GATE,
    APE,
    INPUT_ROW_OFFSETS,
    CACHE_LENGTHS,
    SLOT_IDX,
    ROUND_SCALE,
    CACHE,
    RING_SLOTS,
    BLOCK_TABLE_IN,
    VALUES_OUT,
    SCALES_OUT,
    CLOSED,
    VALIDATE,
)


def describe(arrays: tuple[Any, ...], options: Mapping[str, Any]) -> RingCloseFp8Call:
    return check_ring_close_fp8_args(*arrays, options["round_scale"])


SPEC = OpSpec("kpool_ring_close_fp8", PARAMETERS, ("values", "scales", "closed"), run, DOCS, output_shapes, describe)
