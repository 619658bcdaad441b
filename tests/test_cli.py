"""`kpool-cupy check` through click's runner, on this machine's CPU backends."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from kpool_cupy import emulate
from kpool_cupy.cli import main


@pytest.mark.parametrize("backend", ["emulate", "reference"])
def test_check_passes_and_json_parses(backend):
    result = CliRunner().invoke(main, ["check", "--backend", backend, "--json", "--kpool", "4"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["backend"] == backend and report["ok"] is True
    assert len(report["cases"]) >= 8
    assert {"name", "pools", "max_abs_err", "max_ulp_err", "ok"} <= set(report["cases"][0])


def test_check_table_names_every_case():
    result = CliRunner().invoke(main, ["check", "--backend", "emulate", "--dtype", "float16", "--kpool", "2"])
    assert result.exit_code == 0, result.output
    for name in ("every-phase", "empty-requests", "strided-rows", "oversized-out", "cache-near-2^32"):
        assert name in result.output


def test_planted_wrong_result_fails(monkeypatch):
    real = emulate.kpool_compress

    def perturbed(*args, **kwargs):
        result = real(*args, **kwargs)
        if result.shape[0]:
            result[result.shape[0] // 2, 3] += result.dtype.type(0.25)
        return result

    monkeypatch.setattr(emulate, "kpool_compress", perturbed)
    result = CliRunner().invoke(main, ["check", "--backend", "emulate", "--json"])
    assert result.exit_code != 0
    report = json.loads(result.output)
    assert report["ok"] is False and any(not case["ok"] for case in report["cases"])


def test_planted_write_past_total_pools_fails(monkeypatch):
    # The surplus rows of an over-sized out are part of the contract.
    real = emulate.kpool_compress

    def overwrites(*args, out=None, **kwargs):
        result = real(*args, out=out, **kwargs)
        if out is not None:
            out[-1] = np.zeros(out.shape[1], out.dtype)
        return result

    monkeypatch.setattr(emulate, "kpool_compress", overwrites)
    result = CliRunner().invoke(main, ["check", "--backend", "emulate", "--json"])
    assert result.exit_code != 0
    failed = {case["name"] for case in json.loads(result.output)["cases"] if not case["ok"]}
    assert "oversized-out" in failed


def test_bad_size_is_a_click_error():
    result = CliRunner().invoke(main, ["check", "--backend", "reference", "--head-dim", "12"])
    assert result.exit_code != 0 and "head_dim" in result.output
