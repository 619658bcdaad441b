"""The GPU path's Python, end to end on the CPU, through the NumPy-backed CuPy double.

tests/cupy_double/ stands in for CuPy and launches every kernel on the
emulator, so device placement, stream handling, validation, the call flow,
argument building and the benchmark's orchestration all run here. It proves
nothing about CUDA itself (see tests/cupy_double/README.md); no number the
double prints is a GPU figure.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from double import run_on_double

# Guards against a hang, ten times a normal run or more (runs measured on two busy cores, -n 0, 2026-12-03):
GPU_TESTS_TIMEOUT_S = 1200  # the gpu-marked tests on the double: 11 s, 113 s building every kernel (a cold cache)
CHECK_TIMEOUT_S = 120  # kpool-cupy check --backend cupy: 1.8 to 8.9 s
BENCH_TIMEOUT_S = 600  # the sweep with a broken alternative, its short records left out: 10 s (2026-12-06)
STREAM_TESTS_TIMEOUT_S = 60  # test_gpu.py's 7 stream and graph tests with a plugin: 3.2 to 4.4 s


@pytest.mark.slow
def test_gpu_marked_tests_pass_on_the_double():
    done = run_on_double(
        ["-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests",
         "--ignore=tests/test_gpu_path_on_cpu.py"], timeout=GPU_TESTS_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout


@pytest.mark.slow
def test_check_on_the_cupy_backend_passes_on_the_double():
    done = run_on_double(
        ["-m", "kpool_cupy", "check", "--backend", "cupy", "--json", "--dtype", "float16"], timeout=CHECK_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["backend"] == "cupy" and report["ok"]


# A pytest plugin for the runs below: the GPU path ignores every stream= it is
# given, as a package that launched on the current stream would.
_IGNORE_STREAM = """
def pytest_configure(config):
    import kpool_cupy

    namespace = kpool_cupy.kpool_compress.__globals__  # the bound copy's own (ops/framework/binding.bind)
    call = namespace["call_backend"]

    def ignoring(arrays, options, backend_options):
        return call(arrays, options, {**backend_options, "stream": None})

    namespace["call_backend"] = ignoring
"""

# The double's capture runs what it records as well, as a capture that launched eagerly would.
_EAGER_CAPTURE = """
def pytest_configure(config):
    from cupy import cuda

    enqueue = cuda._enqueue

    def eager(stream, work, name=None):
        fate = enqueue(stream, work, name)
        if fate == "captured":
            cuda._run(work)
        return fate

    cuda._enqueue = eager
"""


def _stream_and_graph_tests(tmp_path: Path, plugin: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "broken_on_purpose.py").write_text(plugin)
    return run_on_double(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "broken_on_purpose", "tests/test_gpu.py",
         "-k", "explicit_streams or graph"], timeout=STREAM_TESTS_TIMEOUT_S, extra_path=(tmp_path,),
    )  # fmt: skip


@pytest.mark.slow
def test_the_stream_and_graph_tests_fail_when_the_call_ignores_its_stream(tmp_path):
    # The tests of tests/test_gpu.py must be able to fail on the double: with
    # the stream ignored, every explicit-stream case (3 kinds x full path and
    # plan) and the graph capture fail, each for the reason it checks.
    done = _stream_and_graph_tests(tmp_path, _IGNORE_STREAM)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "7 failed" in done.stdout and " passed" not in done.stdout, done.stdout[-3000:]
    assert done.stdout.count("out was written before its stream ran") >= 6
    assert "the captured call ran eagerly" in done.stdout


@pytest.mark.slow
def test_the_graph_test_fails_when_the_capture_runs_eagerly(tmp_path):
    done = _stream_and_graph_tests(tmp_path, _EAGER_CAPTURE)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "1 failed, 6 passed" in done.stdout, done.stdout[-3000:]
    assert "the captured call ran eagerly" in done.stdout


_BROKEN_ALTERNATIVE = """
import json, sys
from kpool_cupy.bench import impls
from kpool_cupy.cli import main

def broken(shape, sets):
    raise RuntimeError("this alternative is broken")

# First, so every other implementation is measured after it failed. The
# sweep's shapes only: the implementations are the sweep's, and the short
# records never call them.
others = dict(impls.IMPLEMENTATIONS)
impls.IMPLEMENTATIONS.clear()
impls.IMPLEMENTATIONS.update({"broken": broken, **others})
try:
    main(["bench", "--quick", "--samples", "1", "--min-calls", "1", "--skip", "upstream-geometry",
          "--no-decode-side", "--no-fp8", "--no-index", "--no-select", "--no-backward", "--json", sys.argv[1]])
except SystemExit as done:
    assert not done.code, done.code
"""


@pytest.mark.slow
def test_a_failing_alternative_is_recorded_and_the_sweep_goes_on(tmp_path):
    out = tmp_path / "bench.json"
    done = run_on_double(["-c", _BROKEN_ALTERNATIVE, str(out)], timeout=BENCH_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(out.read_text())
    for shape in results["shapes"]:
        assert shape["implementations"]["broken"] == {"failed": "RuntimeError: this alternative is broken"}
        assert shape["implementations"]["kpool-cupy"]["median_ms"] > 0  # measured after the failure
    assert "FAILED: RuntimeError: this alternative is broken" in done.stdout
