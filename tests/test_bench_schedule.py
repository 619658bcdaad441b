"""The benchmark's order and timing rules on the CPU: rounds of 32 calls at least, 20 ms of warm-up, the empty
kernel, the FP8 decode and ring-close records and the host cost of the hot FP8 decode call, the short records
before the sweep.

The rules run through the CuPy double (tests/cupy_double), whose "device"
time is the CPU's: nothing here asserts a speed, only what was run and
recorded.
"""

from __future__ import annotations

import textwrap

import pytest
from double import run_on_double

from kpool_cupy.bench import ring_close_fp8, tail_fp8
from kpool_cupy.bench.empty import over_empty
from kpool_cupy.bench.lifecycle import DecodeShape, tail_update_bytes
from kpool_cupy.bench.report import table

# A guard against a hang: each script ran in 3 to 40 s here (two busy cores).
DOUBLE_TIMEOUT_S = 600


def _on_the_double(body: str) -> str:
    done = run_on_double(textwrap.dedent(body) + "\nprint('ok')\n", timeout=DOUBLE_TIMEOUT_S)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_a_round_of_few_sets_is_captured_as_32_calls_after_20_ms_of_warm_up():
    # Two input sets, one sample: the graph holds 32 calls (the sets in turn), and
    # warm-up replays run until the events say 20 ms passed (each replay is
    # stretched to 1 ms here, so it takes 20 or more).
    _on_the_double(
        """
        import cupy
        from kpool_cupy.bench import timing
        from kpool_cupy.bench.empty import empty_kernel

        kernel = empty_kernel()
        seen = []
        def run(i):
            seen.append(i)
            kernel((1,), (32,), ())

        elapsed = cupy.cuda.get_elapsed_time
        spans = []
        def stretched(start, end):
            spans.append(max(elapsed(start, end), 1.0))  # at least 1 ms per event pair
            return spans[-1]
        cupy.cuda.get_elapsed_time = stretched

        cupy.cuda.launch_log.clear()
        times = timing.graph_times(run, 2, 1)
        captured = [fate for _, _, fate in cupy.cuda.launch_log if fate == "captured"]
        assert len(captured) == timing.MIN_GRAPH_CALLS == 32, len(captured)
        assert seen[:2] == [0, 1] and seen[2:] == [i % 2 for i in range(32)], seen
        assert sum(spans[:-1]) >= timing.WARMUP_MS == 20.0, spans  # the last span is the sample
        assert len(times) == 1
        """
    )


def test_a_round_of_many_sets_is_captured_once_each():
    _on_the_double(
        """
        import cupy
        from kpool_cupy.bench import timing
        from kpool_cupy.bench.empty import empty_kernel

        kernel = empty_kernel()
        cupy.cuda.launch_log.clear()
        timing.graph_times(lambda i: kernel((1,), (32,), ()), 40, 1)
        assert sum(fate == "captured" for _, _, fate in cupy.cuda.launch_log) == 40
        """
    )


def test_the_fp8_decode_step_is_credited_with_fp8_rows_in_place_of_pooled_rows():
    shape = DecodeShape(64, 2)
    closed = 64 * shape.pools
    assert tail_fp8.tail_fp8_bytes(shape) == tail_update_bytes(shape) - closed * 128 * 2 + closed * (128 + 4)
    # The unfused sequence writes the bf16 rows, reads them back and writes the FP8 rows.
    assert tail_fp8.tail_unfused_bytes(shape) == tail_update_bytes(shape) + closed * 256 + closed * 132


def test_the_fp8_decode_records_cover_batches_1_64_512_at_next_n_1_2_4():
    names = [shape.name for shape in tail_fp8.tail_fp8_shapes()]
    assert names == [f"decode-{r}x{n}" for r in (1, 64, 512) for n in (1, 2, 4)]
    assert all(shape.ring == shape.kpool == 4 for shape in tail_fp8.tail_fp8_shapes())


def test_the_fp8_ring_close_is_credited_with_each_members_rows_and_one_fp8_row():
    shape = ring_close_fp8.RingCloseShape(64)
    # Each request reads k and gate for its 4 members (2 from the ring, 2 from the chunk), writes 128 + 4 bytes.
    assert ring_close_fp8.ring_close_fp8_bytes(shape) == 64 * (4 * 2 * 256 + 132)
    assert ring_close_fp8.ring_close_unfused_bytes(shape) == 64 * (4 * 2 * 256 + 132 + 2 * 256)
    names = [f"ring-close-fp8 {shape.name}" for shape in ring_close_fp8.ring_close_fp8_shapes()]
    assert names == ["ring-close-fp8 chunk-1x16", "ring-close-fp8 chunk-64x16", "ring-close-fp8 chunk-512x16"]
    for bad in ({"from_ring": 0}, {"from_ring": 4}, {"chunk": 1}):  # nothing to close, or too few tokens
        with pytest.raises(ValueError, match=r"^Invalid from_ring: "):
            ring_close_fp8.RingCloseShape(8, **bad)


def test_a_decode_record_is_compared_with_the_empty_kernel_only_by_the_same_method():
    graph = {"median_ms": 0.004, "timing": "graph"}
    record = {"implementations": {"kpool-cupy": dict(graph)}}
    over_empty(record, {"median_ms": 0.002, "timing": "graph"})
    assert record["implementations"]["kpool-cupy"]["time_over_empty_kernel"] == 2.0
    other = {"implementations": {"kpool-cupy": dict(graph)}}
    over_empty(other, {"median_ms": 0.002, "timing": "events-around-python"})
    assert "time_over_empty_kernel" not in other["implementations"]["kpool-cupy"]


def test_the_table_shows_the_empty_kernel_and_the_hot_fp8_decode_call():
    results = {
        "empty_kernel": {"median_ms": 0.0021, "timing": "graph", "calls_per_replay": 4096},
        "host_fp8_decode": {
            "shape": "tail-update-fp8 decode-512x1",
            "call_us": 7.5,
            "bare_launch_us": 5.0,
            "bare_launch_matches": True,
            "overhead_over_bare_us": 2.5,
        },
    }
    lines = table(results)
    assert any(line.startswith("empty-kernel") and "2.10" in line and "4096 calls" in line for line in lines)
    assert any("kpool_tail_update_fp8" in line and "7.5 us" in line for line in lines)
    assert any("5.0 us (same bits); the package adds 2.5 us" in line for line in lines)


@pytest.mark.slow
def test_the_fp8_decode_record_times_both_and_finds_the_same_bytes():
    _on_the_double(
        """
        from kpool_cupy.bench import ring_close_fp8, tail_fp8
        from kpool_cupy.bench.lifecycle import DecodeShape

        record = tail_fp8.bench_tail_update_fp8(DecodeShape(8, 4), samples=1)
        assert record["name"] == "tail-update-fp8 decode-8x4" and record["bytes_unfused"] > record["bytes"]
        ours, theirs = record["implementations"]["kpool-cupy"], record["implementations"]["unfused"]
        assert theirs["same_bytes_as_kpool_cupy"] is True, theirs
        assert ours["timing"] == "graph" and ours["time_over_kpool_cupy"] == 1.0
        cost = tail_fp8.tail_fp8_host_cost(repeats=1, shape=DecodeShape(4, 1))
        assert cost["bare_launch_matches"] is True and cost["call_us"] > 0, cost
        """
    )


@pytest.mark.slow
def test_the_fp8_ring_close_record_times_both_and_finds_the_same_bytes():
    _on_the_double(
        """
        from kpool_cupy.bench import ring_close_fp8

        record = ring_close_fp8.bench_ring_close_fp8(ring_close_fp8.RingCloseShape(8), samples=1)
        assert record["name"] == "ring-close-fp8 chunk-8x16" and record["bytes_unfused"] > record["bytes"]
        ours, theirs = record["implementations"]["kpool-cupy"], record["implementations"]["unfused"]
        assert theirs["same_bytes_as_kpool_cupy"] is True, theirs
        assert ours["timing"] == "graph" and ours["time_over_kpool_cupy"] == 1.0
        """
    )


@pytest.mark.slow
def test_the_backward_record_times_the_kernel_by_graph_replay_against_the_copy():
    # The quick backward record, timed for real on the double: the GPU script's smoke run benches without it.
    _on_the_double(
        """
        from kpool_cupy.bench import backward

        (shape,) = backward.backward_shapes(quick=True)
        record = backward.bench_backward(shape, samples=1)
        assert record["name"] == "backward B2x32 D128 k4" and record["kind"] == "backward", record
        ours = record["implementations"]["kpool-cupy"]
        assert ours["timing"] == "graph" and ours["time_over_kpool_cupy"] == 1.0 and ours["working_bytes"] == 0, ours
        copy = record["copy"]
        assert copy["timing"] == "graph" and copy["bytes_moved"] == 2 * copy["bytes_copied"], copy
        assert abs(copy["bytes_moved"] - record["bytes"]) <= 1 and ours["fraction_of_copy"] > 0, record
        assert set(record["implementations"]["torch-eager-autograd"]) == {"skipped"}  # no CUDA torch here
        """
    )


@pytest.mark.slow
def test_the_short_records_come_before_the_sweep_and_each_is_saved():
    # The JSON a cut run leaves: the host costs, the empty kernel, the decode
    # side, the FP8, scorer, selection and backward records are saved before
    # the sweep's first shape. The order is the question, so the scorer's,
    # the selections' and the backward's records and the decode step's host
    # costs are stand-ins here (the end-to-end runs on the double make them).
    _on_the_double(
        """
        import contextlib
        from kpool_cupy.bench import lifecycle, run, tail_fp8
        from kpool_cupy.bench.lifecycle import DecodeShape
        from kpool_cupy.bench.shapes import sweep

        def stand_in(name):
            return lambda quick, samples: iter([{"name": name}])

        run.run_lifecycle = lambda quick, samples: iter([lifecycle.bench_tail_update(DecodeShape(4, 1), samples)])
        run.run_fp8 = lambda quick, samples: iter(())
        run.run_tail_fp8 = lambda quick, samples: iter([tail_fp8.bench_tail_update_fp8(DecodeShape(4, 2), samples)])
        run.run_ring_close_fp8 = lambda quick, samples: iter(())
        run.run_index, run.run_select = stand_in("index"), stand_in("select")
        run.run_topk, run.run_backward = stand_in("topk"), stand_in("backward")
        run.decode_step_host_costs = lambda repeats, quick: [{"op": "stand-in"}]
        saved = []
        run.run_sweep(sweep(True)[:1], ["kpool-cupy"], 1, contextlib.nullcontext, True,
                      lambda partial: saved.append(sorted(partial)))
        first_shape = next(i for i, keys in enumerate(saved) if "shapes" in keys)
        before = {"host", "empty_kernel", "host_fp8_decode", "lifecycle", "fp8", "index", "select", "backward"}
        assert before <= set(saved[first_shape - 1]), saved

        # --no-host: no host record, and the decode step's ops are not called for one.
        def refuse(*args, **kwargs):
            raise AssertionError("timed the host with --no-host")

        run.decode_step_host_costs = run.host_costs = refuse
        saved.clear()
        run.run_sweep(sweep(True)[:1], ["kpool-cupy"], 1, contextlib.nullcontext, True,
                      lambda partial: saved.append(sorted(partial)), host=False)
        assert saved and not any("host" in keys for keys in saved), saved
        """
    )
