"""kpool_compress, described once: operands, checks, call flow and launch, plus its public docstrings.

    logits[m, c] = gate[member m, c] + ape[m, c]
    w[:, c]      = softmax over m of logits[:, c]     # per channel, not per member
    pooled[p, c] = sum_m w[m, c] * k[member m, c]

``SPEC`` is what kpool_cupy, kpool_cupy.emulate and kpool_cupy.reference bind.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..kernel.declarations import COMPRESS, COMPRESS_FP8
from ..kernel.geometry import spread_geometry
from .families.destinations import Destination, into_pooled_rows, launch_template, returned
from .families.fp8_form import PlainOp, RowsRule, fp8_docs, fp8_form
from .families.pooling import (
    ACCUMULATE,
    POOLING_INPUTS,
    CompressCall,
    check_pooling_inputs,
    find_pools,
    most_pools,
    pool_owners,
    pooling_template,
    pooling_values,
    pools_to_cover,
    token_fields,
)
from .framework.checks import (
    as_size,
    check_index,
    check_integer,
    check_out,
    check_out_dtype,
)
from .framework.examples import Example, ExampleBatch
from .framework.operands import OUT_DTYPE, ROTATE
from .framework.spec import VALIDATE, Backend, CallArgs, Gradient, Launch, Operand, OpSpec, Option, OutputShape


def check_compress_args(a: CallArgs) -> CompressCall:
    """Check everything about a call that needs no array contents."""
    head_dim, kpool, batch = check_pooling_inputs(a)
    if a.pool_row_offsets is not None:
        check_index("pool_row_offsets", a.pool_row_offsets, batch + 1)
    check_out(a.out, head_dim, ">= total_pools")
    given = getattr(a, "total_pools", None)  # kpool_compress's own option (not the FP8 form's)
    if given is not None:
        check_total_pools(given)
    return CompressCall(
        **token_fields(a, head_dim, kpool, batch),
        out_dtype=check_out_dtype(a.out_dtype, a.out, np.dtype(a.k.dtype)),
        rotate=bool(a.rotate),
        given_pools=None if given is None else as_size(given),
    )


def check_total_pools(total_pools: Any) -> None:
    check_integer("total_pools", total_pools, 0, MAX_TOTAL_POOLS)


MAX_TOTAL_POOLS = (1 << 31) - 1  # as many rows as int32 pool ids name


def output_shapes(call: CompressCall, total_pools: int | None) -> dict[str, OutputShape]:
    """``total_pools``: the count the data decided; None where the call stated it (``call.given_pools``)."""
    return {"out": ((call.given_pools if total_pools is None else total_pools, call.head_dim), call.out_dtype)}


def pools_to_size(call: CompressCall) -> int | None:
    """The most rows a result can take from the data; None where the call states them (``total_pools``)."""
    return None if call.given_pools is not None else most_pools(call)


def pool_into(backend: Backend, call: CompressCall, a: dict[str, Any], *, validate: bool, to: Destination) -> Any:
    """Validate, find the pool row offsets, size the outputs, cover the pools, launch the family's kernel that
    writes to ``to``; what kpool_compress and kpool_compress_fp8 both run."""
    stated = call.given_pools if to.allocates(a) else None  # total_pools sizes a result the call makes
    pools, total_pools, checked = find_pools(
        backend,
        call,
        a["input_row_offsets"],
        a["cache_lengths"],
        a["pool_row_offsets"],
        a["out"],
        validate=validate,
        sized=to.allocates(a) and stated is None,
    )
    if checked is not None:
        to.check_landing(backend, a, lambda: pool_owners(*checked, call.kpool))
    if stated is not None:  # (find_pools refused a count below the pools built, validating)
        # The stated rows, no read of the count: zeroed, since rows past the pools built stay unwritten.
        to.allocate(backend, a, (stated, call.head_dim), zeroed=True)
    else:
        to.allocate(backend, a, (total_pools or 0, call.head_dim), zeroed=False)
    room = to.room(a)
    covered = pools_to_cover(total_pools, call.total_tokens, call.kpool, most_pools(call) if room is None else room)
    if covered > 0:
        a = a | {"pool_row_offsets": pools}
        values = pooling_values(call, a, covered) | to.launch_values(a)
        template = launch_template(pooling_template(call, a), to, a)
        # Few pools (a short prefill) spread over about every SM, as the decode step's requests are.
        backend.launch(Launch(to.kernel, template, values, spread_geometry(call.head_dim, covered), a))
    return returned(to, a)


EMULATE_DOC = """Pool each complete k-pool of a ragged batch by running the CUDA kernel on the CPU.

Same arguments and result as :func:`kpool_cupy.kpool_compress`, on host
arrays (bfloat16 as ``ml_dtypes.bfloat16``).

Raises
------
CompilerNotFoundError
    When no host C++ compiler is found.
"""

REFERENCE_DOC = """Pool each complete k-pool of a ragged batch into one key, in NumPy.

Same arguments and result as :func:`kpool_cupy.kpool_compress`, on host
arrays (bfloat16 as ``ml_dtypes.bfloat16``).

Parameters
----------
accumulate
    ``"float32"`` (the kernel's arithmetic) or ``"float64"``.
"""

OUT = Operand("out", "[>= total_pools, head_dim] bfloat16, float16 or float32", True, True, rows_of="k")
TOTAL_POOLS = Option("total_pools", "int | None", None, kind="size", check=check_total_pools)
PARAMETERS = (*POOLING_INPUTS, OUT, VALIDATE, OUT_DTYPE, ROTATE, TOTAL_POOLS)
DOCS = {"emulate": EMULATE_DOC, "reference": REFERENCE_DOC}  # the GPU's is the def's (functions.py)


def example(b: ExampleBatch) -> Example:
    """Two requests' tokens."""
    return (b.k, b.gate, b.ape, b.offsets, b.lengths), {}


SPEC = OpSpec(
    "kpool_compress",
    PARAMETERS,
    ("pooled",),
    check_compress_args,
    into_pooled_rows(COMPRESS, pool_into),
    DOCS,
    output_shapes,
    extras={"reference": (ACCUMULATE,)},
    dynamic_sizes={"total_pools": pools_to_size},
    kernel=COMPRESS,
    # Named, not imported: a leaf op never imports another (the torch registry finds it by name).
    gradient=Gradient("kpool_compress_backward", ("k", "gate", "ape"), ("grad_pooled",), refused=("rotate",)),
    example=example,
)


# kpool_compress_fp8: the same pooling with the FP8 epilogue fused (families.fp8_form), into rows or a paged
# cache. The values equal the epilogue applied to kpool_compress's own float32 result; a pool lands at output
# row p, at slots[p], or through its request's block table row.
ACCUMULATE_DOC = """Parameters
----------
accumulate
    ``"float32"`` (the kernel's arithmetic) or ``"float64"`` for the pooling.
"""
FP8_SLOTS = Operand("slots", "[>= total_pools] int64 or int32: each pool's cache slot, -1 to skip", optional=True)


def fp8_rows_rule(call: CompressCall) -> RowsRule:
    """Rows at any stride, counted against the pools written; a block table row per request."""
    return RowsRule(batch=call.batch)


FP8_DOCS = fp8_docs("kpool_compress_fp8", ACCUMULATE_DOC)
FP8_SPEC = fp8_form("kpool_compress_fp8", PlainOp(SPEC, pool_into, fp8_rows_rule), COMPRESS_FP8, FP8_SLOTS, FP8_DOCS)
