"""kpool_tail_update, described once: the decode step, stashing each token in its ring and closing pools."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import ELEMENT_CTYPES, INDEX_DTYPES, INT32, INT32_MAX, dtype_name, signed_index
from ..kernel import codes
from ..kernel.declarations import TAIL_UPDATE, TAIL_UPDATE_FP8
from ..kernel.geometry import HEAD_DIM_RULE, LARGE_BATCH, spread_geometry, takes_head_dim
from .families.destinations import Destination, into_pooled_rows, launch_template, returned
from .families.fp8_form import PlainOp, RowsRule, fp8_docs, fp8_form
from .families.fp8_target import check_rotation_head_dim
from .families.rings import check_closed, check_slot_values, check_slots, check_tail
from .framework.checks import (
    OUTPUT_DTYPES,
    as_size,
    check_ape,
    check_contiguous,
    check_nowhere,
    check_out_dtype,
    check_writable,
    dtype_fail,
    fail,
    require_array,
)
from .framework.examples import Example, ExampleBatch
from .framework.operands import APE, OUT_DTYPE, RING, RING_GATE, ROTATE, SLOT_IDX, ring, ring_template, ring_vector
from .framework.spec import VALIDATE, Backend, CallArgs, Launch, Operand, OpSpec, OutputShape, is_pair


@dataclass(frozen=True)
class TailUpdateCall:
    """What the checks learned about a tail update call."""

    head_dim: int
    kpool: int
    requests: int
    next_n: int
    pools_per_request: int  # ceil(next_n / kpool): the most pools one step can close
    max_slots: int
    dtype: np.dtype
    gate_dtype: np.dtype
    out_dtype: np.dtype
    rotate: bool = False


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
        raise fail(name, f"strides that are multiples of {array.dtype.itemsize} bytes", f"byte strides {array.strides}")


def _check_out(out: Any, shape: tuple[int, int, int]) -> None:
    """``out`` ``[requests, pools_per_request, head_dim]``, bfloat16, float16 or float32, C-contiguous."""
    if out is None:
        return
    allowed = OUTPUT_DTYPES
    require_array("out", out)
    if out.dtype not in allowed:
        raise dtype_fail("out", "dtype " + " or ".join(dtype_name(d) for d in allowed), dtype_name(out.dtype))
    if tuple(out.shape) != shape:
        raise fail("out", f"shape [{', '.join(map(str, shape))}]", f"shape {tuple(out.shape)}")
    check_contiguous("out", out)
    check_writable("out", out)


def check_tail_update_args(a: CallArgs) -> TailUpdateCall:
    """Check everything about a call that needs no array contents."""
    _check_step_tokens("k", a.k, tuple(ELEMENT_CTYPES))
    requests, next_n, head_dim = (as_size(d) for d in a.k.shape)
    if not takes_head_dim(head_dim):
        raise fail("k", f"head_dim (k.shape[2]) {HEAD_DIM_RULE}", head_dim)
    if a.rotate:
        check_rotation_head_dim("k", head_dim)
    _check_step_tokens("gate", a.gate, tuple(ELEMENT_CTYPES))
    if tuple(a.gate.shape) != tuple(a.k.shape):
        raise fail("gate", f"shape {tuple(a.k.shape)} like k", f"shape {tuple(a.gate.shape)}")
    kpool = check_ape(a.ape, head_dim)
    dtypes = np.dtype(a.k.dtype), np.dtype(a.gate.dtype)
    max_slots, _, _ = check_tail(a.tail, *dtypes, kpool, head_dim, writes=True)
    require_array("positions", a.positions)
    if a.positions.dtype not in INDEX_DTYPES:
        raise dtype_fail("positions", "dtype int32, uint32 or int64", a.positions.dtype)
    if tuple(a.positions.shape) != (requests, next_n):
        raise fail(
            "positions", f"shape [{requests}, {next_n}] like k's first two dims", f"shape {tuple(a.positions.shape)}"
        )
    check_contiguous("positions", a.positions)
    check_slots(a.slot_idx, requests)
    pools = -(-next_n // kpool)
    _check_out(a.out, (requests, pools, head_dim))
    if a.closed is not None:
        check_closed(a.closed, (requests, pools), exact=True)
    written = check_out_dtype(a.out_dtype, a.out, np.dtype(a.k.dtype))
    return TailUpdateCall(head_dim, kpool, requests, next_n, pools, max_slots, *dtypes, written, bool(a.rotate))


def check_position_values(positions: np.ndarray, kpool: int, pools_per_request: int) -> None:
    """Positions >= 0 or -1, closing at most the pools the output has room for (a close past them would be
    lost while the ring moves on)."""

    def at(r: int, t: int) -> str:
        return f"{int(positions[r, t])} at [{r}, {t}]"

    check_nowhere(positions < -1, "positions", "positions >= 0, or -1 for padding", at)
    check_nowhere(
        positions // kpool > INT32_MAX, "positions", f"pool ids pos // kpool <= {INT32_MAX} (closed is int32)", at
    )
    closes = ((positions >= 0) & (positions % kpool == kpool - 1)).sum(axis=1)
    if (closes > pools_per_request).any():
        r = int(np.argmax(closes > pools_per_request))
        raise fail(
            "positions",
            f"at most {pools_per_request} pool closings per request (ceil(next_n / kpool))",
            f"{int(closes[r])} in request {r}: {positions[r].tolist()}",
        )


def output_shapes(call: TailUpdateCall) -> dict[str, OutputShape]:
    shape = (call.requests, call.pools_per_request)
    return {"out": ((*shape, call.head_dim), call.out_dtype), "closed": (shape, INT32)}


def step_values(call: TailUpdateCall, operands: dict[str, Any]) -> dict[str, Any]:
    """What the decode kernels open with: the ring, the step's tokens and ape, positions, slots, the counts."""
    o = operands
    k, gate = o["k"], o["gate"]
    tokens = {"k": k, "k_request_stride": codes.stride(k, 0), "k_token_stride": codes.stride(k, 1)}
    tokens |= {"gate": gate, "gate_request_stride": codes.stride(gate, 0), "gate_token_stride": codes.stride(gate, 1)}
    places = {"positions": o["positions"], "slot_idx": o["slot_idx"], "requests": call.requests, "next_n": call.next_n}
    return ring(o, call.max_slots) | tokens | codes.rows("ape", o["ape"]) | places


def step_template(call: TailUpdateCall, operands: dict[str, Any]) -> dict[str, Any]:
    """The template parameters the decode kernels share: element types, sizes, the ring's form, index types."""
    o = operands
    indexes = {"IPOS": o["positions"].dtype, "IS": o["slot_idx"].dtype}
    vector = codes.vector_mask(k=o["k"], gate=o["gate"], ape=o["ape"], **ring_vector(o))
    return ring_template(o, call) | {"KPOOL": call.kpool, "SPLIT": is_pair(o["tail"]), "VECTOR": vector} | indexes


def closing_pools(steps: np.ndarray, kpool: int, pools_per_request: int) -> tuple[np.ndarray, np.ndarray]:
    """The pools a step closes (host positions): each one's request and pool id, as the kernel walks them."""
    closes = (steps >= 0) & (steps % kpool == kpool - 1)
    closes &= np.cumsum(closes, axis=1) <= pools_per_request
    requests, columns = np.nonzero(closes)
    return requests, steps[requests, columns] // kpool


def pool_into(backend: Backend, call: TailUpdateCall, a: dict[str, Any], *, validate: bool, to: Destination) -> Any:
    """Validate (positions, slots, where pools land), allocate zeroed outputs, launch the family's kernel that
    writes to ``to``; what kpool_tail_update and kpool_tail_update_fp8 both run."""
    if validate:
        slots, flat = backend.host_copies([a["slot_idx"], a["positions"].reshape(-1)])
        slots = signed_index(slots, a["slot_idx"].dtype)
        steps = signed_index(flat, a["positions"].dtype).reshape(call.requests, call.next_n)
        check_position_values(steps, call.kpool, call.pools_per_request)
        check_slot_values(slots, call.max_slots, writers=(steps >= 0).any(axis=1))

        def landing() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            requests, ids = closing_pools(steps, call.kpool, call.pools_per_request)
            return requests, requests, ids

        to.check_landing(backend, a, landing)
    shapes = output_shapes(call)
    to.allocate(backend, a, shapes["out"][0], zeroed=True)
    if a["closed"] is None:
        a["closed"] = backend.zeros(*shapes["closed"])
    if call.requests and call.next_n:
        values = step_values(call, a) | to.launch_values(a) | {"closed": a["closed"]}
        values["pools_per_request"] = call.pools_per_request
        template = launch_template(step_template(call, a), to, a)
        backend.launch(Launch(to.kernel, template, values, spread_geometry(call.head_dim, call.requests), a))
    return returned(to, a, a["closed"])


STEP_K = Operand("k", "[R, next_n, head_dim] bfloat16, float16 or float32; last dim contiguous")
POSITIONS = Operand("positions", "[R, next_n] int32, uint32 or int64, -1 (uint32: 0xFFFFFFFF) for padding")
OUT = Operand("out", "[R, ceil(next_n / kpool), head_dim] bfloat16, float16 or float32", True, True, rows_of="k")
CLOSED = Operand("closed", "[R, ceil(next_n / kpool)] int32", optional=True, written=True, dtype="int32")
PARAMETERS = (RING, STEP_K, RING_GATE, APE, POSITIONS, SLOT_IDX, OUT, CLOSED, VALIDATE, OUT_DTYPE, ROTATE)
EMULATE_DOC = (
    "The decode step, running the CUDA kernel on the CPU; same contract as :func:`kpool_cupy.kpool_tail_update`."
)
REFERENCE_DOC = "The decode step (NumPy); same contract as :func:`kpool_cupy.kpool_tail_update`."
DOCS = {"emulate": EMULATE_DOC, "reference": REFERENCE_DOC}  # the GPU's is the def's (functions.py)


run = into_pooled_rows(TAIL_UPDATE, pool_into)


def example(b: ExampleBatch) -> Example:
    """A decode step of 3 tokens a request, the second padded."""
    return (b.ring, b.step_k, b.step_gate, b.ape, b.positions, b.slots), {}


SPEC = OpSpec(
    "kpool_tail_update",
    PARAMETERS,
    ("pooled", "closed"),
    check_tail_update_args,
    run,
    DOCS,
    output_shapes,
    kernel=TAIL_UPDATE,
    large_launch=lambda head_dim: spread_geometry(head_dim, LARGE_BATCH),
    example=example,
)


# kpool_tail_update_fp8: the decode step with the FP8 epilogue fused (families.fp8_form), into rows or a paged
# cache. Request r's j-th closed pool lands at output row [r, j] or through block table row r; no slots.
def fp8_rows_rule(call: TailUpdateCall) -> RowsRule:
    """Rows ``[R, ceil(next_n / kpool)]``, C-contiguous; a block table row per request."""
    return RowsRule(batch=call.requests, leading=(call.requests, call.pools_per_request))


FP8_DOCS = fp8_docs("kpool_tail_update_fp8")
FP8_SPEC = fp8_form("kpool_tail_update_fp8", PlainOp(SPEC, pool_into, fp8_rows_rule), TAIL_UPDATE_FP8, None, FP8_DOCS)
