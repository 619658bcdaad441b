"""kpool_compress_backward, described once: the gradients of kpool_compress with respect to k, gate and ape.

For one pool, with ``g = d loss / d pooled``, ``l = gate + ape`` and ``w`` the per-channel softmax of l::

    d k[m, c]    = w[m, c] * g[c]
    d gate[m, c] = w[m, c] * g[c] * (k[m, c] - pooled[c])
    d ape[m, c]  = sum over every pool of d gate[m, c]

Two launches. ``kpool_compress_backward``'s pool blocks recompute each pool (w and pooled, never stored) and
write its members' d k and d gate rows and the block's partial sums of d ape; its blocks after them write the
zero rows of the tokens no pool covers, one group a request (so the outputs need no clearing first).
``kpool_compress_backward_ape`` sums the partials in a fixed order (64 slices of the pool blocks, each in block
order, then the slices' sums pairwise), so d ape has the same bits on every run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import FLOAT32, dtype_name
from ..kernel import codes
from ..kernel.declarations import COMPRESS_BACKWARD, COMPRESS_BACKWARD_APE
from ..kernel.geometry import LaunchGeometry, ape_sum_geometry, check_head_dim, group_geometry
from ..pool_offsets import check_kpool
from .families.pooling import (
    ACCUMULATE,
    POOLING_INPUTS,
    CompressCall,
    find_pools,
    pooling_template,
    pooling_values,
    pools_to_cover,
    token_fields,
)
from .framework.checks import (
    OUTPUT_DTYPES,
    as_size,
    check_ape,
    check_batch_index,
    check_index,
    check_integer,
    check_keys,
    check_rows,
    check_workspace,
    check_workspace_size,
    check_writable_rows,
    dtype_fail,
    fail,
    require_array,
)
from .framework.examples import Example, ExampleBatch
from .framework.spec import VALIDATE, Backend, CallArgs, Launch, Operand, OpSpec, OutputShape


@dataclass(frozen=True)
class CompressBackwardCall(CompressCall):
    """compress's call record, with the gradient's dtype and rows."""

    grad_dtype: np.dtype = FLOAT32
    grad_rows: int = 0


def check_grad_pooled(grad: Any, head_dim: int) -> None:
    """``[>= total_pools, head_dim]`` in any of the pooled dtypes, at any strides in whole elements (0 too)."""
    require_array("grad_pooled", grad)
    if np.dtype(grad.dtype) not in OUTPUT_DTYPES:
        allowed = " or ".join(dtype_name(d) for d in OUTPUT_DTYPES)
        raise dtype_fail("grad_pooled", f"dtype {allowed}", dtype_name(np.dtype(grad.dtype)))
    if grad.ndim != 2 or grad.shape[1] != head_dim:
        raise fail("grad_pooled", f"shape [>= total_pools, {head_dim}] (head_dim of k)", f"shape {tuple(grad.shape)}")
    itemsize = np.dtype(grad.dtype).itemsize
    if any(s % itemsize for s in grad.strides):
        raise fail(
            "grad_pooled", f"strides in whole elements ({itemsize} bytes)", f"byte strides {tuple(grad.strides)}"
        )


def check_gradient_out(name: str, array: Any, like: str, shape: tuple[Any, ...], dtype: np.dtype) -> None:
    """A given gradient output: the shape and dtype of what it is the gradient of, rows that do not overlap."""
    if array is None:
        return
    check_rows(name, array, (dtype,))
    if tuple(array.shape) != tuple(shape):
        raise fail(name, f"shape {tuple(shape)} like {like}", f"shape {tuple(array.shape)}")
    check_writable_rows(name, array)


def check_compress_backward_args(a: CallArgs) -> CompressBackwardCall:
    head_dim = check_keys(a.k, a.gate)
    kpool, batch = check_ape(a.ape, head_dim), check_batch_index(a.input_row_offsets, a.cache_lengths)
    if a.pool_row_offsets is not None:
        check_index("pool_row_offsets", a.pool_row_offsets, batch + 1)
    check_grad_pooled(a.grad_pooled, head_dim)
    check_gradient_out("grad_k", a.grad_k, "k", tuple(a.k.shape), np.dtype(a.k.dtype))
    check_gradient_out("grad_gate", a.grad_gate, "gate", tuple(a.gate.shape), np.dtype(a.gate.dtype))
    check_gradient_out("grad_ape", a.grad_ape, "ape", tuple(a.ape.shape), FLOAT32)
    check_workspace(a.workspace)
    return CompressBackwardCall(
        **token_fields(a, head_dim, kpool, batch),
        out_dtype=np.dtype(a.grad_pooled.dtype),
        grad_dtype=np.dtype(a.grad_pooled.dtype),
        grad_rows=as_size(a.grad_pooled.shape[0]),
    )


def output_shapes(call: CompressBackwardCall) -> dict[str, OutputShape]:
    return {
        "grad_k": ((call.total_tokens, call.head_dim), call.k_dtype),
        "grad_gate": ((call.total_tokens, call.head_dim), call.gate_dtype),
        "grad_ape": ((call.kpool, call.head_dim), FLOAT32),
    }


def made(backend: Backend, given: Any, shape: tuple[int, ...], dtype: np.dtype, validate: bool) -> Any:
    """The given output, or a new one: uninitialized when the offsets were validated (the kernels then write
    every element), zeroed when not (garbage offsets may leave rows unwritten, and those read zero alike on
    every backend)."""
    if given is not None:
        return given
    return (backend.empty if validate else backend.zeros)(shape, dtype)


def run(backend: Backend, call: CompressBackwardCall, a: dict[str, Any], *, validate: bool) -> Any:
    """Validate (with compress's checks, and a gradient row for every pool), make the outputs the caller left
    out, launch the pools' gradients with the zero rows of tokens in no pool, then the sum of ape's."""
    pools, total_pools, _ = find_pools(
        backend, call, a["input_row_offsets"], a["cache_lengths"], a["pool_row_offsets"], None,
        validate=validate, sized=False,
    )  # fmt: skip
    grad = a["grad_pooled"]
    if total_pools is not None and grad.shape[0] < total_pools:
        raise fail("grad_pooled", f"at least {total_pools} rows (total_pools)", f"{grad.shape[0]} rows")
    shapes = output_shapes(call)
    outputs = {name: made(backend, a[name], *shapes[name], validate) for name in shapes}
    workspace = a["workspace"]
    sizing = f"compress_backward_workspace_bytes({call.total_tokens}, {call.head_dim}, {call.kpool})"
    check_workspace_size(workspace, scratch_bytes(call), sizing)
    covered = pools_to_cover(total_pools, call.total_tokens, call.kpool, int(grad.shape[0]))
    pooling = group_geometry(call.head_dim, covered) if covered > 0 else None
    blocks = pooling.grid if pooling else 0
    # The request groups that zero the rows in no pool, in blocks of the pools' size after the pools' blocks.
    rest = group_geometry(call.head_dim, call.batch).grid if call.batch > 0 and call.total_tokens > 0 else 0
    if pooling:
        shape, dtype = partials_shape(call, covered)
        if workspace is None:
            partials = backend.empty(shape, dtype)
        else:  # the caller's bytes as the partials: nothing allocated
            partials = workspace[: int(np.prod(shape)) * dtype.itemsize].view(dtype).reshape(shape)
    else:
        partials = outputs["grad_ape"]  # never read: no block writes a partial
    if blocks + rest > 0:
        o = a | outputs | {"pool_row_offsets": pools, "partials": partials}
        grad_strides = [s // grad.dtype.itemsize for s in grad.strides]
        values = pooling_values(call, o, covered) | codes.rows("grad", grad)
        values |= {"grad_column_stride": grad_strides[1], "grad_rows": grad.shape[0]}
        values |= codes.rows("grad_k", o["grad_k"]) | codes.rows("grad_gate", o["grad_gate"])
        values |= {"partials": partials, "pool_blocks": blocks}
        template = pooling_template(call, o) | {"DT": call.grad_dtype}
        template["VECTOR"] = gradient_vector(o)
        block = group_geometry(call.head_dim, 1).block  # the pools' blocks and the requests' alike
        items = pooling.items if pooling else 0  # the pools the pool blocks cover
        geometry = LaunchGeometry(grid=blocks + rest, block=block, items=items)
        backend.launch(Launch(COMPRESS_BACKWARD, template, values, geometry, o))
    o = {"partials": partials, "grad_ape": outputs["grad_ape"]}
    values = {"partials": partials, "blocks": blocks} | codes.rows("grad_ape", outputs["grad_ape"])
    template = {"HEAD_DIM": call.head_dim, "KPOOL": call.kpool}
    geometry = ape_sum_geometry(call.kpool * call.head_dim)
    backend.launch(Launch(COMPRESS_BACKWARD_APE, template, values, geometry, o))
    return outputs["grad_k"], outputs["grad_gate"], outputs["grad_ape"]


def partials_shape(call: CompressBackwardCall, covered: int) -> OutputShape:
    """The working memory of d ape's block partials when the grid covers ``covered`` pools (none for 0)."""
    return (group_geometry(call.head_dim, covered).grid, call.kpool, call.head_dim), FLOAT32


def workspace_bytes(total_tokens: int, head_dim: int, kpool: int) -> int:
    """Bytes of the block partials for the most pools ``total_tokens`` tokens can complete (``total_tokens //
    kpool``, which a grid never exceeds), 16-byte aligned sizes."""
    covered = total_tokens // kpool
    if covered == 0:
        return 0
    return group_geometry(head_dim, covered).grid * kpool * head_dim * FLOAT32.itemsize


def scratch_bytes(call: CompressBackwardCall) -> int:
    """What a call's ``workspace`` must hold (``OpSpec.scratch_bytes``)."""
    return workspace_bytes(call.total_tokens, call.head_dim, call.kpool)


def compress_backward_workspace_bytes(total_tokens: int, head_dim: int, kpool: int) -> int:
    """Bytes of ``workspace`` :func:`kpool_compress_backward` needs for ``total_tokens`` tokens (k's rows) of
    ``head_dim`` channels at ``kpool``: d ape's per-block partial sums for every pool the tokens can complete,
    float32 ``[blocks, kpool, head_dim]`` (0 with fewer tokens than kpool). One buffer of this size serves any
    call with at most that many tokens; its contents need no clearing."""
    check_integer("total_tokens", total_tokens, 0)
    check_head_dim("head_dim", head_dim)
    check_kpool(kpool)
    return workspace_bytes(int(total_tokens), int(head_dim), int(kpool))


def gradient_vector(o: dict[str, Any]) -> int:
    """The backward's VECTOR bits: k's with grad_k's, gate's with grad_gate's, ape's, and OUT for the
    gradient rows when their column stride is 1."""
    both = codes.allows_vector_access
    bits = codes.VectorAccess(0)
    if both(o["k"]) and both(o["grad_k"]):
        bits |= codes.VectorAccess.K
    if both(o["gate"]) and both(o["grad_gate"]):
        bits |= codes.VectorAccess.GATE
    if both(o["ape"]):
        bits |= codes.VectorAccess.APE
    grad = o["grad_pooled"]
    unit = grad.shape[1] <= 1 or grad.strides[1] == grad.dtype.itemsize
    if unit and both(grad):
        bits |= codes.VectorAccess.OUT
    return int(bits)


EMULATE_DOC = """The gradients of kpool_compress, by running the CUDA kernels on the CPU.

Same arguments and results as :func:`kpool_cupy.kpool_compress_backward`, on
host arrays (bfloat16 as ``ml_dtypes.bfloat16``).

Raises
------
CompilerNotFoundError
    When no host C++ compiler is found.
"""

REFERENCE_DOC = """The gradients of kpool_compress, in NumPy.

Same arguments and results as :func:`kpool_cupy.kpool_compress_backward`, on
host arrays (bfloat16 as ``ml_dtypes.bfloat16``).

Parameters
----------
accumulate
    ``"float32"`` (the kernels' arithmetic) or ``"float64"``.
"""

GRAD_POOLED = Operand("grad_pooled", "[>= total_pools, head_dim] bfloat16, float16 or float32; any strides")
# Written whole when the call validates (the rows of tokens in no pool zeroed by a launch of their own).
GRAD_K = Operand("grad_k", "like k", True, True, rows_of="k", filled="validated")
GRAD_GATE = Operand("grad_gate", "like gate", True, True, rows_of="gate", filled="validated")
GRAD_APE = Operand(
    "grad_ape", "float32 [kpool, head_dim] like ape", True, True, rows_of="ape", dtype="float32", filled="validated"
)
WORKSPACE = Operand(
    "workspace", "uint8 [>= compress_backward_workspace_bytes(...)], 16-byte aligned: scratch", True, True,
    scratch=True,
)  # fmt: skip
PARAMETERS = (GRAD_POOLED, *POOLING_INPUTS, GRAD_K, GRAD_GATE, GRAD_APE, WORKSPACE, VALIDATE)
DOCS = {"emulate": EMULATE_DOC, "reference": REFERENCE_DOC}  # the GPU's is the def's (functions.py)


def example(b: ExampleBatch) -> Example:
    """compress's gradient for the two requests' tokens."""
    return (b.grad_pooled, b.k, b.gate, b.ape, b.offsets, b.lengths), {}


SPEC = OpSpec(
    "kpool_compress_backward",
    PARAMETERS,
    ("grad_k", "grad_gate", "grad_ape"),
    check_compress_backward_args,
    run,
    DOCS,
    output_shapes,
    extras={"reference": (ACCUMULATE,)},
    kernel=COMPRESS_BACKWARD,
    example=example,
    scratch_bytes=scratch_bytes,
)
