"""Facts about this machine for `kpool-cupy info`: every probe reports its failure instead of raising."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..emulator.toolchain import cache_dir, compiler
from ..kernel.nvrtc import cubin_cache_dir
from ..kernel.sources import kernels_dir


def _probe(fact: Callable[[], str]) -> str:
    try:
        return fact()
    except Exception as error:  # info must never crash: the failure is the fact
        return f"unavailable ({type(error).__name__}: {error})"


def _package_version() -> str:
    from importlib.metadata import version

    return version("kpool-cupy")


def _ml_dtypes() -> str:
    import ml_dtypes

    return ml_dtypes.__version__


def _cupy() -> str:
    import cupy

    return cupy.__version__


def _cuda_runtime() -> str:
    import cupy

    version = cupy.cuda.runtime.runtimeGetVersion()
    return f"{version // 1000}.{version % 1000 // 10}"


def _gpus() -> str:
    import cupy

    from ..backends.cupy import gpu_status

    usable, why = gpu_status()
    if not usable:
        return why
    count = cupy.cuda.runtime.getDeviceCount()
    described = []
    for device in range(count):
        properties = cupy.cuda.runtime.getDeviceProperties(device)
        name = properties["name"].decode() if isinstance(properties["name"], bytes) else properties["name"]
        memory = properties["totalGlobalMem"] / 2**30
        described.append(
            f"{device}: {name}, compute capability {properties['major']}.{properties['minor']}, {memory:.1f} GiB"
        )
    return "; ".join(described) if described else "none (CUDA reports no device)"


def _nvrtc() -> str:
    from cupy_backends.cuda.libs import nvrtc

    major, minor = nvrtc.getVersion()
    return f"{major}.{minor}"


def _host_compiler() -> str:
    path = compiler()
    first_line = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    return f"{path} ({first_line[0] if first_line else 'version unknown'})"


def _cupy_cache() -> str:
    return os.environ.get("CUPY_CACHE_DIR") or str(Path("~/.cupy/kernel_cache").expanduser())


def machine_facts() -> list[tuple[str, str]]:
    return [
        ("kpool-cupy", _probe(_package_version)),
        ("numpy", np.__version__),
        ("ml_dtypes", _probe(_ml_dtypes)),
        ("cupy", _probe(_cupy)),
        ("CUDA runtime (CuPy)", _probe(_cuda_runtime)),
        ("GPU", _probe(_gpus)),
        ("NVRTC", _probe(_nvrtc)),
        ("host C++ compiler (emulator)", _probe(_host_compiler)),
        ("nvidia-smi", shutil.which("nvidia-smi") or "not on PATH"),
        ("kernel sources", _probe(lambda: str(kernels_dir()))),
        ("emulator cache", str(cache_dir())),
        ("sm_90a cubin cache", str(cubin_cache_dir())),
        ("CuPy kernel cache", _cupy_cache()),
    ]
