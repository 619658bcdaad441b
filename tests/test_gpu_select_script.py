"""scripts/gpu_select_check.sh (issue 34's GPU run) runs end to end: ``--smoke`` through tests/cupy_double, with a
stand-in compute-sanitizer that only runs its program. Nothing is timed here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_variants  # noqa: E402

# A guard against a hang: the smoke run emulates the quick select and topk records and memcheck's small
# prefill on the CPU (24 s here, 2026-12-05).
TIMEOUT_S = 900


@pytest.mark.slow
def test_the_smoke_run_benches_both_selections_and_runs_the_prefill_calls_under_the_sanitizer(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sanitizer = bin_dir / "compute-sanitizer"
    sanitizer.write_text(gpu_variants.FAKE_SANITIZER)
    sanitizer.chmod(0o755)
    out = tmp_path / "out"
    env = gpu_variants.double_env(tmp_path / "launches.tsv", OUT=str(out), PYTHON=sys.executable)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_select_check.sh"), "--smoke"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    summary = (out / "summary.txt").read_text()
    assert done.returncode == 0, summary + done.stderr[-2000:]
    assert "bench exit 0" in summary and "memcheck exit 0" in summary, summary
    assert "fused == scorer then topk: True" in summary and "call topk done" in summary, summary
    records = json.loads((out / "bench-select.json").read_text())["select"]
    names = [record["name"] for record in records]
    assert any(n.startswith("select ") for n in names) and any(n.startswith("topk ") for n in names), names
