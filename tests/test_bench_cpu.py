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
from kpool_cupy.bench.stats import bandwidth_gbps, fraction_of, input_sets, summarize_times
from kpool_cupy.cli import main
from kpool_cupy.kernel.names import BASELINE_SOURCE, baseline_kernel_name


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


def test_input_sets_span_three_l2_sizes_within_budget():
    assert input_sets(10 * 2**20, 50 * 2**20, 2**34) == 15
    assert input_sets(2**30, 50 * 2**20, 2**34) == 2  # never fewer than two
    assert input_sets(2**20, 50 * 2**20, 8 * 2**20) == 8  # the memory budget caps it


def test_first_member_rows_match_the_reference_mapping():
    shape = BenchShape("m", "mixed", (13, 0, 7, 9, 4), (0, 3, 2, 5, 4), 8, 4)
    offsets = np.concatenate([[0], np.cumsum(shape.lengths)]).astype(np.int64)
    cache = np.asarray(shape.cache, np.int64)
    from kpool_cupy.ops.compress import CompressCall

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
    args = (batch.k, batch.gate, batch.ape, offsets, cached, pools, np.int64(len(cached)), out)
    emulate.launch(BASELINE_SOURCE, baseline_kernel_name(BF16, head_dim, kpool), int(pools[-1]), head_dim, args)
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))


def _synthetic_results():
    entry = {"median_ms": 0.01, "p10_ms": 0.009, "p90_ms": 0.012, "min_ms": 0.009, "runs": 3}
    shapes = []
    for name, nbytes in (("a", 10**6), ("b", 10**8)):
        shapes.append(
            {
                "name": name,
                "bytes": nbytes,
                "copy": {**entry, "gbps": 100.0},
                "implementations": {
                    "kpool-cupy": {**entry, "gbps": 90.0, "fraction_of_copy": 0.9},
                    "triton": {"skipped": "triton is not importable"},
                },
            }
        )
    host = {"shape": "a", "call_us_validate_on": 50.0, "call_us_validate_off": 20.0, "graph_replay_us": 3.0}
    return {"environment": {"gpu": "none (synthetic)", "date": "2026-12-02"}, "shapes": shapes, "host": host}


def test_table_lists_every_implementation_and_skips_with_reasons():
    lines = "\n".join(table(_synthetic_results()))
    assert "kpool-cupy" in lines and "0.90" in lines and "skipped: triton is not importable" in lines
    assert "validate on 50.0 us" in lines


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    plot(_synthetic_results(), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(gpu_status()[0], reason="this machine has a GPU, so bench runs")
def test_bench_without_a_gpu_exits_2_with_one_line():
    result = CliRunner().invoke(main, ["bench"])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "GPU" in result.output


def test_info_works_without_cuda():
    result = CliRunner().invoke(main, ["info"])
    assert result.exit_code == 0, result.output
    for fact in ("numpy", "GPU", "NVRTC", "host C++ compiler", "emulator cache"):
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
    np.testing.assert_array_equal(got.view(np.uint16), want[:, 0].view(np.uint16))
