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

from kpool_cupy.bench import topk  # noqa: E402
from kpool_cupy.ops.index_topk import call_workspace_bytes  # noqa: E402

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
    assert any(n.startswith("select ") for n in names), names
    # The topk records (kpool_cupy/bench/topk.py), as the bench ran them: the quick shapes in order, each
    # credited with topk_bytes, its workspace exactly what its call needs (0 for a block a row), torch.topk's
    # absence said.
    topk_records = [record for record in records if record["name"].startswith("topk ")]
    shapes = topk.topk_shapes(quick=True)
    assert [record["name"] for record in topk_records] == [shape.name for shape in shapes]
    for shape, record in zip(shapes, topk_records, strict=True):
        ours = record["implementations"]["kpool-cupy"]
        needed = call_workspace_bytes(shape.tokens, shape.pools, shape.pool_topk)
        assert ours["working_bytes"] == needed and (needed > 0) == (record["splits"] > 1), record
        assert record["bytes"] == topk.topk_bytes(shape) and ours["time_over_kpool_cupy"] == 1.0
        assert "torch" in record["implementations"]["torch-topk"]["skipped"]
    assert [record["splits"] > 1 for record in topk_records] == [True, False]  # a split row, a block a row
