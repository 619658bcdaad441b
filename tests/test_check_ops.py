"""`kpool-cupy check --op`: every op family passes on the CPU backends, and one wrong element fails it."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner
from model import BF16

from kpool_cupy import ops, reference
from kpool_cupy.cli import main
from kpool_cupy.tools import self_check
from kpool_cupy.tools.cases import check_cases
from kpool_cupy.tools.op_check_parts import Backend
from kpool_cupy.tools.op_checks import OP_CHECKS
from kpool_cupy.tools.ring_op_checks import within_closed_ids
from kpool_cupy.tools.variants import ELEMENTS, OP_KERNELS, OP_SPECS

OPS = list(OP_CHECKS)


def test_every_op_has_its_kernel_and_a_check():
    names = [spec.name.removeprefix("kpool_") for spec in ops.OPS]
    assert list(OP_KERNELS) == names and OPS == names


def _spoiled(op: str) -> SimpleNamespace:
    """The reference with ``op`` changed in one element of what it returns (or, for seed tail, of the ring)."""
    real = getattr(reference, f"kpool_{op}" if op != "hadamard_quant_fp8" else op)

    def spoil(array: np.ndarray) -> None:
        flat = array.reshape(-1).view(np.uint8)  # one bit of one element: any bit-exact check sees it
        if flat.size:
            flat[flat.size // 2] ^= 0x40

    def wrong(*args, **kwargs):
        result = real(*args, **kwargs)
        spoil(args[0] if result is None else result[0] if isinstance(result, tuple) else result)
        return result

    names = {name: getattr(reference, name) for name in dir(reference) if name.startswith(("kpool_", "hadamard"))}
    return SimpleNamespace(**{**names, real.__name__: wrong})


@pytest.mark.parametrize("op", OPS)
def test_one_wrong_element_fails_the_op_check(op, monkeypatch):
    monkeypatch.setattr(self_check, "backend_for", lambda name: Backend(_spoiled(op), lambda a: a, np.asarray))
    results = self_check.run_check("reference", BF16, 64, 4, 0, op=op)
    assert any(r.status == "FAIL" for r in results), [(r.name, r.status) for r in results]


def _roll_ring(result, args, kwargs):
    args[0][...] = np.roll(args[0], 1, axis=2)


def _shift_cache(result, args, kwargs):
    kwargs["cache"][...] = np.roll(kwargs["cache"], 1, axis=1)


def _zero_positions(result, args, kwargs):
    result[0][...] = 0


def _flip_a_bit(result, args, kwargs):
    first = (result[0] if isinstance(result, tuple) else result).reshape(-1).view(np.uint8)
    first[first.size // 2] ^= 0x40


# (op, which calls go wrong, how): kernels wrong only in one form or only in what they write in place.
PLANTED = {
    "compress-rotated": ("compress", lambda kw: kw.get("rotate"), _flip_a_bit),
    "ring-close-rotated": ("ring_close", lambda kw: kw.get("rotate"), _flip_a_bit),
    "tail-update-rotated": ("tail_update", lambda kw: kw.get("rotate"), _flip_a_bit),
    "ring-close-writes-its-ring": ("ring_close", lambda kw: True, _roll_ring),
    "fp8-ring-close-writes-its-ring": ("ring_close_fp8", lambda kw: True, _roll_ring),
    "fp8-tail-update-ring-rows": ("tail_update_fp8", lambda kw: "cache" not in kw, _roll_ring),
    "compress-fp8-cache-slots": ("compress_fp8", lambda kw: "cache" in kw, _shift_cache),
    "ring-close-fp8-cache-slots": ("ring_close_fp8", lambda kw: "cache" in kw, _shift_cache),
    "tail-update-fp8-cache-slots": ("tail_update_fp8", lambda kw: "cache" in kw, _shift_cache),
    "expand-paged-compact": ("expand_topk", lambda kw: kw.get("compact") and "block_table" in kw, _zero_positions),
    "expand-compact-without-tail": (
        "expand_topk",
        lambda kw: kw.get("compact") and not kw.get("always_select_tail"),
        _zero_positions,
    ),
}


@pytest.mark.parametrize("planted", PLANTED)
def test_a_kernel_wrong_in_one_form_fails_the_op_check(planted, monkeypatch):
    op, when, spoil = PLANTED[planted]
    real = getattr(reference, f"kpool_{op}")

    def wrong(*args, **kwargs):
        result = real(*args, **kwargs)
        if when(kwargs):
            spoil(result, args, kwargs)
        return result

    names = {name: getattr(reference, name) for name in dir(reference) if name.startswith(("kpool_", "hadamard"))}
    ops_module = SimpleNamespace(**{**names, f"kpool_{op}": wrong})
    monkeypatch.setattr(self_check, "backend_for", lambda name: Backend(ops_module, lambda a: a, np.asarray))
    results = self_check.run_check("reference", BF16, 64, 4, 0, op=op)
    assert any(r.status == "FAIL" for r in results), [(r.name, r.status) for r in results]


@pytest.mark.parametrize("op", OPS)
def test_every_op_passes_on_the_reference_with_something_compared(op):
    results = self_check.run_check("reference", BF16, 64, 4, 0, op=op)
    assert all(r.ok for r in results) and sum(r.status == "pass" for r in results) >= 8
    pooling = op not in ("seed_tail", "expand_topk", "hadamard_quant_fp8", "index_topk", "index_select_fp8")
    assert all((r.worst_error_over_bound is not None) == pooling for r in results)


@pytest.mark.slow
@pytest.mark.parametrize("op", OPS)
def test_every_op_passes_on_the_emulator(op):
    results = self_check.run_check("emulate", BF16, 128, 4, 0, op=op)
    assert all(r.ok for r in results) and sum(r.status == "pass" for r in results) >= 8, [
        (r.name, r.status, r.mismatches, r.worst_error_over_bound) for r in results
    ]


def test_ring_checks_move_caches_to_ids_closed_can_hold_and_keep_positions_past_2_32():
    case = next(c for c in check_cases(8, 4, np.dtype(np.float32), 0) if c.name == "cache-past-2^32")
    moved = within_closed_ids(case, 4)
    ends = moved.cache_lengths + np.diff(moved.input_row_offsets)
    assert ends.max() // 4 <= 2**31 - 1 < case.cache_lengths.max() // 4
    assert moved.cache_lengths.max() > 2**32  # still 64-bit positions
    assert np.array_equal(moved.cache_lengths % 20, case.cache_lengths % 20)  # each position's pool phase and ring row


def test_check_op_on_the_cli_says_the_op_and_its_unit():
    result = CliRunner().invoke(main, ["check", "--backend", "emulate", "--op", "seed_tail", "--json", "--kpool", "3"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["op"] == "seed_tail" and report["unit"] == "ring rows" and report["ok"] is True
    assert all(c["max_abs_err"] is None and c["mismatches"] == 0 for c in report["cases"])
    table = CliRunner().invoke(main, ["check", "--backend", "reference", "--op", "expand_topk", "--kpool", "3"])
    assert table.exit_code == 0 and "kpool_expand_topk" in table.output and "ids" in table.output, table.output


@pytest.mark.parametrize("bad", [["--op", "nope"], ["--head-dim", "7"], ["--kpool", "0"]])
def test_a_usage_error_under_json_is_one_json_object(bad):
    result = CliRunner().invoke(main, ["check", "--json", *bad])
    report = json.loads(result.output)
    assert result.exit_code == 2 and report["ok"] is False and "Invalid value for" in report["error"]
    # Every error object has one shape (helper-60: a usage error's lacked backend and op): what was asked for,
    # None where the error came before it was read.
    assert set(report) == {"backend", "op", "ok", "error", "cases"} and report["cases"] == [], report


def test_an_error_or_ctrl_c_under_json_is_one_object_of_the_same_shape(monkeypatch):
    from kpool_cupy import cli

    for raised, status in ((RuntimeError("no device today"), 1), (KeyboardInterrupt(), 130)):

        def stopped(*args, raised=raised, **kwargs):
            raise raised

        monkeypatch.setattr(cli, "run_check", stopped)
        result = CliRunner().invoke(main, ["check", "--backend", "reference", "--op", "index_topk", "--json"])
        report = json.loads(result.output)  # one object and nothing else
        assert result.exit_code == status and set(report) == {"backend", "op", "ok", "error", "cases"}, report
        assert report["backend"] == "reference" and report["op"] == "index_topk" and report["ok"] is False
    assert "interrupted" in report["error"]


@pytest.mark.parametrize("op", ["ring_close", "ring_close_fp8"])
def test_ring_close_at_kpool_1_is_refused_not_reported_as_nothing_checked(op):
    # A usage error (exit 2, naming the flag) as every other bad --kpool; the Python call names its argument.
    result = CliRunner().invoke(main, ["check", "--backend", "reference", "--op", op, "--kpool", "1", "--json"])
    report = json.loads(result.output)
    assert result.exit_code == 2 and report["error"].startswith("Invalid --kpool: expected at least 2"), report
    with pytest.raises(ValueError, match=r"^Invalid kpool: expected at least 2"):
        self_check.run_check("reference", BF16, 64, 1, 0, op=op)


ROTATION = "head_dim a power of two from 8 to 256 (the Hadamard rotation)"


@pytest.mark.parametrize(
    ("op", "head_dim", "rule"),
    [
        ("index_logits_fp8", 32, "64, 128 or 256 for the scorer"),  # a power of two the scorer does not take
        ("index_select_fp8", 512, ROTATION),
        ("hadamard_quant_fp8", 24, ROTATION),
        ("compress_fp8", 40, ROTATION),
    ],
)
def test_check_refuses_a_head_dim_the_op_does_not_take(op, head_dim, rule):
    # It ran the scorer at 128 and reported the head_dim asked for, with ok: true. Now a usage error before
    # any work (exit 2, the flag named), as the README has every bad --head-dim.
    args = ["check", "--backend", "reference", "--op", op, "--head-dim", str(head_dim), "--json"]
    result = CliRunner().invoke(main, args)
    report = json.loads(result.output)
    assert result.exit_code == 2 and report["ok"] is False, result.output
    assert report["error"] == f"Invalid --head-dim: expected {rule}, got {head_dim}", report["error"]
    text = CliRunner().invoke(main, args[:-1])
    assert text.exit_code == 2 and text.output.startswith("Usage:"), text.output
    with pytest.raises(ValueError, match="^" + re.escape(f"Invalid head_dim: expected {rule}, got {head_dim}")):
        self_check.run_check("reference", BF16, head_dim, 4, 0, op=op)


@pytest.mark.parametrize(
    ("op", "absent"),
    [("expand_topk", {"dtype", "head_dim"}), ("index_topk", {"dtype", "head_dim"}),
     ("index_logits_fp8", {"dtype"}), ("hadamard_quant_fp8", {"kpool"}), ("seed_tail", set())],
)  # fmt: skip
def test_a_report_names_only_the_settings_the_op_takes(op, absent):
    # `check --op expand_topk --dtype float32 --head-dim 4096` reported a dtype and a head_dim the op has not:
    # they change only the random batches. JSON gives them as null; the table's header leaves them out.
    args = ["check", "--backend", "reference", "--op", op, "--dtype", "float32", "--head-dim", "64", "--kpool", "3"]
    report = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
    given = {"dtype": "float32", "head_dim": 64, "kpool": 3}
    assert {n: report[n] for n in given} == {n: None if n in absent else v for n, v in given.items()}, report
    header = CliRunner().invoke(main, args).output.splitlines()[1]
    parts = {"dtype": ", float32,", "head_dim": "head_dim 64", "kpool": "kpool 3"}
    assert {n for n, part in parts.items() if part not in header + ","} == absent, header


def test_the_settings_an_op_takes_are_its_kernel_template_and_signature():
    # What a report keeps (OpCheck.takes) is what the op is built or called with: an element type and HEAD_DIM
    # in its kernel's template, kpool as an argument or ape's rows.
    for op, check in OP_CHECKS.items():
        template = {t.name for t in OP_KERNELS[op].template}
        arguments = {p.name for p in OP_SPECS[op].parameters}
        takes = {
            "dtype": bool(template & set(ELEMENTS)),
            "head_dim": "HEAD_DIM" in template,
            "kpool": bool(arguments & {"kpool", "ape"}),
        }
        assert check.takes == {name for name, taken in takes.items() if taken}, op


@pytest.mark.parametrize(("op", "names"), [("compress", 0), ("compress_fp8", 2), ("ring_close", 3)])
def test_a_case_is_named_for_its_extras_only_where_the_op_reads_them(op, names):
    # `oversized-out`, `float32-out` and `explicit-pool-offsets` named ring, index and expand cases that pass no
    # out= and no pool_row_offsets=; such a case goes by its batch's name.
    results = self_check.run_check("reference", BF16, 64, 2, 0, op=op)
    extras = {"oversized-out", "float32-out", "explicit-pool-offsets"}
    batches = {"two-requests", "two-more-requests", "one-request-mid-pool"}
    got = {r.name for r in results}
    assert len(got & batches) == names and len(got & extras) == 3 - names and len(got) == len(results), got


def test_each_comparison_counts_the_nan_and_infinities_its_errors_leave_out():
    from kpool_cupy.tools.accuracy import compare
    from kpool_cupy.tools.gradient_accuracy import compare_gradients
    from kpool_cupy.tools.index_accuracy import index_logits_agree

    want = np.array([1.0, np.nan, np.inf, -np.inf, 2.0], np.float32)
    got = np.array([np.nan, np.nan, -np.inf, -np.inf, np.inf], np.float32)  # 3 differ: 1→NaN, inf→-inf, 2→inf
    bound = np.ones_like(want)
    verdicts = [
        compare(got, want, np.dtype(np.float32), 4, 1.0),
        compare_gradients({"a": got, "b": got}, {"a": want, "b": want}, {"a": bound, "b": bound}),
        index_logits_agree(got, want, bound),
    ]
    assert [v["special_mismatches"] for v in verdicts] == [3, 6, 3] and not any(v["ok"] for v in verdicts)
    same = [compare(want, want, np.dtype(np.float32), 4, 1.0), index_logits_agree(want, want, bound)]
    assert [v["special_mismatches"] for v in same] == [0, 0] and all(v["ok"] for v in same)
