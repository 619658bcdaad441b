"""The benchmark's ``torch.ops.kpool`` row and the torch op's host cost, as far as a machine without CUDA shows them.

On a GPU the row times this package's kernel called through
``torch.ops.kpool.compress.out`` (views of the same input sets, ``out=``,
``pool_row_offsets=``, ``validate=False``). Here torch has no CUDA device, so
what is checked is the skip, the call's wiring (on the CuPy double its
tensors are CPU tensors, so the op runs its CPU kernel on the sets' memory)
and the capture check that keeps a replay that launched nothing from being
timed. No test here times anything or asserts a speed.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
from click.testing import CliRunner
from double import run_on_double

from kpool_cupy.backends.cupy import gpu_status
from kpool_cupy.bench import impls, run
from kpool_cupy.bench.shapes import BenchShape
from kpool_cupy.cli import main

NAME = "torch.ops.kpool"


def _torch_has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


needs_no_torch_cuda = pytest.mark.skipif(_torch_has_cuda(), reason="torch has a CUDA device here, so the row runs")
SHAPE = BenchShape("tiny", "mixed", (9, 6), (0, 3), head_dim=16, kpool=4)


@needs_no_torch_cuda
def test_the_row_and_the_host_cost_say_why_they_are_not_run_the_way_the_other_torch_rows_do():
    # One reason for every torch row, so a reader of the table sees one cause.
    why = impls.kpool_torch_op(SHAPE, [])
    assert why in ("torch has no CUDA device", "torch is not installed")
    assert why == impls.torch_eager(SHAPE, []) == impls.torch_compiled(SHAPE, [])
    assert run.torch_op_cost(None, None) == {"torch_op": why}
    assert impls.IMPLEMENTATIONS[NAME] is impls.kpool_torch_op


def test_without_torch_the_row_says_torch_is_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    assert impls.kpool_torch_op(SHAPE, []) == "torch is not installed"
    assert run.torch_op_cost(None, None) == {"torch_op": "torch is not installed"}


@pytest.mark.skipif(gpu_status()[0], reason="this machine has a GPU, so bench runs")
def test_the_row_can_be_skipped_by_name():
    # An unknown name is a usage error before the GPU check; this one passes it.
    result = CliRunner().invoke(main, ["bench", "--skip", NAME])
    assert result.exit_code == 2 and "needs a CUDA GPU" in result.output, result.output


_PRELUDE = """
import contextlib
import numpy as np
import cupy
import torch

assert cupy.__version__.endswith("numpy-double"), cupy.__file__
from kpool_cupy import reference
from kpool_cupy.bench import impls, run, timing
from kpool_cupy.bench.inputs import make_input_sets
from kpool_cupy.bench.shapes import BenchShape

SHAPE = BenchShape("tiny", "mixed", (9, 6, 13), (0, 3, 5), head_dim=16, kpool=4)


def host(array):
    return array.view(np.ndarray).copy()  # the memory as it is, waiting for nothing


def pretend_torch_has_cuda():
    # The double's arrays become CPU tensors, so the op runs its CPU kernel
    # (the reference) on the sets' memory, at once: like a launch on a stream
    # that a capture does not record. The streams torch is given are recorded.
    given = []
    torch.cuda.is_available = lambda: True
    torch.cuda.default_stream = lambda device=None: ("default", device)
    torch.cuda.ExternalStream = lambda pointer, device=None: ("external", pointer, device)

    def stream(value):
        given.append(value)
        return contextlib.nullcontext()

    torch.cuda.stream = stream
    return given
"""


# A guard against a hang: the longest script (a shape's bench with the torch row) ran in 9.5 to 24 s
# (two busy cores, 2026-12-03).
DOUBLE_TIMEOUT_S = 300


def _on_the_double(body: str) -> None:
    pytest.importorskip("torch")
    done = run_on_double(_PRELUDE + textwrap.dedent(body) + "\nprint('ok')\n", timeout=DOUBLE_TIMEOUT_S)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-3000:]


@pytest.mark.slow
def test_the_torch_op_call_writes_the_reference_into_the_sets_out():
    # The call's wiring: positional operands in order, pool_row_offsets= and
    # out= by keyword, out a view of the set's own out (no copy). The CPU
    # kernel is the reference, so the bits are the reference's.
    _on_the_double(
        """
        (s,) = make_input_sets(SHAPE, 1, seed=5)
        s.out.fill(0)
        impls.torch_op_call(s)()
        arrays = [host(a) for a in (s.k, s.gate, s.ape, s.input_row_offsets, s.cache_lengths)]
        want = reference.kpool_compress(*arrays)
        assert want.shape == s.out.shape and want.any()
        assert np.array_equal(host(s.out).view(np.uint16), want.view(np.uint16)), "out is not the reference's"
        """
    )


def test_the_replay_check_passes_a_captured_launch_and_refuses_one_that_ran_at_once():
    # A copy on the current stream is recorded by the capture and replayed;
    # the same copy sent to the legacy stream runs at once and leaves a graph
    # without it, whose replays would time nothing.
    _on_the_double(
        """
        source = cupy.arange(64, dtype=cupy.uint8)
        target = cupy.zeros(64, dtype=cupy.uint8)

        def on_current(i):
            target.data.copy_from_device_async(source.data, 64)

        def on_legacy(i):
            target.data.copy_from_device_async(source.data, 64, cupy.cuda.Stream.null)

        def broken(i):
            raise RuntimeError("no launch")

        assert timing.replay_refusal(on_current, target) is None
        why = timing.replay_refusal(on_legacy, target)
        assert why is not None and "did not rewrite its output" in why, why
        assert timing.replay_refusal(broken, target) == "capture failed: RuntimeError: no launch"
        """
    )


@pytest.mark.slow
def test_a_torch_op_row_whose_replay_writes_nothing_is_timed_by_events_and_says_why():
    # The row sets torch's stream to CuPy's current one for each call (the
    # capture stream while capturing, torch's default stream for the legacy
    # one). Here the op writes at once, so the replay check must refuse the
    # graph; the row is then timed by events, and its output compared.
    _on_the_double(
        """
        given = pretend_torch_has_cuda()
        record = run.bench_shape(SHAPE, ["kpool-cupy", "torch.ops.kpool"], samples=1)
        entry = record["implementations"]["torch.ops.kpool"]
        assert entry["timing"] == "events-around-python", entry
        assert "did not rewrite its output" in entry["timing_note"], entry
        assert entry["median_ms"] > 0 and entry["time_over_kpool_cupy"] > 0
        # The reference against the emulator: a rounding apart at most.
        assert entry["max_abs_diff_vs_kpool_cupy"] < 0.1, entry
        assert record["implementations"]["kpool-cupy"]["timing"] == "graph"
        assert ("default", 0) in given
        external = [g for g in given if g[0] == "external"]
        assert external and all(g[1] != 0 and g[2] == 0 for g in external), given
        """
    )


@pytest.mark.slow
def test_the_host_cost_measures_the_torch_op_where_torch_has_cuda():
    _on_the_double(
        """
        pretend_torch_has_cuda()
        host_cost = run.host_costs(SHAPE, repeats=1)
        assert "torch_op" not in host_cost, host_cost
        assert host_cost["call_us_torch_op"] > 0
        assert host_cost["torch_op_over_cupy_us"] == host_cost["call_us_torch_op"] - host_cost["call_us_validate_off"]
        assert isinstance(host_cost["torch_op_matches"], bool)  # the reference here, not the kernel: maybe not
        """
    )
