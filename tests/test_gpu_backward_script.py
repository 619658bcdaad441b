"""scripts/gpu_backward_check.sh (issue 35's backward records on a GPU) runs end to end: ``--smoke`` through
tests/cupy_double. Nothing is timed here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_variants  # noqa: E402

from kpool_cupy.bench.backward import backward_bytes, backward_shapes  # noqa: E402

# A guard against a hang: the smoke run emulates the quick backward record on the CPU.
TIMEOUT_S = 900


@pytest.mark.slow
def test_the_smoke_run_benches_the_backward_records_alone(tmp_path):
    out = tmp_path / "out"
    env = gpu_variants.double_env(tmp_path / "launches.tsv", OUT=str(out), PYTHON=sys.executable)
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_backward_check.sh"), "--smoke"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    summary = (out / "summary.txt").read_text()
    assert done.returncode == 0, summary + done.stderr[-2000:]
    assert "bench exit 0" in summary, summary
    results = json.loads((out / "bench-backward.json").read_text())
    # The backward's quick records, in order, each credited with backward_bytes; no other op's.
    records = results["backward"]
    shapes = backward_shapes(quick=True)
    assert [record["name"] for record in records] == [shape.name for shape in shapes]
    for shape, record in zip(shapes, records, strict=True):
        assert record["bytes"] == backward_bytes(shape) and "kpool-cupy" in record["implementations"], record
    assert not results.get("select") and not results.get("index") and not results.get("shapes"), list(results)
