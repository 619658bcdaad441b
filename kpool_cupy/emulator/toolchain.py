"""The host compiler and the on-disk cache of emulated kernel builds.

Each instantiation is built once into a per-user cache folder
(``$XDG_CACHE_HOME`` or ``~/.cache``, then ``kpool-cupy/emulate``).
``KPOOL_CUPY_EMULATE_CXXFLAGS`` is appended to the compile flags and is part
of the cache key, so a test can build with ``-fsanitize=address``. A build's
text is kernels/emulator/kpool_emulator.h (the host's CUDA built-ins, fibers
and grid launch), then the kernel text NVRTC would get, then the C entry points.
With GCC the first part is read precompiled (``_precompiled_header``).
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

from ..cache_dirs import cache_folder, make_cache_dir
from ..kernel.sources import kernel_source

FLAGS_VARIABLE = "KPOOL_CUPY_EMULATE_CXXFLAGS"
BASE_FLAGS = ("-std=c++17", "-O2", "-shared", "-fPIC", "-Wno-unknown-pragmas")
# After the user's flags, so none of them can turn contraction back on: the
# kernels spell out the fused multiply-adds they mean (fmaf), like NVRTC
# built with --fmad=false.
LAST_FLAGS = ("-ffp-contract=off",)
ENTRY = "kpool_emulate_launch"
SIZES = "kpool_emulate_param_sizes"
COOPERATED = "kpool_emulate_cooperated"
BARRIERS = "kpool_emulate_barriers"
WGMMAS = "kpool_emulate_wgmmas"
# The host's CUDA built-ins, fibers and grid launch (under kernels/). It opens
# every host build, so kpool_portability.h finds it defined and NVRTC's text
# never holds it.
EMULATOR_HEADER = "emulator/kpool_emulator.h"


class CompilerNotFoundError(RuntimeError):
    """No host C++ compiler for the emulator."""


# Flags that change what the kernels compute (finite-math drops the NaN
# policy) or link crtfastmath, which sets flush-to-zero for the whole process.
REFUSED_FLAGS = ("-ffast-math", "-Ofast", "-ffinite-math-only", "-funsafe-math-optimizations")


def user_flags() -> list[str]:
    """``KPOOL_CUPY_EMULATE_CXXFLAGS``, split like a shell would, refusing flags that change the numerics."""
    flags = shlex.split(os.environ.get(FLAGS_VARIABLE, ""))
    refused = [f for f in flags if f in REFUSED_FLAGS]
    if refused:
        raise ValueError(
            f"Invalid {FLAGS_VARIABLE}: expected flags that keep IEEE float semantics, got {' '.join(refused)} "
            "(the emulator must compute what the GPU computes)"
        )
    return flags


def cache_dir() -> Path:
    return cache_folder("emulate")


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


def _shim(code: str, kernel_name: str) -> str:
    # The emulator's headers, the whole kernel text, and five C entry points:
    # run the grid with a block's dynamic shared memory (returning its 16-byte
    # access count), report the parameters' sizes, say whether this host
    # thread's last launch ran as fibers, how many block-wide barriers its
    # blocks passed and how many wgmma its warpgroups issued. The cache key
    # hashes this text, the emulator's headers included.
    return (
        kernel_source(EMULATOR_HEADER)
        + code
        + f'\nextern "C" unsigned long long {ENTRY}(unsigned int grid, unsigned int block, '
        + "unsigned long long shared_bytes, void** args) {\n"
        + f"    return kp_emulate_launch(&{kernel_name}, dim3{{grid, 1, 1}}, dim3{{block, 1, 1}}, args, "
        + "shared_bytes);\n}\n"
        + f'extern "C" int {SIZES}(unsigned long long* sizes, int capacity) {{\n'
        + f"    return kp_param_sizes(&{kernel_name}, sizes, capacity);\n}}\n"
        + f'extern "C" int {COOPERATED}() {{ return kp_launch_cooperated; }}\n'
        + f'extern "C" unsigned long long {BARRIERS}() {{ return kp_barriers_passed; }}\n'
        + f'extern "C" unsigned long long {WGMMAS}() {{ return kp_wgmmas_issued; }}\n'
    )


def _cache_key(text: str, cxx: str, flags: list[str]) -> str:
    # A cached file's name: the text it is built from, the compiler and its version, the flags.
    return hashlib.sha256("\0".join([text, cxx, _compiler_identity(cxx), *flags]).encode()).hexdigest()[:32]


_build_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}


def load_code(code: str, kernel_name: str) -> ctypes.CDLL:
    """Build (once, cached on disk) and load kernel ``kernel_name`` of the kernel text ``code``.

    ``code`` is what NVRTC would compile (``kernel_source``'s output, or that
    plus a test's kernel); the build puts kernels/emulator/kpool_emulator.h
    before it.

    Threads of one process share one build and one loaded library; processes
    building the same variant at once each write a private file and rename it
    into place, so none sees a half-written library.
    """
    cxx = compiler()
    flags = [*BASE_FLAGS, *user_flags(), *LAST_FLAGS]
    text = _shim(code, kernel_name)
    key = _cache_key(text, cxx, flags)
    library = _loaded.get(key)  # a library is entered whole, last: a hit waits for no other thread's build
    if library is not None:
        return library
    with _build_lock:
        if key in _loaded:
            return _loaded[key]
        target = cache_dir() / f"{key}.so"
        if not target.is_file():
            _build(cxx, flags, text, target)
        library = ctypes.CDLL(str(target))
        entry = (ctypes.c_uint, ctypes.c_uint, ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_void_p))
        getattr(library, ENTRY).argtypes = entry  # grid, block, dynamic shared bytes, the arguments
        getattr(library, ENTRY).restype = ctypes.c_ulonglong
        getattr(library, SIZES).argtypes = (ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_int)
        getattr(library, SIZES).restype = ctypes.c_int
        getattr(library, COOPERATED).argtypes = ()
        getattr(library, COOPERATED).restype = ctypes.c_int
        for counter in (BARRIERS, WGMMAS):
            getattr(library, counter).argtypes = ()
            getattr(library, counter).restype = ctypes.c_ulonglong
        _loaded[key] = library
        return library


def load_variant(source_file: str, kernel_name: str) -> ctypes.CDLL:
    """Build (once, cached on disk) and load the emulated kernel ``kernel_name`` of kernels/``source_file``."""
    return load_code(kernel_source(source_file), kernel_name)


def _compile(cxx: str, arguments: list[str]) -> subprocess.CompletedProcess[str]:
    # In the process's environment without LD_PRELOAD: a sanitizer runtime
    # preloaded into Python (the AddressSanitizer runs) would otherwise load
    # into every compiler process, which then takes about twice as long.
    environment = {name: value for name, value in os.environ.items() if name != "LD_PRELOAD"}
    return subprocess.run([cxx, *arguments], capture_output=True, text=True, check=False, env=environment)


def _private(target: Path) -> Path:
    return target.parent / f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp"


def _precompiled_header(cxx: str, flags: list[str]) -> Path | None:
    """The emulator's headers, precompiled once per compiler and flags into the cache; the header's path.

    Every build opens with the same 90 KB of emulator headers, about half of
    a small kernel's compile. GCC reads them precompiled when the source
    includes the returned header first and compiles with the same flags (its
    ``.gch`` beside it). None where the compiler is not GCC, or the
    precompile fails: the build then puts the text in the source, as before.
    The library built is the same either way.
    """
    if "Free Software Foundation" not in _compiler_identity(cxx):
        return None
    text = kernel_source(EMULATOR_HEADER)
    header = cache_dir() / f"emulator-{_cache_key(text, cxx, flags)}.h"
    compiled = header.with_name(header.name + ".gch")
    if '"' in str(header) or "\n" in str(header):
        return None  # not a path an #include line can quote
    if compiled.is_file():
        return header
    make_cache_dir(header.parent)
    private_text = _private(header)
    private_text.write_text(text)
    os.replace(private_text, header)  # the header before its .gch: a .gch found has its header beside it
    private = _private(compiled)
    done = _compile(cxx, [*flags, "-x", "c++-header", "-o", str(private), str(header)])
    if done.returncode != 0:
        private.unlink(missing_ok=True)
        return None
    os.replace(private, compiled)
    return header


def _build(cxx: str, flags: list[str], text: str, target: Path) -> None:
    make_cache_dir(target.parent)
    opening = kernel_source(EMULATOR_HEADER)
    header = _precompiled_header(cxx, flags) if text.startswith(opening) else None
    if header is not None:
        text = f'#include "{header}"\n' + text[len(opening) :]
    with tempfile.TemporaryDirectory(prefix="kpool-emulate-") as work:
        source = Path(work) / "kernel.cpp"
        source.write_text(text)
        private = _private(target)
        done = _compile(cxx, [*flags, "-o", str(private), str(source)])
        if done.returncode != 0:
            private.unlink(missing_ok=True)
            raise RuntimeError(
                f"kpool_cupy.emulate: {cxx} failed to build the emulated kernel "
                f"(flags {' '.join(flags)}):\n{done.stderr}"
            )
        os.replace(private, target)
