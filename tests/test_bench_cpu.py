"""The benchmark's CPU-side parts: shapes, byte counts, statistics, the baseline kernel, the report.

No test here times anything or asserts a speed.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from model import BF16, assert_close_to_model, make_batch, standard_lengths

from kpool_cupy import emulate, pool_row_offsets, reference
from kpool_cupy.backends.cupy import gpu_status
from kpool_cupy.bench.impls import composite_pool
from kpool_cupy.bench.inputs import first_member_rows
from kpool_cupy.bench.report import plot, table
from kpool_cupy.bench.shapes import BenchShape, minimum_bytes, sweep
from kpool_cupy.bench.stats import (
    MAX_ROTATION_BYTES,
    MAX_SETS,
    bandwidth_gbps,
    fraction_of,
    ratios_to,
    rotation,
    summarize_times,
)
from kpool_cupy.cli import main
from kpool_cupy.kernel.declarations import COMPRESS_BASELINE


def test_minimum_bytes_counts_members_once_and_the_output_once():
    # 2 requests: 9 tokens from position 0 (2 pools), 6 from position 3 (1 pool).
    shape = BenchShape("t", "mixed", (9, 6), (0, 3), head_dim=128, kpool=4)
    assert shape.pools == 3
    assert minimum_bytes(shape) == 3 * 4 * 128 * 2 * 2 + 3 * 128 * 2
    assert minimum_bytes(BenchShape("f", "mixed", (9, 6), (0, 3), 128, 4, "float32")) == 2 * minimum_bytes(shape)


def test_sweep_covers_decode_prefill_mixed_and_the_size_variations():
    shapes = sweep()
    assert {s.kind for s in shapes} == {"decode", "prefill", "mixed"}
    assert {s.head_dim for s in shapes} == {64, 128, 256} and {s.kpool for s in shapes} == {2, 4, 8, 16}
    assert all(s.pools > 0 for s in shapes)
    assert len({s.name for s in shapes}) == len(shapes)
    assert set(sweep(quick=True)) < set(shapes)


def test_statistics():
    summary = summarize_times([3.0, 1.0, 2.0, 10.0, 2.0])
    assert summary["median_ms"] == 2.0 and summary["min_ms"] == 1.0 and summary["runs"] == 5
    assert summary["p10_ms"] <= summary["median_ms"] <= summary["p90_ms"]
    assert bandwidth_gbps(2 * 10**9, 1000.0) == pytest.approx(2.0)
    assert fraction_of(3.0, 4.0) == 0.75
    with pytest.raises(ValueError, match="milliseconds"):
        summarize_times([])
    with pytest.raises(ValueError, match="milliseconds"):
        bandwidth_gbps(1, 0.0)


MIB = 2**20


def test_rotation_spans_three_l2_sizes():
    # 10 MiB per call against a 50 MiB L2: 15 sets, exactly 3x.
    plan = rotation(10 * MIB, 12 * MIB, 50 * MIB)
    assert plan == {"sets": 15, "bytes_per_set": 10 * MIB, "bytes": 150 * MIB, "l2_bytes": 50 * MIB,
                    "over_l2": 3.0, "capped": None}  # fmt: skip
    # Not a divisor: rounded up, so never below 3x.
    uneven = rotation(7 * MIB, 7 * MIB, 50 * MIB)
    assert uneven["sets"] == 22 and uneven["over_l2"] >= 3
    # The old cap of 64 sets left a 1.125 MiB decode call at 1.4x the L2; now 134 sets.
    decode = rotation(1152 * 1024, 1152 * 1024, 50 * MIB)
    assert decode["sets"] == 134 and decode["over_l2"] >= 3 and decode["capped"] is None


def test_rotation_never_below_two_sets():
    plan = rotation(2**30, 2**30, 50 * MIB)
    assert plan["sets"] == 2 and plan["over_l2"] > 3 and plan["capped"] is None


def test_rotation_caps_memory_and_set_count_and_says_which():
    # 300 MiB occupied per set: 4 GiB holds 13 of the 15 sets wanted.
    by_memory = rotation(10 * MIB, 300 * MIB, 50 * MIB)
    assert by_memory["sets"] == MAX_ROTATION_BYTES // (300 * MIB) == 13
    assert by_memory["capped"] == "memory" and by_memory["over_l2"] < 3
    tiny = rotation(100, 100, 50 * MIB)  # would want 1.6 million sets
    assert tiny["sets"] == MAX_SETS and tiny["capped"] == "sets"
    with pytest.raises(ValueError, match="l2_bytes"):
        rotation(1, 1, 0)


def test_ratios_to_kpool_cupy():
    implementations = {
        "kpool-cupy": {"median_ms": 2.0},
        "slower": {"median_ms": 5.0},
        "triton": {"skipped": "triton is not importable"},
        "broken": {"failed": "RuntimeError: no"},
    }
    ratios_to(implementations)
    assert implementations["kpool-cupy"]["time_over_kpool_cupy"] == 1.0
    assert implementations["slower"]["time_over_kpool_cupy"] == 2.5
    assert "time_over_kpool_cupy" not in implementations["triton"] | implementations["broken"]
    alone = {"other": {"median_ms": 1.0}}  # kpool-cupy not measured: no ratio rather than a wrong one
    ratios_to(alone)
    assert alone == {"other": {"median_ms": 1.0}}


def test_first_member_rows_match_the_reference_mapping():
    shape = BenchShape("m", "mixed", (13, 0, 7, 9, 4), (0, 3, 2, 5, 4), 8, 4)
    offsets = np.concatenate([[0], np.cumsum(shape.lengths)]).astype(np.int64)
    cache = np.asarray(shape.cache, np.int64)
    from kpool_cupy.ops.families.pooling import CompressCall

    call = CompressCall(8, 4, shape.requests, shape.tokens, BF16, BF16, BF16)
    pools = pool_row_offsets(offsets, cache, 4)
    want, ok = reference.member_rows(call, shape.pools, offsets, cache, pools)
    assert ok.all()
    np.testing.assert_array_equal(first_member_rows(shape), want)


def test_composite_baseline_matches_the_model():
    # The array-op composite the benchmark times, run with NumPy.
    lengths, cache = standard_lengths(4)
    batch = make_batch(lengths, cache, seed=12)
    shape = BenchShape("c", "mixed", tuple(lengths), tuple(cache), 128, 4)
    got = composite_pool(np, batch.k, batch.gate, batch.ape, first_member_rows(shape), 4)
    assert_close_to_model(got, batch.model(), BF16)


@pytest.mark.parametrize(("head_dim", "kpool"), [(64, 1), (128, 4), (256, 16)])
def test_upstream_geometry_kernel_matches_kpool_compress_bit_for_bit(head_dim, kpool):
    # Same PoolChannel arithmetic in the same member order: only the geometry
    # differs, so the bits must not.
    lengths, cache = standard_lengths(kpool)
    batch = make_batch(lengths, cache, head_dim=head_dim, kpool=kpool, seed=7)
    want = emulate.kpool_compress(*batch.args())
    offsets = batch.input_row_offsets.astype(np.int64)
    cached = batch.cache_lengths.astype(np.int64)
    pools = pool_row_offsets(offsets, cached, kpool)
    out = np.full_like(want, 0)
    args = COMPRESS_BASELINE.arguments(
        {
            "k": batch.k,
            "gate": batch.gate,
            "ape": batch.ape,
            "input_row_offsets": offsets,
            "cache_lengths": cached,
            "pool_row_offsets": pools,
            "batch": len(cached),
            "pooled": out,
        }
    )
    name = COMPRESS_BASELINE.instance(T=BF16, HEAD_DIM=head_dim, KPOOL=kpool)
    emulate.launch(COMPRESS_BASELINE.source, name, int(pools[-1]), head_dim, args)
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))


def _synthetic_results():
    entry = {"median_ms": 0.01, "p10_ms": 0.009, "p90_ms": 0.012, "min_ms": 0.009, "runs": 3}
    shapes = []
    for name, nbytes in (("a", 10**6), ("b", 10**8)):
        shapes.append(
            {
                "name": name,
                "bytes": nbytes,
                "rotation": {
                    "sets": 150,
                    "bytes_per_set": nbytes,
                    "bytes": 150 * nbytes,
                    "l2_bytes": 50 * MIB,
                    "over_l2": 3.1,
                    "capped": None if name == "b" else "sets",
                },
                "copy": {**entry, "timing": "graph", "gbps": 100.0},
                "implementations": {
                    "kpool-cupy": {
                        **entry,
                        "timing": "graph",
                        "gbps": 90.0,
                        "fraction_of_copy": 0.9,
                        "time_over_kpool_cupy": 1.0,
                    },
                    "torch-eager": {
                        **entry,
                        "median_ms": 0.03,
                        "timing": "events-around-python",
                        "gbps": 30.0,
                        "fraction_of_copy": 0.3,
                        "time_over_kpool_cupy": 3.0,
                    },
                    "triton": {"skipped": "triton is not importable"},
                },
            }
        )
    host = {"shape": "a", "calls_per_sample": 200, "call_us_validate_on": 50.0, "call_us_validate_off": 20.0,
            "bare_launch_us": 6.5, "overhead_over_bare_us": 13.5, "bare_launch_matches": True,
            "torch_op_matches": True, "call_us_torch_op": 31.5, "torch_op_over_cupy_us": 11.5,
            "graph_replay_us": 3.0}  # fmt: skip
    return {"environment": {"gpu": "none (synthetic)", "date": "2026-12-02"}, "shapes": shapes, "host": host}


def test_table_lists_every_implementation_and_skips_with_reasons():
    lines = "\n".join(table(_synthetic_results()))
    assert "kpool-cupy" in lines and "0.90" in lines and "skipped: triton is not importable" in lines
    assert "validate on 50.0 us" in lines


def test_table_shows_method_fraction_ratio_rotation_and_the_bare_launch():
    lines = table(_synthetic_results())
    eager = next(line for line in lines if "torch-eager" in line)
    # The method, the fraction of the copy, and the ratio marked: it was timed another way than kpool-cupy.
    assert eager.split()[1:] == ["events", "30.00", "30", "0.30", "3.00", "*"]
    ours = next(line for line in lines if "kpool-cupy" in line and "graph" in line)
    assert ours.split()[-2:] == ["0.90", "1.00"]
    assert any("*: timed by another method" in line for line in lines)
    assert any("150 input sets" in line and "3.1 x L2" in line and "capped by sets" in line for line in lines)
    text = "\n".join(lines)
    assert "bare CuPy launch of the same kernel and arguments 6.5 us (same bits); the package adds 13.5 us" in text


def test_table_shows_the_torch_op_host_cost_next_to_the_cupy_paths_or_why_not():
    lines = table(_synthetic_results())
    text = "\n".join(lines)
    ours = next(n for n, line in enumerate(lines) if "validate on 50.0 us, off 20.0 us" in line)
    # Right below the CuPy path's hot call and its bare launch, in the same unit.
    assert lines[ours + 2] == (
        "  the same hot call through torch.ops.kpool.compress.out 31.5 us (same bits); torch adds 11.5 us"
    ), text
    results = _synthetic_results()
    for key in ("torch_op_matches", "call_us_torch_op", "torch_op_over_cupy_us"):
        del results["host"][key]
    results["host"]["torch_op"] = "torch has no CUDA device"
    assert "  through torch.ops.kpool.compress.out: torch has no CUDA device" in table(results)


def test_table_lists_the_decode_steps_host_cost_per_op_with_the_empty_torch_ops():
    results = _synthetic_results()
    results["host"]["decode_step"] = [
        {"op": "tail_update_fp8", "shape": "decode-64x1 8K h64 top512", "call_us_validate_off": 12.0,
         "call_us_validate_on": 60.0, "bare_launch_us": 7.0, "overhead_over_bare_us": 5.0, "call_us_torch_op": 30.0,
         "torch_op_over_cupy_us": 18.0, "empty_torch_op_us": 9.0},
        {"op": "index_select_fp8", "shape": "decode-64x1 8K h64 top512", "call_us_validate_off": 15.0,
         "call_us_validate_on": 70.0, "bare_launch": "no launch plan for this call's signature",
         "torch_op": "torch has no CUDA device"},
    ]  # fmt: skip
    text = "\n".join(table(results))
    assert "host per op of a decode step (decode-64x1 8K h64 top512, outputs and workspaces given):" in text
    assert (
        "tail_update_fp8" in text
        and "off 12.0 us (+5.0 over bare), on 60.0 us; torch op +18.0 (an empty op 9.0)" in text
    )
    assert "off 15.0 us (no launch plan for this call's signature), on 70.0 us; torch op: torch has no CUDA device" in (
        text
    )
    # A call measured below its bare launch (noise at the floor) reads -0.3, not +-0.3.
    results["host"]["decode_step"][0]["overhead_over_bare_us"] = -0.3
    assert "off 12.0 us (-0.3 over bare)" in "\n".join(table(results))


def test_table_marks_nothing_when_every_method_is_the_same():
    results = _synthetic_results()
    for shape in results["shapes"]:
        shape["implementations"]["torch-eager"]["timing"] = "graph"
    assert not any("*" in line for line in table(results))


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    plot(_synthetic_results(), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_draws_fractions_and_ratios_per_shape(tmp_path, monkeypatch):
    # Two panels, one bar per measured implementation and shape: the fraction
    # of the copy above, the time over kpool-cupy's below; events hatched.
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    plot(_synthetic_results(), str(tmp_path / "bench.png"))
    (figure,) = figures
    top, bottom = figure.axes
    heights = sorted(round(p.get_height(), 3) for p in top.patches)
    assert heights == [0.3, 0.3, 0.9, 0.9]
    assert sorted(round(p.get_height(), 3) for p in bottom.patches) == [1.0, 1.0, 3.0, 3.0]
    assert sum(bool(p.get_hatch()) for p in top.patches) == 2  # torch-eager's two, timed by events
    assert [t.get_text() for t in bottom.get_xticklabels()] == ["a", "b"]
    plt.close(figure)


def test_the_plot_legend_names_every_implementation_wherever_it_first_appears(tmp_path, monkeypatch):
    # helper-60: only implementations measured in the smallest shape were named; one timed from the second
    # shape on drew unnamed bars.
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = _synthetic_results()
    first = min(results["shapes"], key=lambda s: s["bytes"])
    del first["implementations"]["torch-eager"]  # measured in the larger shape only
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    plot(results, str(tmp_path / "bench.png"))
    (figure,) = figures
    named = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert sorted(named) == ["kpool-cupy", "torch-eager"], named
    plt.close(figure)


@pytest.mark.skipif(gpu_status()[0], reason="this machine has a GPU, so bench runs")
def test_bench_without_a_gpu_exits_2_with_one_line():
    result = CliRunner().invoke(main, ["bench"])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "GPU" in result.output


def test_info_works_without_cuda():
    result = CliRunner().invoke(main, ["info"])
    assert result.exit_code == 0, result.output
    for fact in ("numpy", "GPU", "NVRTC", "host C++ compiler", "emulator cache", "sm_90a cubin cache"):
        assert fact in result.output


def test_ptx_prints_the_counts(tmp_path):
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    saved = tmp_path / "k.ptx"
    result = CliRunner().invoke(main, ["ptx", "--head-dim", "128", "--kpool", "4", "--out", str(saved)])
    assert result.exit_code == 0, result.output
    assert "128-bit loads       16" in result.output  # 4 members x (k, gate, two for float32 ape)
    assert "spill stores/loads  0 / 0" in result.output
    assert ".entry" in saved.read_text()


def test_check_json_is_the_only_stdout(tmp_path):
    # With an empty cache the emulator compiles first; nothing of that may reach stdout.
    import os
    import subprocess
    import sys

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "kpool_cupy", "check", "--backend", "emulate", "--json", "--kpool", "3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True


def test_lifecycle_bytes_and_shapes():
    from kpool_cupy.bench.lifecycle import DecodeShape, decode_shapes, expand_bytes, tail_update_bytes

    shape = DecodeShape(requests=8, next_n=2, head_dim=128, kpool=4)
    row = 128 * 2
    # next_n 2 of kpool 4: the two older members are read back from the ring.
    assert tail_update_bytes(shape) == 8 * 2 * 2 * row * 2 + 8 * (2 * 2 * row + row)
    assert expand_bytes(10, 512, 4) == 10 * 512 * 4 + 10 * 2048 * 4
    assert {s.requests for s in decode_shapes()} == {1, 8, 64, 512}
    assert set(decode_shapes(quick=True)) < set(decode_shapes())


def test_composite_tail_update_matches_the_reference():
    # The decode-step composite the benchmark times, run with NumPy, against
    # the reference tail update on the positions the benchmark uses.
    from kpool_cupy.bench.lifecycle import composite_tail_update

    rng = np.random.default_rng(3)
    requests, next_n, kpool = 5, 2, 4
    last = rng.integers(1, 100, requests) * kpool + kpool - 1
    positions = (last[:, None] - np.arange(next_n)[::-1]).astype(np.int32)
    k = rng.standard_normal((requests, next_n, 16)).astype(BF16)
    gate = rng.standard_normal((requests, next_n, 16)).astype(BF16)
    ape = rng.standard_normal((kpool, 16)).astype(np.float32)
    ring = rng.standard_normal((requests, 2, kpool, 16)).astype(BF16)
    slots = np.arange(requests, dtype=np.int32)
    want, closed = reference.kpool_tail_update(ring.copy(), k, gate, ape, positions, slots)
    got = composite_tail_update(np, ring.copy(), k, gate, ape, positions, slots, kpool)
    assert np.all(closed[:, 0] == last // kpool)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
