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
from .cases import Case, check_cases
from .op_check_parts import Backend
from .op_checks import OP_CHECKS
from .variants import OP_SPECS

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


def backend_for(name: str) -> Backend:
    """The op module a check runs, with NumPy arrays as they are or copied to the device."""
    if name != "cupy":
        return Backend({"emulate": emulate, "reference": reference}[name], lambda array: array, np.asarray)
    import kpool_cupy

    from ..backends.cupy_arrays import import_cupy

    cupy = import_cupy()  # a clear error when CuPy is missing

    def device(array: np.ndarray) -> Any:
        # A block of a fused buffer's rows and columns stays a strided view on the device too.
        base = array.base if isinstance(array.base, np.ndarray) and array.base.ndim == 2 else None
        if base is None or array.flags.c_contiguous or array.strides != base.strides:
            return cupy.asarray(array)
        row, column = divmod(array.ctypes.data - base.ctypes.data, base.strides[0])
        column //= array.itemsize
        return cupy.asarray(base)[row : row + array.shape[0], column : column + array.shape[1]]

    return Backend(kpool_cupy, device, cupy.asnumpy, on_gpu=True)


@dataclass
class CaseResult:
    name: str
    requests: int
    tokens: int
    pools: int  # the rows compared: pools, or what the op's unit says (ring rows, ids, rows)
    mismatches: int  # elements that had to be equal bit for bit and were not
    # Against the float64 reference (tools/accuracy.py); None for an op that pools nothing.
    max_abs_err: float | None
    max_ulp_err: float | None
    max_allowed_abs: float | None  # the largest per-element bound
    worst_error_over_bound: float | None  # max of error / bound; at most 1 when the case passes
    # Elements whose NaN or infinity the float64 answer does not match (the errors above leave them out).
    special_mismatches: int
    status: str  # "pass", "FAIL", or "skipped" when the case compares nothing

    @property
    def ok(self) -> bool:
        return self.status != "FAIL"


def check_case(backend: Backend, case: Case, kpool: int, op: str, rng: np.random.Generator) -> CaseResult:
    """One case of ``op`` on one backend (see tools/op_checks.py for what is compared)."""
    check = OP_CHECKS[op]
    verdict = check.run(backend, case, kpool, rng)
    accuracy = verdict.accuracy or {}
    return CaseResult(
        name=case.name_for(check.reads),
        requests=case.requests,
        tokens=case.tokens,
        pools=verdict.rows,
        mismatches=verdict.mismatches,
        max_abs_err=accuracy.get("max_abs_err"),
        max_ulp_err=accuracy.get("max_ulp_err"),
        max_allowed_abs=accuracy.get("max_allowed_abs"),
        worst_error_over_bound=accuracy.get("worst_error_over_bound"),
        special_mismatches=int(accuracy.get("special_mismatches", 0)),
        # nothing compared is no pass to claim
        status="FAIL" if not verdict.ok else ("pass" if verdict.rows else "skipped"),
    )


def check_settings(op: str, head_dim: int, kpool: int, names: tuple[str, str] = ("head_dim", "kpool")) -> None:
    """The op's own rules for the check's ``head_dim`` and ``kpool``, before any case (a check never runs a
    setting other than the one it reports); a ValueError naming ``names[0]`` or ``names[1]``."""
    if op not in OP_CHECKS:
        raise ValueError(f"Invalid op: expected one of {', '.join(OP_CHECKS)}, got {op!r}")
    if op.startswith("ring_close") and kpool < 2:
        raise ValueError(
            f"Invalid {names[1]}: expected at least 2 for {op} (at kpool 1 no pool is left pending), got {kpool}"
        )
    head_dim_rule = OP_SPECS[op].check_head_dim
    if head_dim_rule is not None and "head_dim" in OP_CHECKS[op].takes:
        head_dim_rule(names[0], head_dim)


def run_check(
    backend: str,
    dtype: np.dtype,
    head_dim: int,
    kpool: int,
    seed: int,
    progress: Callable[[list[Case]], contextlib.AbstractContextManager[Iterable[Case]]] = contextlib.nullcontext,
    op: str = "compress",
) -> list[CaseResult]:
    """Every check case of ``op`` on ``backend``; ``progress`` wraps the cases (a progress bar, or nothing)."""
    check_settings(op, head_dim, kpool)
    chosen = backend_for(backend)
    rng = np.random.default_rng([seed, 1])  # the ring noise, selected ids and round_scale choices
    with progress(check_cases(head_dim, kpool, dtype, seed)) as cases:
        return [check_case(chosen, case, kpool, op, rng) for case in cases]
