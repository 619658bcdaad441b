"""hadamard_quant_fp8, described once: the query side of the FP8 epilogue (rotate, scale, e4m3fn bytes)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import ELEMENT_CTYPES, FLOAT32
from ..kernel import codes
from ..kernel.geometry import group_geometry
from ..kernel.names import HADAMARD_SOURCE, hadamard_quant_kernel_name
from .checks import check_no_overlap, check_rows, fail
from .fp8_target import ROUND_SCALE, SCALES_OUT, UINT8, VALUES_OUT, check_rotation_head_dim, check_target
from .spec import VALIDATE, Backend, Launch, Operand, OpSpec, OutputShape


@dataclass(frozen=True)
class HadamardQuantCall:
    rows: int
    head_dim: int
    dtype: np.dtype
    round_scale: bool


def check_hadamard_quant_args(x: Any, out: Any, out_scale: Any, round_scale: Any) -> HadamardQuantCall:
    check_rows("x", x, tuple(ELEMENT_CTYPES))
    rows, head_dim = (int(n) for n in x.shape)
    check_rotation_head_dim("x", head_dim)
    check_target(head_dim, out=out, out_scale=out_scale)
    if out is not None and out.shape[0] != rows:
        raise fail("out", f"shape [{rows}, {head_dim}] (x's rows)", f"shape {tuple(out.shape)}")
    return HadamardQuantCall(rows, head_dim, np.dtype(x.dtype), bool(round_scale))


def output_shapes(call: HadamardQuantCall) -> dict[str, OutputShape]:
    return {"out": ((call.rows, call.head_dim), UINT8), "out_scale": ((call.rows,), FLOAT32)}


def hadamard_quant_launch(call: HadamardQuantCall, operands: dict[str, Any]) -> Launch:
    """The launch of ``kpool_hadamard_quant``, arguments in kernels/kpool_hadamard_quant.cu's order."""
    o = operands
    arguments = (
        *codes.rows(o["x"]),
        np.int64(call.rows),
        *codes.rows(o["out"]),
        o["out_scale"],
        np.int32(call.round_scale),
    )
    vector = codes.vector_mask(k=o["x"])
    if codes.allows_8byte_rows(o["out"]):
        vector |= codes.VectorAccess.OUT  # 8-byte stores of a row's bytes
    name = hadamard_quant_kernel_name(call.dtype, call.head_dim, vector)
    return Launch(
        "kpool_hadamard_quant", HADAMARD_SOURCE, name, group_geometry(call.head_dim, call.rows), arguments, call, o
    )


def run(backend: Backend, arrays: tuple[Any, ...], *, round_scale: Any, validate: bool) -> Any:
    """Check, allocate, launch; ``validate`` has no contents to check here (no index arrays)."""
    x, out, out_scale = arrays
    call = check_hadamard_quant_args(x, out, out_scale, round_scale)
    check_no_overlap(PARAMETERS, arrays)
    if out is None:
        shapes = output_shapes(call)
        out, out_scale = backend.empty(*shapes["out"]), backend.empty(*shapes["out_scale"])
    if call.rows:
        backend.launch(hadamard_quant_launch(call, {"x": x, "out": out, "out_scale": out_scale}))
    return out, out_scale


GPU_DOC = """Rotate and quantize query rows to FP8 with the epilogue of :func:`kpool_compress_fp8`.

    y = bf16(B(x) * fl32(1/sqrt(D)))         B: Walsh-Hadamard butterflies, strides 1 .. D/2
    s = the smallest power of two >= fl32(max(max_c |y_c|, 1e-4) * fl32(1/448))   (round_scale=True)
    q = e4m3fn(clamp(fl32(y / s), -448, 448))

The rotation is orthonormal and the keys of an FP8 cache get the same one,
so scores keep their values (to the quantization). ``x`` is taken as it is
(converted to float32 exactly; no bfloat16 rounding first, unlike a pooled
key).

Parameters
----------
x
    ``[rows, head_dim]`` bfloat16, float16 or float32 (e.g. queries as
    ``[tokens * heads, head_dim]``), last dim contiguous; head_dim a power of
    two from 8 to 256.
round_scale
    Round each scale up to a power of two (ue8m0), exactly (default).
out, out_scale
    uint8 ``[rows, head_dim]`` and float32 ``[rows]``, given together; new
    ones otherwise.
validate
    Accepted for symmetry with the other ops; there are no contents to check.
stream
    As :func:`kpool_compress`.

Returns
-------
tuple of cupy.ndarray
    ``(values, scales)``: e4m3fn bit patterns and one scale per row.
"""

EMULATE_DOC = """:func:`kpool_cupy.hadamard_quant_fp8`, running the CUDA kernel on the CPU (host arrays)."""
REFERENCE_DOC = """:func:`kpool_cupy.hadamard_quant_fp8` in NumPy (host arrays)."""
DOCS = {"cupy": GPU_DOC, "emulate": EMULATE_DOC, "reference": REFERENCE_DOC}

QUERY = Operand("x", "[rows, head_dim] bfloat16, float16 or float32; last dim contiguous")
PARAMETERS = (QUERY, ROUND_SCALE, VALUES_OUT, SCALES_OUT, VALIDATE)


def describe(arrays: tuple[Any, ...], options: Mapping[str, Any]) -> HadamardQuantCall:
    return check_hadamard_quant_args(*arrays, options["round_scale"])


SPEC = OpSpec("hadamard_quant_fp8", PARAMETERS, ("values", "scales"), run, DOCS, output_shapes, describe)
