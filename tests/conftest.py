"""Shared fixtures; tests marked `gpu` skip where CuPy has no usable device."""

from __future__ import annotations

import pytest

from kpool_cupy.backends.cupy import gpu_status


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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


@pytest.fixture(params=["e4m3", "wgmma"])
def emulated_scorer_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test of the scorer's kernels on the emulated mma.sync path (sm_89 and newer) and again on the wgmma
    path of an sm_90a build (KPOOL_CUPY_EMULATE_MMA)."""
    from kpool_cupy.backends.host import EMULATE_MMA_VARIABLE

    monkeypatch.setenv(EMULATE_MMA_VARIABLE, request.param)
    return str(request.param)
