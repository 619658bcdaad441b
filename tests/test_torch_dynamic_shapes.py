"""torch.compile(dynamic=True) over changing batch sizes: each op compiles at most twice, and equals eager.

An engine compiles its decode step once and feeds it every batch size. A
fake kernel that calls int() on a symbolic size installs a guard per size:
one recompile per batch size, and with fullgraph=True the 9th size was a
hard error (FailOnRecompileLimitHit). The checks now keep symbolic sizes
symbolic (``ops.framework.checks.as_size``, ``torch.tensors.SymbolicMetadata``).
"""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

import kpool_cupy.torch as kt  # noqa: E402  (after the skip)

HEAD_DIM, KPOOL, NEXT_N = 16, 4, 2
SIZES = range(1, 21)


def _decode(tail, k, gate, ape, positions, slots):
    return kt.kpool_tail_update(tail, k, gate, ape, positions, slots)


def _decode_fp8(tail, k, gate, ape, positions, slots):
    return kt.kpool_tail_update_fp8(tail, k, gate, ape, positions, slots)


def _decode_fp8_into(tail, k, gate, ape, positions, slots):
    """The FP8 decode step into given rows, and its queries quantized into given rows: the .out overloads, whose
    rows check took int() of the symbolic batch (a recompile a size; helper-58's finding)."""
    pools = (positions.shape[1] + ape.shape[0] - 1) // ape.shape[0]  # the most pools a request's step closes
    out = torch.empty((positions.shape[0], pools, HEAD_DIM), dtype=torch.uint8)
    scales = torch.empty((positions.shape[0], pools))
    written = kt.kpool_tail_update_fp8(tail, k, gate, ape, positions, slots, out=out, out_scale=scales)
    queries = k.reshape(-1, HEAD_DIM).float()
    q, q_scales = torch.empty(queries.shape, dtype=torch.uint8), torch.empty(queries.shape[0])
    kt.hadamard_quant_fp8(queries, out=q, out_scale=q_scales)
    return (*written, q, q_scales)  # out, its scales, closed, the queries


def _prefill(tail, k, gate, ape, offsets, cache, slots):
    pooled, closed = kt.kpool_ring_close(tail, k, gate, ape, offsets, cache, slots)
    inner = kt.kpool_compress(k, gate, ape, offsets, cache)
    kt.kpool_seed_tail(tail, k, gate, offsets, cache, slots)
    return pooled, closed, inner


def _expand(tail, ids, offsets, cache):
    return kt.kpool_expand_topk(ids, offsets, cache, kpool=KPOOL)


INDEX_POOLS = 16  # the scorer's fixed width (max_pools): what a captured or compiled decode step passes


def _score(tail, q, weights, cache, table, offsets, lengths):
    return kt.kpool_index_logits_fp8(q, weights, cache, table, offsets, lengths, kpool=KPOOL, max_pools=INDEX_POOLS)


def _score_arguments(requests: int, g):
    """Decode scoring: NEXT_N tokens a request, 2 heads of head_dim 64, 4-entry pages, each request's 4 pages."""
    q = torch.randint(0, 0x7E, (requests * NEXT_N, 2, 64), generator=g, dtype=torch.uint8)
    weights = torch.randn(requests * NEXT_N, 2, generator=g)
    cache = torch.zeros(4 * requests, 4, 68, dtype=torch.uint8)
    cache[:, :, :64] = torch.randint(0, 0x7E, (4 * requests, 4, 64), generator=g, dtype=torch.uint8)
    cache.view(4 * requests, -1)[:, 4 * 64 :] = torch.ones(4 * requests, 4).view(torch.uint8)
    table = torch.randperm(4 * requests, generator=g).to(torch.int32).reshape(requests, 4)
    offsets = (NEXT_N * torch.arange(requests + 1)).to(torch.int32)
    lengths = torch.randint(0, KPOOL * INDEX_POOLS - NEXT_N, (requests,), generator=g).to(torch.int32)
    return q, weights, cache, table, offsets, lengths


def _select(tail, q, weights, cache, table, offsets, lengths):
    """The engine's decode indexer step: score and select in one call, and the same in two."""
    fused = kt.kpool_index_select_fp8(q, weights, cache, table, offsets, lengths, kpool=KPOOL, pool_topk=3)
    logits = kt.kpool_index_logits_fp8(q, weights, cache, table, offsets, lengths, kpool=KPOOL, max_pools=INDEX_POOLS)
    return fused, kt.kpool_index_topk(logits, offsets, lengths, kpool=KPOOL, pool_topk=3)


def _select_unsized(tail, q, weights, cache, table, offsets, lengths):
    """The two-call step as an engine writes it first, without max_pools: the scorer's width is the data's (an
    unbacked size under torch.compile), which the top-k's checks must not guard on."""
    logits = kt.kpool_index_logits_fp8(q, weights, cache, table, offsets, lengths, kpool=KPOOL)
    return logits, kt.kpool_index_topk(logits, offsets, lengths, kpool=KPOOL, pool_topk=3)


def _arguments(step, requests: int, tail):
    """One call of ``step`` for ``requests`` requests (the ring first, where the step takes one)."""
    g = torch.Generator().manual_seed(requests)
    ape = torch.randn(KPOOL, HEAD_DIM, generator=g)
    slots = torch.arange(requests, dtype=torch.int32)
    if step in (_score, _select, _select_unsized):
        return (tail, *_score_arguments(requests, g))
    if step in (_decode, _decode_fp8, _decode_fp8_into):
        k = torch.randn(requests, NEXT_N, HEAD_DIM, generator=g).to(torch.bfloat16)
        positions = (torch.arange(NEXT_N)[None] + 4 * torch.arange(requests)[:, None] + 2).to(torch.int32)
        return tail, k, k.clone(), ape, positions, slots
    lengths = torch.randint(1, 9, (requests,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(torch.int32)
    if step is _prefill:
        k = torch.randn(int(offsets[-1]), HEAD_DIM, generator=g).to(torch.bfloat16)
        cache = torch.randint(0, 9, (requests,), generator=g).to(torch.int32)
        return tail, k, k.clone(), ape, offsets, cache, slots
    ids = torch.randint(-1, 5, (int(offsets[-1]), 3), generator=g).to(torch.int32)
    return tail, ids, offsets, torch.full((requests,), 20, dtype=torch.int32)


@pytest.mark.parametrize(
    "step",
    [_decode, _decode_fp8, _decode_fp8_into, _prefill, _expand, _score, _select, _select_unsized],
    ids=lambda s: s.__name__[1:],
)
def test_twenty_batch_sizes_compile_at_most_twice_and_equal_eager(step):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")  # AOTAutograd's fake tensors, without inductor's codegen
    compiled = torch.compile(step, backend=counter, dynamic=True, fullgraph=True)
    for requests in SIZES:
        ring = torch.randn((32, 2, 8, HEAD_DIM), generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
        eager_ring = ring.clone()
        got = compiled(*_arguments(step, requests, ring))
        want = step(*_arguments(step, requests, eager_ring))
        got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
        for a, b in zip(got, want, strict=True):
            assert a.shape == b.shape and torch.equal(a.float(), b.float()), (requests, a.shape, b.shape)
        assert torch.equal(ring.float(), eager_ring.float()), requests  # the ring written in place alike
    # The first call may compile for its static sizes; every later size reuses one dynamic graph.
    assert counter.frame_count <= 2, counter.frame_count


def test_a_first_batch_equal_to_next_n_compiles_twice_without_duck_sizing():
    # The README's advice, held: torch gives sizes equal at the first call one symbol (a batch of NEXT_N
    # requests: tokens = table columns = 4) and recompiles when they part, a third compile; with duck sizing
    # off, a first batch of NEXT_N, then 1, then the rest compile twice, as a first batch of 1 does.
    import torch.fx.experimental._config as fx_config
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_select, backend=counter, dynamic=True, fullgraph=True)
    with fx_config.patch(use_duck_shape=False):  # torch's own patch: a monkeypatch undo deleted the setting
        for requests in (NEXT_N, 1, *range(NEXT_N + 1, 12)):
            compiled(*_arguments(_select, requests, None))
    torch._dynamo.reset()  # the graphs compiled without duck sizing stay with this test
    assert counter.frame_count <= 2, counter.frame_count


def _sized_compress(k, gate, ape, offsets, cache, total_pools):
    return kt.kpool_compress(k, gate, ape, offsets, cache, total_pools=total_pools)


def _sized_score(tail, q, weights, cache, table, offsets, lengths, max_pools):
    return kt.kpool_index_logits_fp8(q, weights, cache, table, offsets, lengths, kpool=KPOOL, max_pools=max_pools)


def test_a_size_option_that_changes_compiles_once():
    # total_pools and max_pools were `int?` in the schemas: a graph per value, the 9th a hard error under
    # fullgraph=True, and a total_pools from .item() did not trace (a hostile round). As `SymInt?` they stay
    # symbolic: one graph over twelve values, each row count as given, equal to eager.
    from torch._dynamo.testing import CompileCounterWithBackend

    g = torch.Generator().manual_seed(3)
    k, offsets = torch.randn(30, HEAD_DIM, generator=g), torch.tensor([0, 9, 10, 24, 30], dtype=torch.int32)
    cache, ape = torch.tensor([3, 2, 0, 5], dtype=torch.int32), torch.randn(KPOOL, HEAD_DIM, generator=g)
    scoring = _score_arguments(5, g)
    for step, arguments, values in (
        (_sized_compress, (k, 3 * k, ape, offsets, cache), range(5, 17)),  # 5 pools built; more rows left alone
        (_sized_score, (None, *scoring), range(INDEX_POOLS, INDEX_POOLS + 12)),
    ):
        torch._dynamo.reset()
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(step, backend=counter, dynamic=True, fullgraph=True)
        for value in values:
            got, want = compiled(*arguments, value), step(*arguments, value)
            assert got.shape == want.shape and got.shape[-1 if step is _sized_score else 0] == value
            rows = slice(None) if step is _sized_score else slice(0, 5)  # compress leaves rows past its pools
            assert torch.equal(got[rows], want[rows]), value
        assert counter.frame_count == 1, (step.__name__, counter.frame_count)
    # Eager, a bad size is refused as the reference refuses it, past int64 too (the wrapper passes a size on
    # as it is, and torch's SymInt parser refused 2^63 in its own words before the op's check).
    from kpool_cupy import reference

    for step, arguments, name in (
        (reference.kpool_compress, (k, 3 * k, ape, offsets, cache), "total_pools"),
        (reference.kpool_index_logits_fp8, scoring, "max_pools"),
    ):
        sized = kt.kpool_compress if name == "total_pools" else kt.kpool_index_logits_fp8
        options = {} if name == "total_pools" else {"kpool": KPOOL}
        for bad in (-1, 2**31, 2**63, -(2**64), 2.0, True):
            with pytest.raises((ValueError, TypeError)) as want:
                step(*(t.numpy() for t in arguments), **options, **{name: bad})
            with pytest.raises(type(want.value), match="^" + re.escape(str(want.value)) + "$"):
                sized(*arguments, **options, **{name: bad})
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_scalar_outputs=True):  # a count read from a tensor, inside the graph

        def from_data(k, gate, ape, offsets, cache):
            rows = torch.ops.kpool.pool_row_offsets(offsets, cache, KPOOL)
            total = rows[-1].item()
            return kt.kpool_compress(k, gate, ape, offsets, cache, pool_row_offsets=rows, validate=False,
                                     total_pools=total)  # fmt: skip

        got = torch.compile(from_data, backend="aot_eager", fullgraph=True)(k, 3 * k, ape, offsets, cache)
    assert torch.equal(got, kt.kpool_compress(k, 3 * k, ape, offsets, cache))
    torch._dynamo.reset()
