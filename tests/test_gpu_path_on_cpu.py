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
BENCH_TIMEOUT_S = 600  # bench --quick --samples 1: 36 to 51 s; the sweep with a broken alternative: 30 to 34 s
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


@pytest.mark.slow
def test_bench_runs_end_to_end_on_the_double(tmp_path):
    out = tmp_path / "bench.json"
    done = run_on_double(
        # --min-calls 1: the double runs every call on the emulator; rounds of 32 would take minutes here.
        ["-m", "kpool_cupy", "bench", "--quick", "--samples", "1", "--min-calls", "1", "--json", str(out)],
        timeout=BENCH_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(out.read_text())
    assert results["environment"]["gpu"] == "NumPy double"
    for shape in results["shapes"]:
        implementations = shape["implementations"]
        assert implementations["kpool-cupy"]["median_ms"] > 0
        # The upstream-geometry kernel pools with the same helper: the same bits.
        assert implementations["upstream-geometry"]["max_abs_diff_vs_kpool_cupy"] == 0.0
    assert {r["name"].split()[0] for r in results["lifecycle"]} == {"tail-update", "expand-topk"}
    lifecycle = {r["name"]: r for r in results["lifecycle"]}
    assert {"tail-update decode-512x2-ring8", "expand-topk 512x512 paged-64"} <= set(lifecycle)
    for name, record in lifecycle.items():
        difference = record["implementations"]["cupy-composite"]["max_abs_diff_vs_kpool_cupy"]
        if name.startswith("expand-topk"):
            assert difference == 0.0, name  # positions and cache slots: integers, equal
        else:  # pooled bfloat16 rows: a rounding apart at most (exp and a division against exp2 and a reciprocal)
            assert difference < 0.1, (name, difference)
    assert results["complete"] is True
    for record in [*results["shapes"], *results["lifecycle"]]:
        # Issue 10: a copy of N bytes reads N and writes N; the roof moves the
        # kernel's bytes, so it copies half of them.
        copy = record["copy"]
        assert copy["bytes_moved"] == 2 * copy["bytes_copied"] and abs(copy["bytes_moved"] - record["bytes"]) <= 1
        # Three L2 sizes of rotation for every shape, the double's L2 read from its device attributes.
        rotated = record["rotation"]
        assert rotated["over_l2"] >= 3 and rotated["capped"] is None, (record["name"], rotated)
        assert rotated["l2_bytes"] == 2**20 and rotated["l2_source"] == "device attribute L2CacheSize"
        assert rotated["sets"] == record["input_sets"] and rotated["bytes"] == rotated["sets"] * record["bytes"]
        # kpool-cupy and the copy replay a captured round: the capture saw no sync and no array operation.
        assert copy["timing"] == "graph"
        implementations = record["implementations"]
        assert implementations["kpool-cupy"]["timing"] == "graph", implementations["kpool-cupy"]
        assert implementations["kpool-cupy"]["time_over_kpool_cupy"] == 1.0
        # The composite cannot be captured on the double (it runs NumPy at once): its method is recorded, with why.
        composite = implementations["cupy-composite"]
        assert composite["timing"] == "events-around-python" and "capture failed" in composite["timing_note"]
        for entry in implementations.values():
            if "median_ms" in entry:
                assert entry["timing"] in ("graph", "events-around-python")
                assert entry["time_over_kpool_cupy"] == entry["median_ms"] / implementations["kpool-cupy"]["median_ms"]
                assert entry["fraction_of_copy"] > 0
    for shape in results["shapes"]:
        assert shape["implementations"]["upstream-geometry"]["timing"] == "graph"
    host = results["host"]
    assert host["shape"] == "decode-512x4"
    assert host["call_us_validate_on"] > 0 and host["call_us_validate_off"] > 0 and host["graph_replay_us"] > 0
    # The bare launch is built from the package's plan and writes the package's bits.
    assert host["bare_launch_matches"] is True and host["bare_launch_us"] > 0
    assert host["overhead_over_bare_us"] == host["call_us_validate_off"] - host["bare_launch_us"]
    assert "x kpool" in done.stdout and "rotation: 2 input sets" in done.stdout
    assert "bare CuPy launch of the same kernel and arguments" in done.stdout
    # torch has no CUDA device on the double: the torch op's row and host cost
    # give the reason the other torch rows give, and the run goes on.
    why = results["shapes"][0]["implementations"]["torch-eager"]["skipped"]
    assert why in ("torch has no CUDA device", "torch is not installed")
    assert all(s["implementations"]["torch.ops.kpool"] == {"skipped": why} for s in results["shapes"])
    assert host["torch_op"] == why and "call_us_torch_op" not in host
    # The decode step's ops, each with the host record's keys; each hot call served by a plan, so a bare launch.
    step = {r["op"]: r for r in host["decode_step"]}
    assert set(step) == {"tail_update_fp8", "hadamard_quant_fp8", "index_select_fp8", "index_logits_fp8 + index_topk"}
    for record in step.values():
        assert record["call_us_validate_on"] > 0 and record["call_us_validate_off"] > 0 and record["bare_launch_us"] > 0
        assert record["overhead_over_bare_us"] == record["call_us_validate_off"] - record["bare_launch_us"]
        assert record["torch_op"] == why
    assert "host per op of a decode step" in done.stdout
    assert f"  through torch.ops.kpool.compress.out: {why}" in done.stdout


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
