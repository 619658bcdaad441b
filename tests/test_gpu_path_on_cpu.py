"""The GPU path's Python, end to end on the CPU, through the NumPy-backed CuPy double.

tests/cupy_double/ stands in for CuPy and launches every kernel on the
emulator, so device placement, stream handling, validation, the call flow,
argument building and the benchmark's orchestration all run here. It proves
nothing about CUDA itself (see tests/cupy_double/README.md); no number the
double prints is a GPU figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOUBLE = ROOT / "tests" / "cupy_double"


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(DOUBLE), str(ROOT)])}
    return subprocess.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_gpu_marked_tests_pass_on_the_double():
    done = _run(
        "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests", "--ignore=tests/test_gpu_path_on_cpu.py"
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout


@pytest.mark.slow
def test_check_on_the_cupy_backend_passes_on_the_double():
    done = _run("-m", "kpool_cupy", "check", "--backend", "cupy", "--json", "--dtype", "float16")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["backend"] == "cupy" and report["ok"]


@pytest.mark.slow
def test_bench_runs_end_to_end_on_the_double(tmp_path):
    out = tmp_path / "bench.json"
    done = _run("-m", "kpool_cupy", "bench", "--quick", "--samples", "1", "--json", str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(out.read_text())
    assert results["environment"]["gpu"] == "NumPy double"
    for shape in results["shapes"]:
        implementations = shape["implementations"]
        assert implementations["kpool-cupy"]["median_ms"] > 0
        # The upstream-geometry kernel pools with the same helper: the same bits.
        assert implementations["upstream-geometry"]["max_abs_diff_vs_kpool_cupy"] == 0.0
    assert {r["name"].split()[0] for r in results["lifecycle"]} == {"tail-update", "expand-topk"}
    assert results["host"]["graph_replay_us"] > 0
    assert results["complete"] is True
    for record in [*results["shapes"], *results["lifecycle"]]:
        # Issue 10: a copy of N bytes reads N and writes N; the roof moves the
        # kernel's bytes, so it copies half of them.
        copy = record["copy"]
        assert copy["bytes_moved"] == 2 * copy["bytes_copied"] and abs(copy["bytes_moved"] - record["bytes"]) <= 1


_BROKEN_ALTERNATIVE = """
import json, sys
from kpool_cupy.bench import impls
from kpool_cupy.cli import main

def broken(shape, sets):
    raise RuntimeError("this alternative is broken")

# First, so every other implementation is measured after it failed.
others = dict(impls.IMPLEMENTATIONS)
impls.IMPLEMENTATIONS.clear()
impls.IMPLEMENTATIONS.update({"broken": broken, **others})
try:
    main(["bench", "--quick", "--samples", "1", "--skip", "upstream-geometry", "--json", sys.argv[1]])
except SystemExit as done:
    assert not done.code, done.code
"""


@pytest.mark.slow
def test_a_failing_alternative_is_recorded_and_the_sweep_goes_on(tmp_path):
    out = tmp_path / "bench.json"
    done = _run("-c", _BROKEN_ALTERNATIVE, str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(out.read_text())
    for shape in results["shapes"]:
        assert shape["implementations"]["broken"] == {"failed": "RuntimeError: this alternative is broken"}
        assert shape["implementations"]["kpool-cupy"]["median_ms"] > 0  # measured after the failure
    assert "FAILED: RuntimeError: this alternative is broken" in done.stdout
