"""scripts/gpu_check.sh keeps its budgets: at most 8 files back from the GPU machine, 6 minutes of step limits,
every kernel variant compiled by its first step.

The script's own text is checked, then the script is run: with a stand-in
``python`` that fails every step at once, and in full (``--smoke``) through
tests/cupy_double with a stand-in compute-sanitizer that only runs its
program, recording every kernel it launches. Nothing here is timed; the
limits are read, not waited for (the CPU is no GPU: a step's time here says
nothing about its time there), and the precompile's limit is held against
the NVRTC times scripts/gpu_variants.json records.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_variants  # noqa: E402

SCRIPT = ROOT / "scripts" / "gpu_check.sh"
DOUBLE = ROOT / "tests" / "cupy_double"
BUDGET_S = 360  # 6 of the 15 minutes a lent GPU session holds, machine start included
MAX_FILES = 8  # what the machine brings back from $OUT
FILES = {"summary.txt", "bench.json", "bench.png", "bench-compile.json", "logs.tar.gz"}
STEPS = ["environment", "precompile", "pytest-gpu", "check", "memcheck", "bench", "bench-compile"]
LOGS = {f"{step}.log" for step in STEPS}
GPU_JOBS = 16  # the lent machine's cores: gpu_precompile.py's processes there
# The precompile's limit over the NVRTC makespan estimated from the times measured here, at least. On the H200
# machine (2026-12-04, CUDA 13's NVRTC, 16 processes) the step took 8.7 s and 7.4 s against an estimate of
# 8.9 s: the estimate holds there, and 2.5 times it leaves room for a slower machine or compiler.
PRECOMPILE_MARGIN = 2.5
STARTUP_S = 5  # a process's CuPy import and CUDA context, counted once per process in the estimate
FAKE_SANITIZER = gpu_variants.FAKE_SANITIZER


def _limits(text: str) -> tuple[dict[str, int], int, list[str]]:
    block = re.search(r"declare -A limit=\((.*?)\n\)", text, re.S)
    assert block, "no limit table in the script"
    limits = {name: int(value) for name, value in re.findall(r"\[([\w-]+)\]=(\d+)", block.group(1))}
    kill_after = int(re.search(r"^kill_after=(\d+)$", text, re.M).group(1))
    steps = re.search(r"^steps=\((.*?)\)$", text, re.M).group(1).split()
    return limits, kill_after, steps


def test_the_step_limits_add_up_to_six_minutes_at_most():
    limits, kill_after, steps = _limits(SCRIPT.read_text())
    assert steps == STEPS and set(limits) == set(steps)
    # timeout may wait kill_after past a limit before it kills: counted per step.
    assert sum(limits.values()) + kill_after * len(steps) <= BUDGET_S, limits
    # torch.compile's cold start has a step and a limit of its own: it took 41 s and 24 s on the H200.
    assert limits["bench-compile"] >= 50


def test_the_precompile_step_comes_before_every_kernel_launch_and_fits_its_limit():
    limits, _, steps = _limits(SCRIPT.read_text())
    # Only the environment step (versions, no kernel) runs before it.
    assert steps[:2] == ["environment", "precompile"]
    variants = json.loads(gpu_variants.MANIFEST.read_text())["variants"]
    seconds = [v["nvrtc_s"] for v in variants]
    assert len(seconds) == len(variants) > 0, "a variant without its NVRTC time: run scripts/gpu_variants.py time"
    makespan = gpu_variants.parallel_seconds(seconds, GPU_JOBS) + STARTUP_S
    assert limits["precompile"] >= PRECOMPILE_MARGIN * makespan, (limits["precompile"], makespan)


def test_the_limits_comment_quotes_the_manifests_measurements():
    # The comment where the limits are set says what was measured; it must be the manifest's numbers.
    text = SCRIPT.read_text()
    data = json.loads(gpu_variants.MANIFEST.read_text())
    seconds = [v["nvrtc_s"] for v in data["variants"]]
    assert f"for the {len(seconds)} variants" in " ".join(text.replace("#", " ").split())
    assert f"{sum(seconds):.1f} s one after another" in " ".join(text.replace("#", " ").split())
    assert f"processes (scripts/gpu_variants.py estimate) {gpu_variants.parallel_seconds(seconds, GPU_JOBS):.1f} s" in (
        " ".join(text.replace("#", " ").split())
    )


def test_every_manifest_variant_names_a_kernel_of_its_source():
    from kpool_cupy.kernel import declarations
    from kpool_cupy.kernel.declarations import Kernel

    kernels = {k.name: k.source for k in vars(declarations).values() if isinstance(k, Kernel)}
    for variant in json.loads(gpu_variants.MANIFEST.read_text())["variants"]:
        name = variant["instance"].split("<", 1)[0]
        if variant["source"] == "inline":
            assert name == "kpool_bench_empty", variant
        else:
            assert kernels.get(name) == variant["source"], variant


def test_the_script_writes_only_named_files_into_out():
    # Every write into $out names its file: no name built from a variable, so
    # the count cannot grow with the steps.
    text = SCRIPT.read_text()
    names = set(re.findall(r'\$out/([^"\s]*)', text))
    assert names, "the script writes nothing into $out?"
    assert all(re.fullmatch(r"[\w.-]+", name) for name in names), names
    assert len(names) <= MAX_FILES and names <= FILES | {"logs.tar.gz.tmp"}, names
    for step in STEPS:  # the logs go to the tarball, not into $out
        assert f'"$out/{step}.log"' not in text


def _run_script(tmp_path: Path, env: dict[str, str], *args: str, timeout: int) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "out"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    sanitizer = bin_dir / "compute-sanitizer"
    sanitizer.write_text(FAKE_SANITIZER)
    sanitizer.chmod(0o755)
    env = {**os.environ, "OUT": str(out), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **env}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def _log_names(path: Path) -> set[str]:
    with tarfile.open(path) as tar:
        return {Path(member.name).name for member in tar.getmembers() if member.isfile()}


def _log_text(path: Path, name: str) -> str:
    with tarfile.open(path) as tar:
        (member,) = [m for m in tar.getmembers() if m.isfile() and Path(m.name).name == name]
        return tar.extractfile(member).read().decode()


def _step_rows(summary: str) -> dict[str, list[str]]:
    """The summary's step table: name, exit, limit, seconds, last line (split in words)."""
    lines = summary.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["step", "exit", "limit"])
    end = next(i for i, line in enumerate(lines) if line.startswith("limits with kill-after"))
    return {line.split()[0]: line.split() for line in lines[start + 1 : end]}


def test_a_run_where_every_step_fails_still_brings_back_its_summary_and_logs(tmp_path):
    # A python that fails at once: every step fails, none hangs, the exit
    # status says so, and $out holds the summary and the logs, nothing more.
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'no python here' >&2\nexit 9\n")
    fake.chmod(0o755)
    done = _run_script(tmp_path, {"PYTHON": str(fake)}, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} == {"summary.txt", "logs.tar.gz"}
    rows = _step_rows((out / "summary.txt").read_text())
    assert set(rows) == set(STEPS)
    assert all(rows[step][1] != "0" for step in STEPS if step != "environment"), rows
    assert _log_names(out / "logs.tar.gz") == LOGS


def test_the_script_rejects_an_unknown_argument(tmp_path):
    done = _run_script(tmp_path, {}, "--fast", timeout=30)
    assert done.returncode == 2 and "usage" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_smoke_run_on_the_double_passes_within_the_file_budget(tmp_path):
    # The whole script, every step, through the CuPy double: real commands,
    # the quick benchmark, 8 garbage calls per family; every kernel it
    # launches recorded. A guard against a hang: about 5 minutes on a quiet
    # machine; the smoke run's own step limits are ten times the GPU run's.
    launched, done = gpu_variants.smoke_launches(tmp_path, timeout=3600)
    out = tmp_path / "out"
    summary = (out / "summary.txt").read_text()
    assert done.returncode == 0, summary + done.stderr[-2000:]
    entries = {p.name for p in out.iterdir()}
    assert entries == FILES and len(entries) <= MAX_FILES
    rows = _step_rows(summary)
    assert list(rows) == STEPS and all(rows[step][1] == "0" for step in STEPS), rows
    assert sum(int(rows[step][2]) for step in STEPS) + 2 * len(STEPS) <= BUDGET_S
    assert _log_names(out / "logs.tar.gz") == LOGS | {"bench-table.txt"}
    # Every kernel a step launched was compiled by the first step.
    manifest = {(v["source"], v["instance"]) for v in json.loads(gpu_variants.MANIFEST.read_text())["variants"]}
    assert launched, "the double recorded no launch"
    assert launched <= manifest, sorted(launched - manifest)
    assert re.search(rf"precompiled {len(manifest)} of {len(manifest)} kernel variants", summary), summary
    # What the summary folds in: the environment, the checks, the sanitizer's driver, the tables.
    assert "cupy: 0.0+numpy-double" in summary
    # compress on three dtypes, the eleven other ops on bfloat16, the backward on two
    assert summary.count(": ok true") == 16
    assert "tail_update_fp8 bfloat16, head_dim 128, kpool 4: ok true" in summary
    assert "index_logits_fp8 head_dim 128, kpool 4: ok true" in summary  # the scorer takes no dtype
    assert "index_select_fp8 head_dim 128, kpool 4: ok true" in summary
    assert "expand_topk kpool 4: ok true" in summary and "hadamard_quant_fp8 bfloat16, head_dim 128: ok true" in summary
    assert "check cases: 39 (13 families x 3 index dtypes), all right: True" in summary
    assert "garbage calls per op: kpool_compress 8" in summary
    # The sanitizer's driver made strided views on the device, not contiguous copies.
    assert int(re.search(r"strided device views: (\d+)", summary).group(1)) > 0
    assert summary.count("x kpool: median time over") == 2  # the sweep's table and the torch.compile run's
    assert "passed" in " ".join(rows["pytest-gpu"][4:])  # pytest's last line
    sweep = json.loads((out / "bench.json").read_text())
    assert sweep["complete"] is True and sweep["lifecycle"]
    # The benchmark's records and printed table, as `kpool-cupy bench --quick` on its own makes them.
    _assert_the_quick_benchmark(sweep, _log_text(out / "logs.tar.gz", "bench.log"))
    # The records the GPU run adds: the launch floor, the FP8 decode step and its hot call's host cost.
    assert sweep["empty_kernel"]["calls_per_replay"] >= 32 and "call_us" in sweep["host_fp8_decode"]
    tail = [r["name"] for r in sweep["fp8"] if r["name"].startswith("tail-update-fp8")]
    assert tail == [f"tail-update-fp8 decode-{r}x{n}" for r in (64, 512) for n in (1, 4)], tail
    assert all("time_over_empty_kernel" in r["implementations"]["kpool-cupy"] for r in sweep["lifecycle"])
    # The torch.compile run: this package against torch.compile alone, no decode side.
    cold = json.loads((out / "bench-compile.json").read_text())
    assert cold["complete"] is True and cold["lifecycle"] == []
    assert {name for shape in cold["shapes"] for name in shape["implementations"]} == {"kpool-cupy", "torch-compile"}


def _assert_the_quick_benchmark(results: dict, stdout: str) -> None:
    """The quick benchmark's records and table on the double (the smoke run's bench step)."""
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
    assert "x kpool" in stdout and "rotation: 2 input sets" in stdout
    assert "bare CuPy launch of the same kernel and arguments" in stdout
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
    assert "host per op of a decode step" in stdout
    assert f"  through torch.ops.kpool.compress.out: {why}" in stdout


@pytest.mark.slow
def test_the_full_sweep_launches_only_precompiled_variants(tmp_path):
    # The GPU run's benchmark is the full sweep, not the smoke run's quick
    # one: its shapes, each call made once or four times (the timing loops
    # cut), on the double. A guard against a hang: about 2 minutes here.
    launched = gpu_variants.sweep_launches(tmp_path, timeout=1800)
    manifest = {(v["source"], v["instance"]) for v in json.loads(gpu_variants.MANIFEST.read_text())["variants"]}
    assert launched and launched <= manifest, sorted(launched - manifest)


@pytest.mark.parametrize(
    ("rows", "timed"),
    [
        (['{"case": "a", "path": "sm_90a", "bits23": {"ok": false}, "ok": true}', "index check: all rows ok"], True),
        (['{"case": "a", "path": "sm_90a", "ok": false}', "index check: FAILED a on sm_90a"], False),
        (['{"case": "a", "path": "sm_90", "ok": false}', '{"case": "a", "path": "sm_90a", "ok": true}'], False),
        (['{"case": "a", "path": "sm_90", "ok": true}', "index check: all rows ok"], False),
        ([], False),
    ],
    ids=["passed", "an-sm90a-row-failed", "no-verdict", "no-sm90a-row", "not-run"],
)
def test_the_bench_times_the_sm90a_build_only_after_its_index_check_passed(tmp_path, rows, timed):
    # The gate between the check step and the bench: every sm_90a row's own "ok" true (a nested bound's false
    # does not count) and the check's verdict printed (a crash before it is not a pass).
    text = SCRIPT.read_text()
    start = text.index('index_rows="$logs.index-rows"')
    gate = text[start : text.index("\nfi\n", start) + 4]
    if rows:
        (tmp_path / "logs.index-rows").write_text("\n".join(rows) + "\n")
    done = subprocess.run(
        ["bash", "-c", f'logs={tmp_path / "logs"}\n{gate}\necho "bench sm90a: ${{KPOOL_CUPY_BENCH_SM90A:-0}}"'],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.stdout.strip() == f"bench sm90a: {1 if timed else 0}", done.stdout + done.stderr
