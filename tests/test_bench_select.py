"""The selection's benchmark records, as far as a machine without a GPU shows them: bytes, shapes, and the
records' orchestration through the CuPy double (the fused call, the two calls and the torch composite's skip).
No test here times anything or asserts a speed."""

from __future__ import annotations

import textwrap

import pytest
from double import run_on_double

from kpool_cupy.bench import select
from kpool_cupy.bench.index import HEAD_DIM, IndexShape


def test_the_fused_call_is_credited_with_keys_and_queries_read_and_positions_written():
    shape = IndexShape("decode", 32, 64, 2, 131072)
    keys = 64 * (131072 // 4) * (HEAD_DIM + 4)
    queries = 128 * 32 * (HEAD_DIM + 4)
    assert select.select_bytes(shape) == keys + queries + 128 * 512 * 4 * 4


def test_the_shapes_are_the_issues():
    shapes = select.select_shapes()
    decode = [s for s in shapes if s.kind == "decode"]
    assert {(s.requests, s.next_n, s.context) for s in decode} == {
        (b, n, c) for b in (1, 64, 512) for n in (1, 2) for c in (8192, 131072)
    }
    assert {(s.tokens, s.context) for s in shapes if s.kind == "prefill"} == {(2048, 131072), (8192, 131072)}
    assert all(s.heads == 32 for s in shapes) and set(select.select_shapes(quick=True)).isdisjoint(shapes)


# A guard against a hang: the records on the double emulate the scorer over 1024 pools for 20 tokens (117 s
# with 68 tokens, 2026-12-04).
DOUBLE_TIMEOUT_S = 900


@pytest.mark.slow
def test_the_records_compare_the_two_calls_bit_for_bit_and_say_why_torch_is_skipped():
    body = """
    import cupy
    assert cupy.__version__.endswith("numpy-double"), cupy.__file__
    import kpool_cupy
    from kpool_cupy.bench import select
    for shape, record in zip(select.select_shapes(quick=True), select.run_select(quick=True, samples=1)):
        ours, two = record["implementations"]["kpool-cupy"], record["implementations"]["kpool-cupy-two-step"]
        assert two["same_as_fused"] is True, record["name"]
        assert ours["time_over_kpool_cupy"] == 1.0 and two["working_bytes"] == shape.tokens * shape.pools * 4
        assert ours["working_bytes"] == kpool_cupy.index_select_workspace_bytes(shape.tokens, 512)
        assert record["bytes"] == select.select_bytes(shape) and record["name"].startswith("select")
        torch = record["implementations"]["torch-composite"]
        assert "skipped" in torch and "torch" in torch["skipped"], torch
    print("ok")
    """
    done = run_on_double(textwrap.dedent(body), timeout=DOUBLE_TIMEOUT_S)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-3000:]
