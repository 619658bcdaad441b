"""kpool_compress on the CPU, running the CUDA source itself.

    pooled[p, c] = sum_m softmax_m(gate[member m, c] + ape[m, c]) * k[member m, c]

kernels/kpool_compress.cu is compiled by the host C++ compiler (``CXX``,
default ``c++``) with kernels/kpool_portability.h standing in for the CUDA
built-ins, then launched over the grid and block geometry the GPU launcher
computes, one thread after another. What this checks is the kernel's index
math, bounds checks and arithmetic, not the GPU's timing: ``expf`` and FMA
contraction differ from the device by an ulp or so, so compare with a
tolerance.

Each variant is built once into a per-user cache folder (``$XDG_CACHE_HOME``
or ``~/.cache``, then ``kpool-cupy/emulate``). ``KPOOL_CUPY_EMULATE_CXXFLAGS``
is appended to the compile flags and is part of the cache key, so a test can
build with ``-fsanitize=address``.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ._arrays import HostArrays
from ._driver import run_compress
from ._geometry import launch_geometry
from ._launch import compress_arguments
from ._sources import kernel_source
from ._validate import CompressCall, check_host_arrays
from ._variants import COMPRESS_SOURCE, compress_kernel_name

FLAGS_VARIABLE = "KPOOL_CUPY_EMULATE_CXXFLAGS"
BASE_FLAGS = ("-std=c++17", "-O2", "-shared", "-fPIC", "-Wno-unknown-pragmas")
_ENTRY = "kpool_emulate_launch"
_SIZES = "kpool_emulate_param_sizes"


class CompilerNotFoundError(RuntimeError):
    """No host C++ compiler for the emulator."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kpool-cupy" / "emulate"


def compiler() -> str:
    """Path of the host C++ compiler, or a clear error naming ``CXX``."""
    name = os.environ.get("CXX", "c++")
    path = shutil.which(name)
    if path is None:
        raise CompilerNotFoundError(
            f"kpool_cupy.emulate needs a host C++ compiler: {name!r} (from CXX, default 'c++') was not found "
            "on PATH; install g++ or clang++, or set CXX, or use kpool_cupy.reference"
        )
    return path


@functools.cache
def _compiler_identity(path: str) -> str:
    done = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    return done.stdout


def _shim(source_file: str, kernel_name: str) -> str:
    # The whole kernel text plus two C entry points: run the grid, and report
    # the parameters' sizes.
    return (
        kernel_source(source_file)
        + f'\nextern "C" void {_ENTRY}(unsigned int grid, unsigned int block, void** args) {{\n'
        + f"    kp_emulate_launch(&{kernel_name}, dim3{{grid, 1, 1}}, dim3{{block, 1, 1}}, args);\n}}\n"
        + f'extern "C" int {_SIZES}(unsigned long long* sizes, int capacity) {{\n'
        + f"    return kp_param_sizes(&{kernel_name}, sizes, capacity);\n}}\n"
    )


_build_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}


def load_variant(source_file: str, kernel_name: str) -> ctypes.CDLL:
    """Build (once, cached on disk) and load the emulated kernel ``kernel_name``.

    Threads of one process share one build and one loaded library; processes
    building the same variant at once each write a private file and rename it
    into place, so none sees a half-written library.
    """
    cxx = compiler()
    flags = [*BASE_FLAGS, *shlex.split(os.environ.get(FLAGS_VARIABLE, ""))]
    text = _shim(source_file, kernel_name)
    key = hashlib.sha256("\0".join([text, cxx, _compiler_identity(cxx), *flags]).encode()).hexdigest()[:32]
    with _build_lock:
        if key in _loaded:
            return _loaded[key]
        target = cache_dir() / f"{key}.so"
        if not target.is_file():
            _build(cxx, flags, text, target)
        library = ctypes.CDLL(str(target))
        getattr(library, _ENTRY).argtypes = (ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p))
        getattr(library, _ENTRY).restype = None
        getattr(library, _SIZES).argtypes = (ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_int)
        getattr(library, _SIZES).restype = ctypes.c_int
        _loaded[key] = library
        return library


def _build(cxx: str, flags: list[str], text: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kpool-emulate-") as work:
        source = Path(work) / "kernel.cpp"
        source.write_text(text)
        private = target.parent / f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp"
        done = subprocess.run(
            [cxx, *flags, "-o", str(private), str(source)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            private.unlink(missing_ok=True)
            raise RuntimeError(
                f"kpool_cupy.emulate: {cxx} failed to build the emulated kernel "
                f"(flags {' '.join(flags)}):\n{done.stderr}"
            )
        os.replace(private, target)


def _c_value(value: Any) -> ctypes._SimpleCData:
    if isinstance(value, np.ndarray):
        return ctypes.c_void_p(value.ctypes.data)
    if isinstance(value, np.int64):
        return ctypes.c_longlong(int(value))
    if isinstance(value, np.int32):
        return ctypes.c_int(int(value))
    raise TypeError(f"no C type for a kernel argument of type {type(value).__name__}")


def _check_widths(library: ctypes.CDLL, kernel_name: str, values: list[ctypes._SimpleCData]) -> None:
    """Refuse arguments whose count or byte widths differ from the kernel's parameters.

    Passing an int64 where the kernel takes an int works on the emulator and
    shifts every later argument on a GPU: this makes the emulator fail first.
    """
    sizes = (ctypes.c_ulonglong * 64)()
    count = getattr(library, _SIZES)(sizes, 64)
    if count != len(values):
        raise TypeError(f"{kernel_name} takes {count} arguments, got {len(values)}")
    for i, value in enumerate(values):
        if sizes[i] != ctypes.sizeof(value):
            raise TypeError(
                f"{kernel_name} argument {i}: the parameter is {sizes[i]} bytes, got {ctypes.sizeof(value)} "
                f"({type(value).__name__})"
            )


def launch(source_file: str, kernel_name: str, grid: int, block: int, args: tuple[Any, ...]) -> None:
    """Run ``kernel_name`` over ``grid`` x ``block`` threads with CUDA-style arguments."""
    library = load_variant(source_file, kernel_name)
    values = [_c_value(a) for a in args]  # kept alive until the call returns
    _check_widths(library, kernel_name, values)
    pointers = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
    getattr(library, _ENTRY)(grid, block, pointers)


class _EmulatedBackend(HostArrays):
    def pool(self, call: CompressCall, slots: int, arrays: tuple[Any, ...], out: np.ndarray) -> None:
        name = compress_kernel_name(call.k_dtype, call.gate_dtype, call.out_dtype, call.head_dim, call.kpool)
        geometry = launch_geometry(call.head_dim, slots)
        launch(COMPRESS_SOURCE, name, geometry.grid, geometry.block, compress_arguments(call, *arrays, out))


def kpool_compress(
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    pool_row_offsets: np.ndarray | None = None,
    out: np.ndarray | None = None,
    validate: bool = True,
) -> np.ndarray:
    """Pool each complete k-pool of a ragged batch by running the CUDA kernel on the CPU.

    Same arguments and result as :func:`kpool_cupy.kpool_compress`, on host
    arrays (bfloat16 as ``ml_dtypes.bfloat16``).

    Raises
    ------
    CompilerNotFoundError
        When no host C++ compiler is found.
    """
    check_host_arrays(
        "emulate",
        k=k,
        gate=gate,
        ape=ape,
        input_row_offsets=input_row_offsets,
        cache_lengths=cache_lengths,
        pool_row_offsets=pool_row_offsets,
        out=out,
    )
    return run_compress(
        _EmulatedBackend(), k, gate, ape, input_row_offsets, cache_lengths, pool_row_offsets, out, validate
    )


# The lifecycle functions run kernels/kpool_ring.cu and kernels/kpool_expand.cu the same way.
from ._emulate_ring import kpool_expand_topk, kpool_ring_close, kpool_seed_tail, kpool_tail_update  # noqa: E402

__all__ = [
    "CompilerNotFoundError",
    "cache_dir",
    "compiler",
    "kpool_compress",
    "kpool_expand_topk",
    "kpool_ring_close",
    "kpool_seed_tail",
    "kpool_tail_update",
    "launch",
    "load_variant",
]
