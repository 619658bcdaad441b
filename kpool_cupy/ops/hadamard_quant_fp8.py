"""hadamard_quant_fp8, described once: the query side of the FP8 epilogue (rotate, scale, e4m3fn bytes)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import ELEMENT_CTYPES, FLOAT32, dtype_name
from ..kernel import codes
from ..kernel.declarations import HADAMARD_QUANT_FP8
from ..kernel.geometry import group_geometry
from .families.fp8_target import (
    ROUND_SCALE,
    SCALES_OUT,
    UINT8,
    VALUES_DTYPE,
    VALUES_OUT,
    check_rotation_head_dim,
    check_target,
    values_dtype,
)
from .framework.checks import as_size, check_rows, dtype_fail, fail
from .framework.examples import Example, ExampleBatch
from .framework.spec import VALIDATE, Backend, CallArgs, Launch, Operand, OpSpec, OutputShape


@dataclass(frozen=True)
class HadamardQuantFp8Call:
    rows: int
    head_dim: int
    dtype: np.dtype
    round_scale: bool
    values_dtype: np.dtype  # uint8 or float8_e4m3fn: what the values come back as (out_dtype, or out's)


def check_hadamard_quant_fp8_args(a: CallArgs) -> HadamardQuantFp8Call:
    check_rows("x", a.x, tuple(ELEMENT_CTYPES))
    rows, head_dim = (as_size(n) for n in a.x.shape)
    check_rotation_head_dim("x", head_dim)
    check_target(head_dim, out=a.out, out_scale=a.out_scale)
    if a.out is not None and a.out.shape[0] != rows:
        raise fail("out", f"shape [{rows}, {head_dim}] (x's rows)", f"shape {tuple(a.out.shape)}")
    values = values_dtype(a.out_dtype)  # with out, out is returned as given: its own dtype types the values
    return HadamardQuantFp8Call(rows, head_dim, np.dtype(a.x.dtype), bool(a.round_scale), values)


def output_shapes(call: HadamardQuantFp8Call) -> dict[str, OutputShape]:
    return {"out": ((call.rows, call.head_dim), call.values_dtype), "out_scale": ((call.rows,), FLOAT32)}


def hadamard_quant_fp8_launch(call: HadamardQuantFp8Call, operands: dict[str, Any]) -> Launch:
    """The launch of ``kpool_hadamard_quant_fp8``."""
    o = operands
    values = codes.rows("x", o["x"]) | {"rows": call.rows} | codes.rows("values", o["out"])
    values |= {"scales": o["out_scale"]}
    vector = codes.vector_mask(k=o["x"])
    if codes.allows_8byte_rows(o["out"]):
        vector |= codes.VectorAccess.OUT  # 8-byte stores of a row's bytes
    template = {"T": call.dtype, "HEAD_DIM": call.head_dim, "VECTOR": vector, "ROUND_SCALE": call.round_scale}
    return Launch(HADAMARD_QUANT_FP8, template, values, group_geometry(call.head_dim, call.rows), o)


def run(backend: Backend, call: HadamardQuantFp8Call, a: dict[str, Any], *, validate: bool, **options: Any) -> Any:
    """Allocate, launch; ``validate`` has no contents to check here (no index arrays)."""
    values = a["out"]
    if values is None:
        shapes = output_shapes(call)
        a["out"], a["out_scale"] = backend.empty(shapes["out"][0], UINT8), backend.empty(*shapes["out_scale"])
        values = a["out"]
        if call.values_dtype != UINT8:
            try:
                values = a["out"].view(call.values_dtype)
            except (TypeError, ValueError):  # an array library with no such dtype
                raise dtype_fail("out_dtype", "uint8 on this backend (its arrays take no float8_e4m3fn)",
                                 dtype_name(call.values_dtype)) from None  # fmt: skip
    if call.rows:
        backend.launch(hadamard_quant_fp8_launch(call, a))
    return values, a["out_scale"]


EMULATE_DOC = """:func:`kpool_cupy.hadamard_quant_fp8`, running the CUDA kernel on the CPU (host arrays)."""
REFERENCE_DOC = """:func:`kpool_cupy.hadamard_quant_fp8` in NumPy (host arrays)."""
DOCS = {"emulate": EMULATE_DOC, "reference": REFERENCE_DOC}  # the GPU's is the def's (functions.py)

QUERY = Operand("x", "[rows, head_dim] bfloat16, float16 or float32; last dim contiguous")
QUERY_VALUES = dataclasses.replace(VALUES_OUT, rows_of="x")  # rows as wide as x's
PARAMETERS = (QUERY, ROUND_SCALE, VALUES_DTYPE, QUERY_VALUES, SCALES_OUT, VALIDATE)


def example(b: ExampleBatch) -> Example:
    """The tokens' keys as query rows."""
    return (b.k,), {}


SPEC = OpSpec(
    "hadamard_quant_fp8",
    PARAMETERS,
    ("values", "scales"),
    check_hadamard_quant_fp8_args,
    run,
    DOCS,
    output_shapes,
    kernel=HADAMARD_QUANT_FP8,
    check_head_dim=check_rotation_head_dim,
    example=example,
)
