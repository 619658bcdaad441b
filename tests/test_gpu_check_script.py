"""scripts/gpu_check.sh keeps its budgets: at most 8 files back from the GPU machine, 5 minutes of step limits.

The script's own text is checked, then the script is run: with a stand-in
``python`` that fails every step at once, and in full (``--smoke``) through
tests/cupy_double with a stand-in compute-sanitizer that only runs its
program. Nothing here is timed; the limits are read, not waited for.
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
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
DOUBLE = ROOT / "tests" / "cupy_double"
BUDGET_S = 300  # one call on a lent GPU machine
MAX_FILES = 8  # what the machine brings back from $OUT
FILES = {"summary.txt", "bench.json", "bench.png", "bench-compile.json", "logs.tar.gz"}
STEPS = ["environment", "pytest-gpu", "check", "memcheck", "bench", "bench-compile"]

FAKE_SANITIZER = """#!/bin/sh
# Stands in for compute-sanitizer: drops its options, runs the program.
while [ $# -gt 0 ]; do
    case "$1" in
        --tool|--error-exitcode|--leak-check) shift 2 ;;
        --*) shift ;;
        *) break ;;
    esac
done
exec "$@"
"""


def _limits(text: str) -> tuple[dict[str, int], int, list[str]]:
    block = re.search(r"declare -A limit=\((.*?)\n\)", text, re.S)
    assert block, "no limit table in the script"
    limits = {name: int(value) for name, value in re.findall(r"\[([\w-]+)\]=(\d+)", block.group(1))}
    kill_after = int(re.search(r"^kill_after=(\d+)$", text, re.M).group(1))
    steps = re.search(r"^steps=\((.*?)\)$", text, re.M).group(1).split()
    return limits, kill_after, steps


def test_the_step_limits_add_up_to_five_minutes_at_most():
    limits, kill_after, steps = _limits(SCRIPT.read_text())
    assert steps == STEPS and set(limits) == set(steps)
    # timeout may wait kill_after past a limit before it kills: counted per step.
    assert sum(limits.values()) + kill_after * len(steps) <= BUDGET_S, limits
    # torch.compile's cold start has a step and a limit of its own.
    assert limits["bench-compile"] >= 60


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
    assert _log_names(out / "logs.tar.gz") == {f"{step}.log" for step in STEPS}


def test_the_script_rejects_an_unknown_argument(tmp_path):
    done = _run_script(tmp_path, {}, "--fast", timeout=30)
    assert done.returncode == 2 and "usage" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_smoke_run_on_the_double_passes_within_the_file_budget(tmp_path):
    # The whole script, every step, through the CuPy double: real commands,
    # the quick benchmark, 8 garbage calls per family.
    env = {"PYTHON": sys.executable, "PYTHONPATH": str(DOUBLE)}
    # A guard against a hang: 123 s on a quiet machine; the smoke run's own
    # step limits are ten times the GPU run's.
    done = _run_script(tmp_path, env, "--smoke", timeout=3600)
    out = tmp_path / "out"
    summary = (out / "summary.txt").read_text()
    assert done.returncode == 0, summary + done.stderr[-2000:]
    entries = {p.name for p in out.iterdir()}
    assert entries == FILES and len(entries) <= MAX_FILES
    rows = _step_rows(summary)
    assert all(rows[step][1] == "0" for step in STEPS), rows
    assert sum(int(rows[step][2]) for step in STEPS) + 2 * len(STEPS) <= BUDGET_S
    assert _log_names(out / "logs.tar.gz") == {f"{step}.log" for step in STEPS}
    # What the summary folds in: the environment, the checks, the sanitizer's driver, the tables.
    assert "cupy: 0.0+numpy-double" in summary
    assert summary.count(": ok true") == 11  # compress on three dtypes, the eight other ops on bfloat16
    assert "tail_update_fp8 bfloat16, head_dim 128, kpool 4: ok true" in summary
    assert "garbage calls per op: kpool_compress 8" in summary
    # The sanitizer's driver made strided views on the device, not contiguous copies.
    assert int(re.search(r"strided device views: (\d+)", summary).group(1)) > 0
    assert summary.count("x kpool: median time over") == 2  # the sweep's table and the torch.compile run's
    assert "passed" in " ".join(rows["pytest-gpu"][4:])  # pytest's last line
    sweep = json.loads((out / "bench.json").read_text())
    assert sweep["complete"] is True and sweep["lifecycle"]
    # The torch.compile run: this package against torch.compile alone, no decode side.
    cold = json.loads((out / "bench-compile.json").read_text())
    assert cold["complete"] is True and cold["lifecycle"] == []
    assert {name for shape in cold["shapes"] for name in shape["implementations"]} == {"kpool-cupy", "torch-compile"}
