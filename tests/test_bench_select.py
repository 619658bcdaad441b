"""The selection's benchmark records, as far as a machine without a GPU shows them: bytes, shapes, and the
records' orchestration through the CuPy double (the fused call, the two calls and the torch composite's skip).
No test here times anything or asserts a speed."""

from __future__ import annotations

import textwrap

import pytest
from double import run_on_double

from kpool_cupy.bench import select, topk
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


def test_the_topk_records_are_the_issues_names():
    assert [shape.name for shape in topk.topk_shapes()] == [
        "topk decode-1x1 128K top512",
        "topk decode-64x1 128K top512",
        "topk decode-512x1 128K top512",
        "topk prefill-1x8192 128K top512",
        "topk rising decode-512x1 128K top512",
        "topk kpool1 decode-1x1 128K top2048",
    ]
    plain = topk.topk_shapes()[-1]
    assert (plain.kpool, plain.pools, plain.paged, plain.pool_topk) == (1, 131072, False, 2048)


def test_topk_is_credited_with_the_logits_it_must_read_and_the_positions_it_writes():
    decode = topk.TopkShape("decode", 64, 1, 131072)
    assert topk.topk_bytes(decode) == 64 * 32768 * 4 + 64 * 512 * 4 * 4
    # A prefill chunk of 8 after 2048 cached tokens: token j sees (2048 + j + 1) // 4 pools, 512, 512, 512, then
    # 513 (four tokens) and 514; the three with at most 512 candidates read no logit.
    prefill = topk.TopkShape("prefill", 1, 8, 2056)
    assert topk.visible_pools(prefill) == [512, 512, 512, 513, 513, 513, 513, 514]
    assert topk.topk_bytes(prefill) == 4 * (4 * 513 + 514) + 8 * 512 * 4 * 4


# A guard against a hang: the records on the double emulate the scorer over 1024 pools for 20 tokens (117 s
# with 68 tokens, 2026-12-04).
DOUBLE_TIMEOUT_S = 900


@pytest.mark.slow
def test_the_records_compare_the_two_calls_bit_for_bit_and_say_why_torch_is_skipped():
    body = """
    import cupy
    assert cupy.__version__.endswith("numpy-double"), cupy.__file__
    from kpool_cupy.bench import select, topk
    from kpool_cupy.ops.index_select_fp8 import call_workspace_bytes
    for shape, record in zip(select.select_shapes(quick=True), select.run_select(quick=True, samples=1)):
        ours, two = record["implementations"]["kpool-cupy"], record["implementations"]["kpool-cupy-two-step"]
        assert two["same_as_fused"] is True, record["name"]
        assert ours["time_over_kpool_cupy"] == 1.0 and two["working_bytes"] == shape.tokens * shape.pools * 4
        assert ours["working_bytes"] == call_workspace_bytes(shape.tokens, 512)  # the call's own need
        assert record["bytes"] == select.select_bytes(shape) and record["name"].startswith("select")
        torch = record["implementations"]["torch-composite"]
        assert "skipped" in torch and "torch" in torch["skipped"], torch
    print("ok")
    """
    done = run_on_double(textwrap.dedent(body), timeout=DOUBLE_TIMEOUT_S)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-3000:]
