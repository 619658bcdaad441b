"""`kpool-cupy check` through click's runner, on this machine's CPU backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from kpool_cupy import emulate
from kpool_cupy.backends.cupy import _driver_loadable, gpu_status
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


def test_a_planted_nan_is_a_fail_row_that_says_why_its_errors_read_zero(monkeypatch):
    # The error columns measure finite values only, so a NaN where the answer is finite would show a FAIL row
    # with zero error; the row says how many NaN/inf differ, and so does the JSON.
    real = emulate.kpool_compress

    def poisoned(*args, **kwargs):
        result = real(*args, **kwargs)
        if result.shape[0]:
            result[0, :2] = np.nan
        return result

    monkeypatch.setattr(emulate, "kpool_compress", poisoned)
    table = CliRunner().invoke(main, ["check", "--backend", "emulate"])
    assert table.exit_code == 1 and "FAIL (2 NaN/inf differ)" in table.output, table.output
    report = json.loads(CliRunner().invoke(main, ["check", "--backend", "emulate", "--json"]).output)
    failed = [case for case in report["cases"] if not case["ok"]]
    assert failed and all(case["special_mismatches"] == 2 for case in failed), failed
    assert all(case["special_mismatches"] == 0 for case in report["cases"] if case["ok"])


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


def test_bad_size_is_a_usage_error_naming_the_flag():
    # Issue 9, finding 13: it named k.shape[1] and exited 1.
    result = CliRunner().invoke(main, ["check", "--backend", "reference", "--head-dim", "12"])
    assert result.exit_code == 2 and "'--head-dim'" in result.output, result.output


def test_json_records_what_ran_and_why():
    # Issue 9, finding 11: the configuration, the reason for the backend and
    # each case's bound belong in the report.
    result = CliRunner().invoke(main, ["check", "--json", "--kpool", "2", "--dtype", "bf16", "--seed", "3"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["backend"] == "emulate" and "running the CUDA source on the CPU" in report["reason"]
    assert (report["dtype"], report["head_dim"], report["kpool"], report["seed"]) == ("bfloat16", 128, 2, 3)
    for case in report["cases"]:
        assert {"tokens", "pools", "status", "max_allowed_abs", "worst_error_over_bound"} <= set(case)
        assert case["status"] == "pass" and 0 <= case["worst_error_over_bound"] <= 1 < case["max_allowed_abs"] * 2**30


def test_auto_without_a_gpu_or_a_compiler_refuses_instead_of_checking_the_reference(monkeypatch):
    # Issue 9, finding 11: it compared the reference with itself and printed "all cases pass".
    monkeypatch.setenv("CXX", "no-such-compiler-kpool")
    result = CliRunner().invoke(main, ["check", "--json"])
    assert result.exit_code == 1 and "--backend reference" in result.output, result.output
    # Under --json the failure is one JSON object on stdout too, not an empty string.
    report = json.loads(result.stdout)
    assert report["ok"] is False and "--backend reference" in report["error"] and report["cases"] == []
    asked = CliRunner().invoke(main, ["check", "--backend", "reference", "--json", "--kpool", "2"])
    assert asked.exit_code == 0 and json.loads(asked.output)["reason"] == "asked for with --backend"


@pytest.mark.skipif(gpu_status()[0], reason="this machine has a usable GPU")
def test_no_gpu_is_said_in_plain_words_by_check_and_info():
    # Not CUDA's "driver version is insufficient" on a machine with no driver at all.
    result = CliRunner().invoke(main, ["check", "--backend", "cupy"])
    assert result.exit_code == 1 and "--backend cupy needs a CUDA GPU: " in result.output, result.output
    info = CliRunner().invoke(main, ["info"])
    gpu_line = next(line for line in info.output.splitlines() if line.startswith("GPU "))
    if not _driver_loadable():
        assert "no CUDA GPU or driver found" in result.output
        assert "no CUDA GPU or driver found" in gpu_line and "Insufficient" not in gpu_line
    assert "cudaError" not in gpu_line or _driver_loadable()


def test_a_case_without_pools_is_skipped_not_passed():
    # Issue 9, finding 11: with kpool 128 the decode-like batch completes no pool.
    result = CliRunner().invoke(
        main, ["check", "--backend", "reference", "--json", "--kpool", "128", "--head-dim", "8"]
    )
    assert result.exit_code == 0, result.output
    statuses = {case["name"]: case["status"] for case in json.loads(result.output)["cases"]}
    assert statuses["decode-like"] == "skipped" and "pass" in statuses.values()


def test_a_run_that_checks_nothing_fails(monkeypatch):
    from kpool_cupy.tools import self_check

    real = self_check.check_cases
    monkeypatch.setattr(self_check, "check_cases", lambda *a: [c for c in real(*a) if c.name == "decode-like"])
    result = CliRunner().invoke(main, ["check", "--backend", "reference", "--kpool", "128", "--head-dim", "8"])
    assert result.exit_code == 1 and "nothing was checked" in result.output, result.output


@pytest.mark.parametrize("command", [[], ["check"], ["info"], ["ptx"], ["bench"]])
def test_h_is_help_everywhere(command):
    result = CliRunner().invoke(main, [*command, "-h"])
    assert result.exit_code == 0 and "Usage:" in result.output


def test_an_unknown_skip_is_a_usage_error_before_any_work():
    result = CliRunner().invoke(main, ["bench", "--skip", "bogus"])
    assert result.exit_code == 2 and "'--skip'" in result.output and "bogus" in result.output


@pytest.mark.parametrize(
    ("command", "flag"),
    [(["ptx", "--out"], "--out"), (["bench", "--json"], "--json"), (["bench", "--plot"], "--plot")],
)
def test_output_paths_are_checked_before_any_work(command, flag, monkeypatch):
    # Issue 9, finding 13: a missing folder gave a traceback, for bench after the whole sweep.
    import kpool_cupy.tools.ptx_report as ptx_report

    monkeypatch.setattr(ptx_report, "summarize", lambda *a: pytest.fail("compiled before checking --out"))
    result = CliRunner().invoke(main, [*command, "/no/such/folder/file"])
    assert result.exit_code == 2 and f"'{flag}'" in result.output and "does not exist" in result.output


def test_plot_without_matplotlib_is_refused_up_front(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    result = CliRunner().invoke(main, ["bench", "--plot", str(tmp_path / "b.png")])
    assert result.exit_code == 2 and "matplotlib" in result.output and "'--plot'" in result.output


def test_check_cases_grow_linearly_with_kpool():
    # Every phase of every pool was 4 * kpool^2 tokens (4.2 million at kpool
    # 1024: minutes and gigabytes); a sample of phases past kpool 32 keeps
    # the batches linear, so `check --kpool 1024` is seconds and a few
    # hundred MB (measured in the closing note of issue 20).
    from kpool_cupy.tools.cases import check_cases

    def tokens(kpool):
        return sum(case.tokens for case in check_cases(8, kpool, np.dtype(np.float32), seed=0))

    assert tokens(1024) <= 2.2 * tokens(512) and tokens(512) <= 2.2 * tokens(256)
    assert tokens(1024) <= 150 * 1024  # about 133 tokens per unit of kpool here
    phases = {
        int(c) % 32
        for c in next(c for c in check_cases(8, 32, np.dtype(np.float32), 0) if c.name == "every-phase").cache_lengths
    }
    assert phases == set(range(32))  # up to kpool 32 every phase is there


@pytest.mark.parametrize(
    ("op", "shuffles", "eight_byte_stores"),
    [
        ("compress", False, False),
        ("compress_fp8", True, True),
        ("ring_close", False, False),
        ("ring_close_fp8", True, True),
        ("seed_tail", False, False),
        ("tail_update", False, False),
        ("tail_update_fp8", True, True),
        ("expand_topk", False, False),
        ("hadamard_quant_fp8", True, True),
        ("index_topk", True, False),  # the split merge's bounds, reduced over warps
    ],
)
def test_ptx_reports_every_kernel_family_with_its_store_widths_and_shuffles(op, shuffles, eight_byte_stores):
    # Every op's kernel, FP8 writers and the query side included: the FP8
    # epilogue's butterflies and 8-byte value stores show, the plain kernels'
    # 16-byte paths show no shuffle; the top-k's do, for its split merge's bounds. The selections' variant is
    # its buffer for pool_topk 512 (it failed for want of CAP).
    result = CliRunner().invoke(main, ["ptx", "--op", op, "--head-dim", "64", "--kpool", "4"])
    assert result.exit_code == 0, result.output
    takes_dtype = op not in ("expand_topk", "index_topk")  # no element type in their kernels' templates
    assert result.output.startswith(f"kpool_{op} bfloat16" if takes_dtype else f"kpool_{op},"), result.output
    lines = {line[:20].strip(): line[20:].split()[0] for line in result.output.splitlines()[1:]}
    assert (int(lines["shuffles (bfly)"]) > 0) is shuffles
    assert (int(lines["64-bit stores"]) > 0) is eight_byte_stores
    assert lines["local memory"] == "none" and lines["spill stores/loads"] == "0"


def test_ptx_compiles_the_fused_selects_variant_for_its_buffer():
    result = CliRunner().invoke(main, ["ptx", "--op", "index_select_fp8"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("kpool_index_select_fp8, head_dim 128, pool_topk up to 512, sm_90")


def test_check_json_is_one_object_when_the_build_cache_cannot_be_made(tmp_path):
    # A hostile round's finding: an OSError (here the cache folder under a plain file) escaped as a traceback,
    # leaving --json's stdout empty. A process of its own: this one may hold the variants loaded already.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "kpool_cupy", "check", "--backend", "emulate", "--json"],
        env={**os.environ, "XDG_CACHE_HOME": str(blocker / "cache")}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads(done.stdout)  # one object and nothing else
    assert report["ok"] is False and "a-file" in report["error"], report


def test_a_head_dim_the_op_does_not_take_is_a_usage_error_for_ptx_too(monkeypatch):
    # helper-60: ptx --op index_logits_fp8 --head-dim 8 exited 1 naming head_dim after the work began; check
    # says "Invalid --head-dim" and exits 2 before any, and ptx now does as check does.
    import kpool_cupy.tools.ptx_report as ptx_report

    monkeypatch.setattr(ptx_report, "summarize", lambda *a, **k: pytest.fail("compiled before the usage rules"))
    for op, head_dim in (("index_logits_fp8", 8), ("hadamard_quant_fp8", 24), ("compress_fp8", 512)):
        result = CliRunner().invoke(main, ["ptx", "--op", op, "--head-dim", str(head_dim)])
        assert result.exit_code == 2 and "Invalid --head-dim" in result.output, (op, result.output)


def test_a_file_that_cannot_be_written_is_a_click_error_not_a_traceback(tmp_path, monkeypatch):
    # helper-60: the folder was checked, the file not: ptx --out /dev/full (or a file that refuses writing)
    # raised OSError's traceback after the work.
    from pathlib import Path

    import kpool_cupy.tools.ptx_report as ptx_report

    monkeypatch.setattr(ptx_report, "summarize", lambda *a, **k: type("S", (), {"ptx": "text", **dict.fromkeys(
        ("registers", "spill_stores", "spill_loads", "vector_loads", "vector_stores", "eight_byte_stores",
         "byte_stores", "scalar_loads", "butterfly_shuffles", "local_memory"), 0)})())  # fmt: skip

    def refuse(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", refuse)
    result = CliRunner().invoke(main, ["ptx", "--out", str(tmp_path / "k.ptx")])
    assert result.exit_code == 1 and "cannot write" in result.output and "No space left" in result.output
    assert not isinstance(result.exception, OSError), result.exception  # click's exit, no traceback


def test_bench_refuses_one_file_for_two_outputs_and_an_empty_name(tmp_path):
    # helper-60: --json F --table F left the table where the JSON was, exit 0; --out "" wrote nothing, exit 0.
    same = str(tmp_path / "f")
    for flags in (["--json", same, "--table", same], ["--table", same, "--plot", same]):
        result = CliRunner().invoke(main, ["bench", *flags])
        assert result.exit_code == 2 and "name one file" in result.output, result.output
    result = CliRunner().invoke(main, ["ptx", "--out", ""])
    assert result.exit_code == 2 and "empty" in result.output, result.output


def test_check_out_of_memory_is_a_click_error(monkeypatch):
    # helper-60: check --op index_topk --kpool 1024 ran out of memory with NumPy's traceback (and the
    # reference's was killed); its rows are now bounded (below), and a MemoryError is said, not raised.
    import kpool_cupy.cli as cli

    def exhausted(*args, **kwargs):
        raise MemoryError("Unable to allocate 4.00 GiB")

    monkeypatch.setattr(cli, "run_check", exhausted)
    result = CliRunner().invoke(main, ["check", "--backend", "reference"])
    assert result.exit_code == 1 and "out of memory: Unable to allocate" in result.output, result.output
    result = CliRunner().invoke(main, ["check", "--backend", "reference", "--json"])
    assert json.loads(result.output)["error"].startswith("out of memory"), result.output


def test_the_selections_checks_bound_a_tokens_row_at_any_kpool():
    # helper-60: at kpool 1024 the checks' pool_topk of 512 made 524,288 positions a token (4 GiB).
    from kpool_cupy.tools.op_checks import CHECK_ROW_POSITIONS, large_pool_topk

    assert large_pool_topk(4) == 512 and large_pool_topk(16) == 512  # the engines' kpools keep their check
    for kpool in (1, 4, 17, 64, 1024):
        assert 6 <= large_pool_topk(kpool) <= 512
        assert large_pool_topk(kpool) * kpool <= max(CHECK_ROW_POSITIONS, 6 * kpool)


def test_an_arch_nvrtc_does_not_list_is_a_usage_error_naming_the_flag(monkeypatch):
    # helper-60: `ptx --arch sm_999` reached NVRTC, whose message names no option (exit 1 after starting).
    from kpool_cupy.tools import ptx_report

    monkeypatch.setattr(ptx_report, "summarize", lambda *a, **k: pytest.fail("compiled an arch NVRTC does not list"))
    for arch in ("sm_999", "sm_80a"):  # a number NVRTC does not list; a suffix it has not for that number
        result = CliRunner().invoke(main, ["ptx", "--arch", arch])
        assert result.exit_code == 2 and "Invalid value for '--arch': NVRTC " in result.output, result.output
        assert f"cannot build for '{arch}'" in result.output and "sm_90," in result.output, result.output
    from kpool_cupy.kernel.nvrtc import unknown_arch

    assert [unknown_arch(arch) for arch in ("sm_90", "sm_90a", "compute_89")] == [None] * 3
