"""An op's ``_fp8`` form: the same op with its pooled rows sent through the FP8 epilogue (``Fp8Rows``).

Per pool, after the op's pooling (float32, unrounded)::

    x = bf16(pooled);  y = bf16(B(x) * fl32(1/sqrt(D)));  s = ue8m0(max|y| / 448);  q = e4m3fn(y / s)

(backends/reference_epilogue.py spells out every rounding.) ``fp8_form``
builds the form's spec from the plain op's: its parameters with ``out`` in
place of ``round_scale``, ``cache``, slots or ``block_table``, ``out`` and
``out_scale`` (``out_dtype`` and ``rotate`` left out: the epilogue is the
rotation), its checks with the destination's, its outputs with values and
scales for the pooled rows, and its call flow (``pool_into``) with
``Fp8Rows`` as the destination. What the form adds is where its rows may
go (``RowsRule``) and the kernel of its family that writes them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ...dtypes import FLOAT32
from ...kernel.declarations import Kernel
from ..framework.checks import fail
from ..framework.spec import Backend, CallArgs, Operand, OpSpec, OutputShape
from .destinations import Fp8Rows
from .fp8_target import (
    BLOCK_TABLE_IN,
    CACHE,
    ROUND_SCALE,
    SCALES_OUT,
    UINT8,
    VALUES_OUT,
    Fp8Placement,
    check_rotation_head_dim,
    check_target,
)

# The plain op's options the FP8 form does not take: the epilogue fixes the first two; the last sizes a result
# the FP8 form (no autograd) has no need to size.
_PLAIN_ONLY = ("out_dtype", "rotate", "total_pools")


@dataclass(frozen=True)
class Fp8Call:
    """What the checks learned about an ``_fp8`` call: the plain op's record, where rows go, the scale rule."""

    plain: Any
    target: Fp8Placement
    round_scale: bool


@dataclass(frozen=True)
class RowsRule:
    """Where an FP8 form's rows may go, from the plain call record.

    ``leading`` is out's exact shape but the last dim (C-contiguous), None
    for ``[rows, head_dim]`` at any row stride; ``min_rows`` out's least row
    count with its reason; ``slot_rows`` the entries slots must have (None:
    checked against the pools written); ``batch`` block_table's rows.
    """

    batch: int
    leading: tuple[int, ...] | None = None
    min_rows: tuple[int, str] | None = None
    slot_rows: int | None = None


@dataclass(frozen=True)
class PlainOp:
    """What an FP8 form takes from its plain op: the spec, the call flow that takes a destination, and where
    rows may go."""

    spec: OpSpec
    pool_into: Callable[..., Any]  # pool_into(backend, call, arrays, *, validate, to)
    rows_rule: Callable[[Any], RowsRule]


def fp8_parameters(plain: OpSpec, slots: Operand | None) -> tuple[Any, ...]:
    """The plain op's parameters, ``out`` replaced by the FP8 destination's, its dtype and rotation options
    left out."""
    listed: list[Any] = []
    for p in plain.parameters:
        if p.name == "out":
            # Slots and the block table go with the cache; without slots the block table is how it goes.
            placing = [replace(slots, with_operand="cache")] if slots is not None else []
            placing.append(replace(BLOCK_TABLE_IN, with_operand="cache", required_with=slots is None))
            listed += [ROUND_SCALE, CACHE, *placing, VALUES_OUT, SCALES_OUT]
        elif p.name not in _PLAIN_ONLY:
            listed.append(p)
    return tuple(listed)


def fp8_docs(name: str, reference_more: str = "") -> dict[str, str]:
    """An FP8 form's CPU docstrings, naming the GPU's (its def's, ``kpool_cupy/functions.py``); the reference's
    with ``reference_more``, its own options."""
    emulate = f":func:`kpool_cupy.{name}`, running the CUDA kernel on the CPU (host arrays)."
    reference = "\n\n".join(filter(None, (f":func:`kpool_cupy.{name}` in NumPy (host arrays).", reference_more)))
    return {"emulate": emulate, "reference": reference}


def fp8_form(name: str, plain: PlainOp, kernel: Kernel, slots: Operand | None, docs: Mapping[str, str]) -> OpSpec:
    """The spec of ``plain``'s FP8 form, written by ``kernel`` (a sibling of the plain op's kernel)."""
    spec = plain.spec
    fp8_names = {"cache", "slots", "block_table", "out", "out_scale"}

    def check_args(a: CallArgs) -> Fp8Call:
        own = {n: v for n, v in vars(a).items() if n not in fp8_names}
        plain_call = spec.check_args(CallArgs(**own, out=None, out_dtype=None, rotate=False))
        check_rotation_head_dim("k", plain_call.head_dim)
        rule = plain.rows_rule(plain_call)
        target = check_target(
            plain_call.head_dim,
            out=a.out,
            out_scale=a.out_scale,
            cache=a.cache,
            slots=getattr(a, "slots", None),
            block_table=a.block_table,
            batch=rule.batch,
            leading=rule.leading,
            slot_rows=rule.slot_rows,
            takes_slots=slots is not None,
        )
        if rule.min_rows is not None and a.out is not None and a.out.shape[0] < rule.min_rows[0]:
            least, why = rule.min_rows
            raise fail("out", f"at least {least} rows ({why})", f"{a.out.shape[0]} rows")
        return Fp8Call(plain_call, target, bool(a.round_scale))

    def run(backend: Backend, call: Fp8Call, arrays: dict[str, Any], *, validate: bool, **options: Any) -> Any:
        to = Fp8Rows(kernel, call.target, call.round_scale)
        return plain.pool_into(backend, call.plain, arrays, validate=validate, to=to)

    def outputs(call: Fp8Call, **sizes: Any) -> dict[str, OutputShape]:
        shapes = dict(spec.outputs(call.plain, **sizes))
        rows, _ = shapes.pop("out")
        if call.target.to_cache:
            return shapes
        return {"out": (rows, UINT8), "out_scale": (rows[:-1], FLOAT32), **shapes}

    results = tuple(r for result in spec.results for r in (("values", "scales") if result == "pooled" else (result,)))
    dynamic = {size: (lambda call, bound=bound: bound(call.plain)) for size, bound in spec.dynamic_sizes.items()}
    return OpSpec(
        name,
        fp8_parameters(spec, slots),
        results,
        check_args,
        run,
        docs,
        outputs,
        extras=spec.extras,
        dynamic_sizes=dynamic,
        kernel=kernel,
        large_launch=spec.large_launch,
        check_head_dim=check_rotation_head_dim,
        example=spec.example,
    )
