"""Compile-only access to NVRTC, for reading the kernel's memory path off its PTX without a GPU."""

from __future__ import annotations

import re

from ._dtypes import element_dtype
from ._sources import kernel_source
from ._variants import COMPRESS_SOURCE, compress_kernel_name

# Options shared by compile_ptx and the GPU path's RawModule (CuPy adds -arch).
NVRTC_OPTIONS = ("-std=c++17",)

_ARCH = re.compile(r"^(?:sm|compute)_(\d+[a-z]?)$")


def check_variant(head_dim: int, kpool: int) -> None:
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 8:
        raise ValueError(f"Invalid head_dim: expected a positive multiple of 8, got {head_dim!r}")
    if isinstance(kpool, bool) or not isinstance(kpool, int) or kpool < 1:
        raise ValueError(f"Invalid kpool: expected an integer >= 1, got {kpool!r}")


def compile_ptx(head_dim: int, kpool: int, dtype: str = "bfloat16", *, arch: str = "sm_90") -> str:
    """PTX of the kpool_compress variant with k, gate and output of ``dtype``.

    Needs NVRTC (the ``nvidia-cuda-nvrtc`` wheel or a CUDA toolkit) and CuPy's
    NVRTC bindings, but no GPU and no driver.
    """
    check_variant(head_dim, kpool)
    element = element_dtype(dtype)
    match = _ARCH.match(arch)
    if match is None:
        raise ValueError(f"Invalid arch: expected 'sm_NN' or 'compute_NN', got {arch!r}")
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as error:
        raise RuntimeError(
            "compile_ptx needs CuPy's NVRTC bindings: install kpool-cupy[cuda12] or kpool-cupy[cuda13]"
        ) from error
    name = compress_kernel_name(element, element, element, head_dim, kpool)
    program = nvrtc.createProgram(kernel_source(COMPRESS_SOURCE), COMPRESS_SOURCE, [], [])
    try:
        nvrtc.addNameExpression(program, name)
        try:
            nvrtc.compileProgram(program, [*NVRTC_OPTIONS, f"--gpu-architecture=compute_{match.group(1)}"])
        except nvrtc.NVRTCError as error:
            raise RuntimeError(f"NVRTC failed to compile {name}:\n{nvrtc.getProgramLog(program)}") from error
        return nvrtc.getPTX(program).decode()
    finally:
        nvrtc.destroyProgram(program)
