"""Compile-only access to NVRTC, for reading the kernel's memory path off its PTX without a GPU."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..dtypes import element_dtype
from ..pool_offsets import check_kpool
from .declarations import COMPRESS
from .geometry import MAX_HEAD_DIM
from .sources import CUPY_ADDS, NVRTC_OPTIONS, kernel_source

_ARCH = re.compile(r"^(?:sm|compute)_(\d+[a-z]?)$")


def check_variant(head_dim: int, kpool: int) -> None:
    if (
        isinstance(head_dim, bool)
        or not isinstance(head_dim, int)
        or head_dim <= 0
        or head_dim % 8
        or head_dim > MAX_HEAD_DIM
    ):
        raise ValueError(f"Invalid head_dim: expected a positive multiple of 8 up to {MAX_HEAD_DIM}, got {head_dim!r}")
    check_kpool(kpool)


def _nvrtc() -> Any:
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as error:
        raise RuntimeError(
            "compiling needs CuPy's NVRTC bindings: install kpool-cupy[cuda12] or kpool-cupy[cuda13]"
        ) from error
    return nvrtc


def arch_number(arch: str) -> str:
    match = _ARCH.match(arch)
    if match is None:
        raise ValueError(f"Invalid arch: expected 'sm_NN' or 'compute_NN', got {arch!r}")
    return match.group(1)


def compile_kernel(source: str, name: str, options: list[str], output: str) -> tuple[bytes, str]:
    """Compile kernel ``name`` of kernels/``source``; return NVRTC's ``output`` ("ptx" or "cubin") and its log."""
    return compile_code(kernel_source(source), source, name, options, output)


def compile_code(code: str, label: str, name: str, options: list[str], output: str) -> tuple[bytes, str]:
    """Compile kernel ``name`` of the text ``code`` (``label`` names it in NVRTC's messages)."""
    nvrtc = _nvrtc()
    program = nvrtc.createProgram(code, label, [], [])
    try:
        nvrtc.addNameExpression(program, name)
        try:
            nvrtc.compileProgram(program, [*NVRTC_OPTIONS, *CUPY_ADDS, *options])
        except nvrtc.NVRTCError as error:
            raise RuntimeError(f"NVRTC failed to compile {name}:\n{nvrtc.getProgramLog(program)}") from error
        binary = nvrtc.getPTX(program) if output == "ptx" else nvrtc.getCUBIN(program)
        return binary, nvrtc.getProgramLog(program)
    finally:
        nvrtc.destroyProgram(program)


def compress_instance(head_dim: int, kpool: int, dtype: str) -> str:
    """The kpool_compress variant the tools look at: k, gate and output of ``dtype``, every operand aligned,
    int32 offsets."""
    check_variant(head_dim, kpool)
    element = element_dtype(dtype)
    return COMPRESS.instance(KT=element, GT=element, OT=element, HEAD_DIM=head_dim, KPOOL=kpool)


def _compile(head_dim: int, kpool: int, dtype: str, options: list[str], output: str) -> tuple[bytes, str]:
    """Compile the kpool_compress variant with k, gate and output of ``dtype``."""
    return compile_kernel(COMPRESS.source, compress_instance(head_dim, kpool, dtype), options, output)


def compile_ptx(head_dim: int, kpool: int, dtype: str = "bfloat16", *, arch: str = "sm_90") -> str:
    """PTX of the kpool_compress variant with k, gate and output of ``dtype``.

    Needs NVRTC (the ``nvidia-cuda-nvrtc`` wheel or a CUDA toolkit) and CuPy's
    NVRTC bindings, but no GPU and no driver.

    Raises
    ------
    TypeError, ValueError
        A ``head_dim``, ``kpool``, ``dtype`` or ``arch`` outside what the
        kernels take, named in the message.
    RuntimeError
        NVRTC is missing or fails to compile, with its log.
    """
    ptx, _ = _compile(head_dim, kpool, dtype, [f"--gpu-architecture=compute_{arch_number(arch)}"], "ptx")
    return ptx.decode()


def kernel_ptx(source: str, name: str, arch: str) -> str:
    """PTX of any kernel instantiation ``name`` of kernels/``source``, for ``arch`` ('sm_NN' or 'compute_NN').

    PTX is for the virtual architecture: 'sm_90' and 'compute_90' give the same text.
    """
    ptx, _ = compile_kernel(source, name, [f"--gpu-architecture=compute_{arch_number(arch)}"], "ptx")
    return ptx.decode()


def code_ptx(code: str, name: str, arch: str = "sm_90") -> str:
    """PTX of kernel ``name`` of a kernel text (kernel_source's output plus more: a test's kernel)."""
    ptx, _ = compile_code(code, "kernel.cu", name, [f"--gpu-architecture=compute_{arch_number(arch)}"], "ptx")
    return ptx.decode()


@dataclass(frozen=True)
class PtxasReport:
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    shared_bytes: int = 0  # static shared memory a block (ptxas prints none for a kernel without)


def ptxas_report(head_dim: int, kpool: int, dtype: str = "bfloat16", *, arch: str = "sm_90") -> PtxasReport:
    """Registers, spills and stack of the kpool_compress variant as ptxas (inside NVRTC) builds it; no GPU needed."""
    return kernel_ptxas_report(COMPRESS.source, compress_instance(head_dim, kpool, dtype), arch)


def kernel_ptxas_report(source: str, name: str, arch: str = "sm_90") -> PtxasReport:
    """Registers, spills and stack of any kernel instantiation of kernels/``source`` for ``arch``."""
    _, log = compile_kernel(source, name, [f"--gpu-architecture=sm_{arch_number(arch)}", "-Xptxas=-v"], "cubin")
    return parse_ptxas_log(log)


def code_ptxas_report(code: str, name: str, arch: str = "sm_90") -> PtxasReport:
    """Registers, spills and stack of kernel ``name`` of a kernel text, for ``arch``."""
    options = [f"--gpu-architecture=sm_{arch_number(arch)}", "-Xptxas=-v"]
    _, log = compile_code(code, "kernel.cu", name, options, "cubin")
    return parse_ptxas_log(log)


def parse_ptxas_log(log: str) -> PtxasReport:
    """Registers, spills, stack frame and static shared memory from what ``ptxas -v`` prints (inside NVRTC or on
    its own)."""
    numbers = {}
    for key, pattern in (
        ("registers", r"Used (\d+) registers"),
        ("spill_stores", r"(\d+) bytes spill stores"),
        ("spill_loads", r"(\d+) bytes spill loads"),
        ("stack_bytes", r"(\d+) bytes stack frame"),
    ):
        found = re.search(pattern, log)
        if found is None:
            raise RuntimeError(f"ptxas report without {key!r}:\n{log}")
        numbers[key] = int(found.group(1))
    shared = re.search(r"(\d+) bytes smem", log)
    return PtxasReport(**numbers, shared_bytes=int(shared.group(1)) if shared else 0)
