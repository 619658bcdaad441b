"""Compile-only access to NVRTC: PTX and ptxas's report for the tools without a GPU, and the cubins of the sm_90a
build, cached on disk (``kernel_cubin``).

The GPU path hands most kernels to CuPy's RawModule, whose own disk cache
keeps the binary. RawModule compiles for the device's plain architecture
(sm_90 on a Hopper GPU) and takes no second one, so a kernel that issues
wgmma (Hopper's arch-specific ISA) is compiled here for sm_90a and cached
under ``cubin_cache_dir()``.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cache_dirs import cache_folder, make_cache_dir
from ..dtypes import element_dtype
from ..pool_offsets import check_kpool
from .declarations import COMPRESS
from .geometry import check_head_dim
from .sources import CUPY_ADDS, NVRTC_OPTIONS, kernel_source

# NVRTC's architectures: sm_NN or compute_NN, with 'a' (arch-specific: sm_90a) or 'f' (family-specific:
# sm_100f) or no suffix. Whether NVRTC knows that number is NVRTC's to say.
_ARCH = re.compile(r"^(?:sm|compute)_(\d+[af]?)$")
ARCH_FORMS = "'sm_NN', 'sm_NNa', 'sm_NNf' or 'compute_NN'"


def check_variant(head_dim: int, kpool: int) -> None:
    check_head_dim("head_dim", head_dim)
    check_kpool(kpool)


def _nvrtc() -> Any:
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as error:
        raise RuntimeError(
            "compiling needs CuPy's NVRTC bindings: install kpool-cupy[cuda12] or kpool-cupy[cuda13]"
        ) from error
    return nvrtc


def require_nvrtc() -> None:
    """A RuntimeError saying which extra to install where CuPy's NVRTC bindings are missing."""
    _nvrtc()


def arch_number(arch: str) -> str:
    match = _ARCH.match(arch)
    if match is None:
        raise ValueError(f"Invalid arch: expected {ARCH_FORMS}, got {arch!r}")
    return match.group(1)


def unknown_arch(arch: str) -> str | None:
    """Why NVRTC cannot build for ``arch`` (a well-formed one), found by compiling an empty kernel for
    ``compute_<number>`` as the PTX reports do (a number NVRTC does not list, or a suffix it has not for that
    number: sm_80a); None where it builds, or where NVRTC is missing (compiling says so then)."""
    try:
        nvrtc = _nvrtc()
    except RuntimeError:
        return None
    program = nvrtc.createProgram('extern "C" __global__ void kpool_arch_probe() {}', "arch_probe.cu", [], [])
    try:
        nvrtc.compileProgram(program, [f"--gpu-architecture=compute_{arch_number(arch)}"])
        return None
    except nvrtc.NVRTCError:  # an empty kernel fails on its architecture alone
        said = nvrtc.getProgramLog(program).strip().splitlines()
    finally:
        nvrtc.destroyProgram(program)
    listed = ", sm_".join(str(n) for n in getattr(nvrtc, "getSupportedArchs", tuple)())
    major, minor = nvrtc_version()
    why = f": {said[0]}" if said else ""
    return (
        f"NVRTC {major}.{minor} cannot build for {arch!r}{why} (it lists sm_{listed}; a and f forms where it has them)"
    )


def compile_kernel(source: str, name: str, options: list[str], output: str) -> tuple[bytes, str]:
    """Compile kernel ``name`` of kernels/``source``; return NVRTC's ``output`` ("ptx" or "cubin") and its log."""
    return compile_code(kernel_source(source), source, name, options, output)


def compile_code(code: str, label: str, name: str, options: list[str], output: str) -> tuple[bytes, str]:
    """Compile kernel ``name`` of the text ``code`` (``label`` names it in NVRTC's messages)."""
    binary, log, _ = compile_lowered(code, label, name, options, output)
    return binary, log


def compile_lowered(code: str, label: str, name: str, options: list[str], output: str) -> tuple[bytes, str, str]:
    """`compile_code`, and the symbol NVRTC gave the name expression ``name`` (its lowered, mangled name: what a
    module loaded from the binary knows the kernel by)."""
    nvrtc = _nvrtc()
    program = nvrtc.createProgram(code, label, [], [])
    try:
        nvrtc.addNameExpression(program, name)
        try:
            nvrtc.compileProgram(program, [*NVRTC_OPTIONS, *CUPY_ADDS, *options])
        except nvrtc.NVRTCError as error:
            raise RuntimeError(f"NVRTC failed to compile {name}:\n{nvrtc.getProgramLog(program)}") from error
        binary = nvrtc.getPTX(program) if output == "ptx" else nvrtc.getCUBIN(program)
        return binary, nvrtc.getProgramLog(program), nvrtc.getLoweredName(program, name)
    finally:
        nvrtc.destroyProgram(program)


def nvrtc_version() -> tuple[int, int]:
    """NVRTC's (major, minor): part of a cached cubin's key, since another NVRTC may build other code."""
    return tuple(_nvrtc().getVersion())


def cubin_cache_dir() -> Path:
    """Where ``kernel_cubin`` keeps the cubins it built: ``$XDG_CACHE_HOME`` (or ``~/.cache``), then
    ``kpool-cupy/cubin``, beside the emulator's ``kpool-cupy/emulate``. Deleting it costs a recompile only."""
    return cache_folder("cubin")


@dataclass(frozen=True)
class CachedCubin:
    """A cubin in the cache and the symbol its kernel has there."""

    path: Path
    lowered_name: str


def kernel_cubin(source: str, name: str, arch: str) -> CachedCubin:
    """The cubin of kernel ``name`` of kernels/``source`` for ``arch`` ('sm_90a'), built once per machine."""
    return cached_cubin(kernel_source(source), source, name, arch)


def cached_cubin(code: str, label: str, name: str, arch: str) -> CachedCubin:
    """The cubin NVRTC builds of kernel ``name`` of the text ``code`` for the real architecture ``arch``, with the
    package's NVRTC options and what CuPy adds (``compile_code``), and its lowered name; built once, then read
    from ``cubin_cache_dir()``.

    The key hashes the text, ``label``, ``name``, the options and NVRTC's
    version: an edited header changes the text (``kernel_source`` inlines
    it), so a stale cubin is never found. The lowered name is kept beside the
    cubin (``<key>.name``), since a cache hit has no NVRTC program to ask.
    Each file is written to a private temporary file in the folder and
    renamed into place, the name before the cubin, so another process finds
    either nothing or both whole; processes that build one key at once write
    the same bytes.
    """
    options = [f"--gpu-architecture=sm_{arch_number(arch)}"]
    version = ".".join(map(str, nvrtc_version()))
    parts = [code, label, name, *NVRTC_OPTIONS, *CUPY_ADDS, *options, f"nvrtc {version}"]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
    folder = cubin_cache_dir()
    cubin, lowered = folder / f"{key}.cubin", folder / f"{key}.name"
    if cubin.is_file() and lowered.is_file():  # the name is renamed into place first
        return CachedCubin(cubin, lowered.read_text())
    binary, _, lowered_name = compile_lowered(code, label, name, options, "cubin")
    make_cache_dir(folder)
    _write_atomically(lowered, lowered_name.encode())
    _write_atomically(cubin, binary)
    return CachedCubin(cubin, lowered_name)


def _write_atomically(target: Path, data: bytes) -> None:
    """``data`` at ``target`` through a private file in the same folder and one rename: readers see the old file
    or the whole new one."""
    handle, private = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(private, target)
    except BaseException:
        Path(private).unlink(missing_ok=True)
        raise


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
