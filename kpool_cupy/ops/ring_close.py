"""kpool_ring_close, described once: close each request's pending pool from its ring and the call's first tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import INT32, INT32_MAX, signed_index
from ..kernel import codes
from ..kernel.declarations import RING_CLOSE, RING_CLOSE_FP8
from ..kernel.geometry import group_geometry
from .families.destinations import Destination, into_pooled_rows, launch_template, returned
from .families.fp8_form import PlainOp, RowsRule, fp8_docs, fp8_form
from .families.pooling import check_pooling_inputs
from .families.rings import check_closed, check_slot_values, check_slots, check_tail
from .framework.checks import (
    as_size,
    check_out,
    check_out_dtype,
    check_rows_and_cache,
    fail,
)
from .framework.examples import Example, ExampleBatch
from .framework.operands import (
    APE,
    CACHE_LENGTHS,
    INPUT_ROW_OFFSETS,
    OUT_DTYPE,
    RING_GATE,
    RING_READ,
    ROTATE,
    SLOT_IDX,
    TOKEN_K,
    TokenRingCall,
    token_ring_template,
    token_ring_values,
)
from .framework.spec import VALIDATE, Backend, CallArgs, Launch, Operand, OpSpec, OutputShape


@dataclass(frozen=True)
class RingCloseCall(TokenRingCall):
    """What the checks learned about a ring close call: a token ring call and what it writes."""

    kpool: int
    out_dtype: np.dtype
    rotate: bool = False


def check_ring_close_args(a: CallArgs) -> RingCloseCall:
    """Check everything about a call that needs no array contents."""
    head_dim, kpool, batch = check_pooling_inputs(a)
    max_slots, _, _ = check_tail(a.tail, np.dtype(a.k.dtype), np.dtype(a.gate.dtype), kpool, head_dim, writes=False)
    check_slots(a.slot_idx, batch)
    check_out(a.out, head_dim, ">= batch")
    if a.out is not None and a.out.shape[0] < batch:
        raise fail("out", f"at least {batch} rows (one per request)", f"{a.out.shape[0]} rows")
    if a.closed is not None:
        check_closed(a.closed, (batch,), exact=False)
    written = check_out_dtype(a.out_dtype, a.out, np.dtype(a.k.dtype))
    dtypes = np.dtype(a.k.dtype), np.dtype(a.gate.dtype)
    return RingCloseCall(head_dim, batch, as_size(a.k.shape[0]), max_slots, *dtypes, kpool, written, bool(a.rotate))


def check_closed_pool_ids(cache_lengths: np.ndarray, closes: np.ndarray, kpool: int) -> None:
    """Pool ids go out as int32: the pending pool c // kpool of each request that ``closes`` must fit."""
    too_big = closes & (cache_lengths.astype(np.int64) // kpool > INT32_MAX)
    if too_big.any():
        b = int(np.argmax(too_big))
        raise fail(
            "cache_lengths",
            f"pool ids c // kpool <= {INT32_MAX} (closed is int32)",
            f"{int(cache_lengths[b])} at index {b}",
        )


def output_shapes(call: RingCloseCall) -> dict[str, OutputShape]:
    return {"out": ((call.batch, call.head_dim), call.out_dtype), "closed": ((call.batch,), INT32)}


def pool_into(backend: Backend, call: RingCloseCall, a: dict[str, Any], *, validate: bool, to: Destination) -> Any:
    """Validate (offsets, slots, pool ids, where pools land), allocate zeroed outputs, launch the family's
    kernel that writes to ``to``; what kpool_ring_close and kpool_ring_close_fp8 both run."""
    if validate:
        offsets, lengths, slots = backend.host_copies([a["input_row_offsets"], a["cache_lengths"], a["slot_idx"]])
        slots = signed_index(slots, a["slot_idx"].dtype)
        check_rows_and_cache(call.total_tokens, offsets, lengths)
        check_slot_values(slots, call.max_slots)
        completes = (lengths % call.kpool != 0) & (np.diff(offsets) >= call.kpool - lengths % call.kpool)
        check_closed_pool_ids(lengths, completes, call.kpool)
        chosen = np.flatnonzero(completes)
        to.check_landing(backend, a, lambda: (chosen, chosen, lengths[chosen] // call.kpool))
    # Zeroed: the rows of requests that close nothing are left alone.
    to.allocate(backend, a, (call.batch, call.head_dim), zeroed=True)
    if a["closed"] is None:
        a["closed"] = backend.zeros(*output_shapes(call)["closed"])
    if call.batch:
        values = token_ring_values(a, call) | codes.rows("ape", a["ape"]) | to.launch_values(a)
        values["closed"] = a["closed"]
        source = token_ring_template(a, call) | {"KPOOL": call.kpool}
        source["VECTOR"] |= codes.vector_mask(ape=a["ape"])
        template = launch_template(source, to, a)
        backend.launch(Launch(to.kernel, template, values, group_geometry(call.head_dim, call.batch), a))
    return returned(to, a, a["closed"])


OUT = Operand("out", "[>= batch, head_dim] bfloat16, float16 or float32", True, True, rows_of="k")
CLOSED = Operand("closed", "[>= batch] int32", optional=True, written=True, dtype="int32")
PARAMETERS = (
    RING_READ,
    TOKEN_K,
    RING_GATE,
    APE,
    INPUT_ROW_OFFSETS,
    CACHE_LENGTHS,
    SLOT_IDX,
    OUT,
    CLOSED,
    VALIDATE,
    OUT_DTYPE,
    ROTATE,
)
EMULATE_DOC = """Close each request's pending pool, running the CUDA kernel on the CPU.

Same contract as :func:`kpool_cupy.kpool_ring_close`."""
REFERENCE_DOC = """Close each request's pending pool from its ring and the call's first tokens (NumPy).

Same contract as :func:`kpool_cupy.kpool_ring_close`."""
DOCS = {"emulate": EMULATE_DOC, "reference": REFERENCE_DOC}  # the GPU's is the def's (functions.py)


run = into_pooled_rows(RING_CLOSE, pool_into)


def example(b: ExampleBatch) -> Example:
    """The two requests' rings and this call's tokens."""
    return (b.ring, b.k, b.gate, b.ape, b.offsets, b.lengths, b.slots), {}


SPEC = OpSpec(
    "kpool_ring_close",
    PARAMETERS,
    ("pooled", "closed"),
    check_ring_close_args,
    run,
    DOCS,
    output_shapes,
    kernel=RING_CLOSE,
    example=example,
)


# kpool_ring_close_fp8: ring close with the FP8 epilogue fused (families.fp8_form), into rows or a paged cache.
# Request b's closed pool lands at output row b, at slots[b], or through block table row b.
FP8_SLOTS = Operand("slots", "[batch] int64 or int32: each request's cache slot, -1 to skip", optional=True)


def fp8_rows_rule(call: RingCloseCall) -> RowsRule:
    """One row, slot or block table row per request."""
    return RowsRule(batch=call.batch, min_rows=(call.batch, "one per request"), slot_rows=call.batch)


FP8_DOCS = fp8_docs("kpool_ring_close_fp8")
FP8_SPEC = fp8_form(
    "kpool_ring_close_fp8", PlainOp(SPEC, pool_into, fp8_rows_rule), RING_CLOSE_FP8, FP8_SLOTS, FP8_DOCS
)
