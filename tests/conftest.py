"""Shared fixtures; tests marked `gpu` skip where CuPy has no usable device; tests that use torch are marked
`torch` (scripts/torch_versions.sh runs them on other torch releases)."""

from __future__ import annotations

import functools
import inspect
import os
import re
import types
from pathlib import Path

import pytest

from kpool_cupy.backends.cupy import gpu_status

# An import of torch: `pytest.importorskip("torch")`, `import torch`, kpool_cupy's torch modules.
_TORCH_IMPORT = (
    r"""(importorskip\(\s*["']torch["']|import torch\b|import kpool_cupy\.(torch|compat)\b"""
    r"|from kpool_cupy(\.compat)? import (torch|deep_gemm)\b|from kpool_cupy\.(torch|compat)\b)"
)
_IMPORTS_TORCH = re.compile(r"^\s*(torch = )?(pytest\.)?" + _TORCH_IMPORT, re.MULTILINE)
_IMPORTS_TORCH_AT_THE_TOP = re.compile(r"^(torch = )?(pytest\.)?" + _TORCH_IMPORT, re.MULTILINE)


def _torch_module_name(name: str) -> bool:
    """torch's modules, and kpool_cupy's that bind it."""
    return name.split(".")[0] == "torch" or name.startswith(("kpool_cupy.torch", "kpool_cupy.compat"))


def _torch_module(value: object) -> bool:
    return isinstance(value, types.ModuleType) and _torch_module_name(value.__name__)


@functools.cache
def _module_uses_torch(path: str) -> bool:
    """A test file about torch (its name says so: test_torch_*, test_bench_torch, whose helpers import it) or
    one that imports torch at its top (a bare `pytest.importorskip("torch")` binds no name)."""
    return "torch" in os.path.basename(path) or bool(_IMPORTS_TORCH_AT_THE_TOP.search(Path(path).read_text()))


def _from_torch(value: object) -> bool:
    """A parameter that is torch's or kpool_cupy's torch modules' (a function of kpool_cupy.torch, say)."""
    module = getattr(value, "__module__", None)
    return isinstance(module, str) and _torch_module_name(module)


def _imports_torch(function: object) -> bool:
    try:
        return bool(_IMPORTS_TORCH.search(inspect.getsource(function)))
    except (OSError, TypeError):  # a builtin or a function without a file
        return False


def uses_torch(item: pytest.Item) -> bool:
    """Whether a test uses torch: its module is about torch, holds torch (or kpool_cupy's torch modules) or
    imports it at the top; the test imports it itself, or calls a function of its module that does; or a
    parameter of it comes from torch's modules or kpool_cupy's."""
    module = getattr(item, "module", None)
    if module is not None and any(_torch_module(v) for v in vars(module).values()):
        return True
    path = getattr(module, "__file__", None)
    if path is not None and _module_uses_torch(path):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and any(_from_torch(value) for value in callspec.params.values()):
        return True
    function = getattr(item, "function", None)
    return function is not None and _calls_torch(function, module, set())


def _calls_torch(function: types.FunctionType, module: object, seen: set[str]) -> bool:
    """Whether ``function`` imports torch, or calls a function of its test module that does (at any depth)."""
    if _imports_torch(function):
        return True
    seen.add(function.__name__)
    for name in function.__code__.co_names:
        helper = getattr(module, name, None)
        if callable(helper) and hasattr(helper, "__wrapped__"):  # functools.cache's, say
            helper = inspect.unwrap(helper)
        mine = inspect.isfunction(helper) and helper.__module__ == getattr(module, "__name__", None)
        if mine and name not in seen and _calls_torch(helper, module, seen):
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if uses_torch(item):
            item.add_marker(pytest.mark.torch)
    usable, why = gpu_status()
    if usable:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA device: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def sass_tools() -> None:
    """Skip a test that reads SASS where NVRTC (CuPy's bindings), ptxas or nvdisasm is missing."""
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="NVRTC comes with the cuda12 extra")
    from kpool_cupy.tools import sass

    try:
        sass.find_tool("ptxas")
        sass.find_tool("nvdisasm")
    except RuntimeError as error:
        pytest.skip(str(error))


@pytest.fixture(params=["e4m3", "hmma", "wgmma"])
def emulated_scorer_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test of the scorer's kernels on the emulated mma.sync path (sm_89 and newer), again on sm_90's (f16
    mma.sync on converted e4m3) and on the wgmma path of an sm_90a build (KPOOL_CUPY_EMULATE_MMA)."""
    from kpool_cupy.backends.host import EMULATE_MMA_VARIABLE

    monkeypatch.setenv(EMULATE_MMA_VARIABLE, request.param)
    return str(request.param)
