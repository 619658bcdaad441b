"""`kpool-cupy check`: run one backend over the check cases and compare it with the float64 reference."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import emulate, reference
from ..backends.cupy import gpu_status
from ..pool_offsets import pool_row_offsets
from .accuracy import compare
from .cases import SENTINEL, Case, check_cases

BACKENDS = ("auto", "cupy", "emulate", "reference")


def pick_backend(name: str) -> str:
    if name != "auto":
        return name
    if gpu_status()[0]:
        return "cupy"
    if shutil.which(os.environ.get("CXX", "c++")):
        return "emulate"
    return "reference"


def _run_cupy(case: Case) -> np.ndarray:
    import kpool_cupy

    from ..backends.cupy_arrays import import_cupy

    cupy = import_cupy()  # a clear error when CuPy is missing

    def device(array: np.ndarray) -> Any:
        # A column slice of a fused buffer stays a strided view on the device too.
        base = array.base if isinstance(array.base, np.ndarray) and array.base.ndim == 2 else None
        if base is None or array.flags.c_contiguous:
            return cupy.asarray(array)
        start = (array.ctypes.data - base.ctypes.data) // array.itemsize
        return cupy.asarray(base)[:, start : start + array.shape[1]]

    extra = {name: device(value) for name, value in case.extra.items()}
    result = kpool_cupy.kpool_compress(
        device(case.k),
        device(case.gate),
        device(case.ape),
        device(case.input_row_offsets),
        device(case.cache_lengths),
        **extra,
    )
    return cupy.asnumpy(result)


def runner(backend: str) -> Callable[[Case], np.ndarray]:
    if backend == "cupy":
        return _run_cupy
    module = {"emulate": emulate, "reference": reference}[backend]

    def run(case: Case) -> np.ndarray:
        extra = {name: value.copy() if name == "out" else value for name, value in case.extra.items()}
        return module.kpool_compress(case.k, case.gate, case.ape, case.input_row_offsets, case.cache_lengths, **extra)

    return run


@dataclass
class CaseResult:
    name: str
    requests: int
    tokens: int
    pools: int
    max_abs_err: float
    max_ulp_err: float
    ok: bool


def run_check(backend: str, dtype: np.dtype, head_dim: int, kpool: int, seed: int) -> list[CaseResult]:
    run = runner(backend)
    results = []
    for case in check_cases(head_dim, kpool, dtype, seed):
        pools = int(pool_row_offsets(case.input_row_offsets, case.cache_lengths, kpool)[-1])
        got = run(case)
        # float64 arithmetic, rounded once to the dtype the backend wrote.
        want = reference.kpool_compress(
            case.k,
            case.gate,
            case.ape,
            case.input_row_offsets,
            case.cache_lengths,
            out=np.empty((pools, head_dim), dtype=got.dtype),
            accumulate="float64",
        )
        out_dtype = got.dtype
        max_key = float(np.abs(case.k.astype(np.float32)).max(initial=0.0))
        verdict = compare(got[:pools], want.astype(np.float64), out_dtype, kpool, max_key)
        surplus_kept = bool(np.all(got[pools:].astype(np.float32) == SENTINEL))
        shape_ok = got.shape[1] == head_dim and (got.shape[0] == pools or "out" in case.extra)
        results.append(
            CaseResult(
                name=case.name,
                requests=case.requests,
                tokens=case.tokens,
                pools=pools,
                max_abs_err=verdict["max_abs_err"],
                max_ulp_err=verdict["max_ulp_err"],
                ok=bool(verdict["ok"]) and surplus_kept and shape_ok,
            )
        )
    return results
