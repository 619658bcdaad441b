"""`kpool-cupy check`: run one backend over the check cases and compare it with the float64 reference."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import emulate, reference
from ..backends.cupy import gpu_status
from ..emulator.toolchain import CompilerNotFoundError, compiler
from ..pool_offsets import pool_row_offsets
from .accuracy import compare
from .cases import SENTINEL, Case, check_cases

BACKENDS = ("auto", "cupy", "emulate", "reference")


def pick_backend(name: str) -> tuple[str, str]:
    """The backend to check and why it was chosen.

    ``auto`` takes the GPU when CuPy has a usable device and otherwise the
    emulator, never the reference: checking the reference against itself
    would claim a pass for kernels that never ran. Without a GPU and a host
    compiler it is a RuntimeError saying so.
    """
    usable, why = gpu_status() if name in ("auto", "cupy") else (False, "")
    if name == "cupy" and not usable:
        raise RuntimeError(f"--backend cupy needs a CUDA GPU: {why}")
    if name != "auto":
        return name, "asked for with --backend"
    if usable:
        return "cupy", "CuPy sees a usable CUDA device"
    try:
        cxx = compiler()
    except CompilerNotFoundError as error:
        raise RuntimeError(
            f"nothing runs the kernels here: {why}, and {error}. --backend reference checks only the NumPy reference"
        ) from error
    return "emulate", f"no GPU ({why}); running the CUDA source on the CPU, built by {cxx}"


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
    max_allowed_abs: float  # the largest per-element bound (tools/accuracy.py)
    worst_error_over_bound: float  # max of error / bound; at most 1 when the case passes
    status: str  # "pass", "FAIL", or "skipped" when the case builds no pool

    @property
    def ok(self) -> bool:
        return self.status != "FAIL"


def check_case(run: Callable[[Case], np.ndarray], case: Case, head_dim: int, kpool: int) -> CaseResult:
    """One case on one backend against the float64 reference, rounded once to the dtype the backend wrote."""
    pools = int(pool_row_offsets(case.input_row_offsets, case.cache_lengths, kpool)[-1])
    got = run(case)
    want = reference.kpool_compress(
        case.k,
        case.gate,
        case.ape,
        case.input_row_offsets,
        case.cache_lengths,
        out=np.empty((pools, head_dim), dtype=got.dtype),
        accumulate="float64",
    )
    max_key = float(np.abs(case.k.astype(np.float32)).max(initial=0.0))
    # |gate + ape| over every row and member slot: a bound on each pool's logits.
    max_gate = float(np.abs(case.gate.astype(np.float32)).max(initial=0.0))
    max_logit = max_gate + float(np.abs(case.ape).max(initial=0.0))
    verdict = compare(got[:pools], want.astype(np.float64), got.dtype, kpool, max_key, max_logit)
    surplus_kept = bool(np.all(got[pools:].astype(np.float32) == SENTINEL))
    shape_ok = got.shape[1] == head_dim and (got.shape[0] == pools or "out" in case.extra)
    if not (verdict["ok"] and surplus_kept and shape_ok):
        status = "FAIL"
    else:
        status = "pass" if pools else "skipped"  # nothing was compared: no pass to claim
    return CaseResult(
        name=case.name,
        requests=case.requests,
        tokens=case.tokens,
        pools=pools,
        max_abs_err=verdict["max_abs_err"],
        max_ulp_err=verdict["max_ulp_err"],
        max_allowed_abs=verdict["max_allowed_abs"],
        worst_error_over_bound=verdict["worst_error_over_bound"],
        status=status,
    )


def run_check(
    backend: str,
    dtype: np.dtype,
    head_dim: int,
    kpool: int,
    seed: int,
    progress: Callable[[list[Case]], contextlib.AbstractContextManager[Iterable[Case]]] = contextlib.nullcontext,
) -> list[CaseResult]:
    """Every check case on ``backend``; ``progress`` wraps the cases (a progress bar, or nothing)."""
    run = runner(backend)
    with progress(check_cases(head_dim, kpool, dtype, seed)) as cases:
        return [check_case(run, case, head_dim, kpool) for case in cases]
