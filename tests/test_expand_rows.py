"""kpool_expand_topk's row writer (kernels/kpool_expand.cuh): a block a row and span of 1,024 columns, the
request found by one warp in rounds of five search levels, runs of four columns that read one pool id and one
table entry where kpool and block_size allow, 16-byte stores where a run is aligned.

Each test below drives one of those paths past its edge (several spans, several search rounds, runs that cross
pools and pages, misaligned rows); the reference (independent NumPy, itself held to a plain per-element model in
test_expand_topk_slots.py) is the oracle, and the requests come from kp::find_request's own search, so garbage
offsets must land where the binary search lands too.
"""

from __future__ import annotations

import numpy as np
import pytest

from kpool_cupy import emulate, reference
from kpool_cupy.emulator.launch import recording
from kpool_cupy.kernel.requests import find_request


def _both(ids, offsets, cache, **kwargs):
    got = emulate.kpool_expand_topk(ids, offsets, cache, validate=False, **kwargs)
    want = reference.kpool_expand_topk(ids, offsets, cache, validate=False, **kwargs)
    pairs = zip(got, want, strict=True) if kwargs.get("compact") else ((got, want),)
    for g, w in pairs:
        np.testing.assert_array_equal(g, w, err_msg=str({k: v for k, v in kwargs.items() if k != "block_table"}))
    return got


@pytest.mark.parametrize("kpool, block_size", [(1, 4), (2, 3), (3, 4), (4, 64), (4, 6), (8, 4), (12, 8), (128, 64)])
def test_rows_wider_than_a_span_through_every_run_shape(kpool, block_size):
    # 700 pools a row: 700 * kpool columns, more than one span of 1,024 from kpool 2 up, so spans, runs that
    # cross a pool (kpool < 4, kpool 3 and 12 not multiples of 4) or a page (block sizes 3 and 6), and the
    # tail's columns past the pools' all occur. Cached lengths put the tail at every phase.
    rng = np.random.default_rng(kpool * 100 + block_size)
    offsets = np.array([0, 2, 3, 5], np.int32)
    cache = rng.integers(0, 5000, 3).astype(np.int32)
    ids = rng.integers(-1, 2000, (5, 700)).astype(np.int32)
    table = rng.integers(-1, 10_000, (3, (2000 * kpool + 5100) // block_size + 1)).astype(np.int32)
    for tail in (False, True):
        for compact in (False, True):
            _both(ids, offsets, cache, kpool=kpool, always_select_tail=tail, compact=compact)
            _both(ids, offsets, cache, kpool=kpool, always_select_tail=tail, compact=compact, block_table=table,
                  block_size=block_size)  # fmt: skip


@pytest.mark.parametrize("batch", [1, 2, 31, 32, 33, 1023, 1024, 1025, 1500])
def test_the_warp_search_takes_the_binary_searchs_request_for_any_batch(batch):
    # A round reads five levels of the search (31 nodes, a lane each): 1 round up to 32 requests, 2 up to 1,024,
    # 3 past it. Many requests hold no token, so the search's neighbours differ.
    rng = np.random.default_rng(batch)
    lengths = rng.integers(0, 3, batch) * (rng.random(batch) < 0.3)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens = int(offsets[-1])
    cache = rng.integers(0, 50, batch).astype(np.int32)
    ids = rng.integers(-1, 20, (tokens, 2)).astype(np.int32)
    table = np.arange(batch * 40, dtype=np.int32).reshape(batch, 40)  # each request's own pages: slots say which
    got = _both(ids, offsets, cache, kpool=3, always_select_tail=True, block_table=table, block_size=4)
    # The plain rule, too: the owner of each selected slot is the token's request.
    request = np.searchsorted(offsets, np.arange(tokens), side="right") - 1
    slots = got.astype(np.int64)
    owner = np.where(slots >= 0, slots // 4 // 40, -1)
    assert ((owner == request[:, None]) | (slots < 0)).all()


@pytest.mark.parametrize("batch", [40, 1100])
def test_garbage_offsets_land_where_the_binary_search_lands(batch):
    # Unsorted offsets and lengths (validate=False): the warp's rounds must walk exactly kp::find_request's
    # steps, which the reference runs step for step (kernel/requests.py). Tokens land in some request's rows
    # often enough that the table is read.
    rng = np.random.default_rng(batch + 7)
    tokens = 60
    offsets = np.sort(rng.integers(0, tokens + 1, batch + 1))
    spoiled = rng.random(batch + 1) < 0.1  # out of order, negative or past the tokens
    offsets[spoiled] = rng.integers(-5, tokens + 5, int(spoiled.sum()))
    offsets = offsets.astype(np.int32)
    cache = rng.integers(-3, 40, batch).astype(np.int32)
    ids = rng.integers(-2, 15, (tokens, 3)).astype(np.int32)
    table = rng.integers(-1, 500, (batch, 20)).astype(np.int32)
    found = find_request(offsets.astype(np.int64), batch, np.arange(tokens))
    assert len(set(found.tolist())) > 3  # the searches end in several places
    for compact in (False, True):
        _both(ids, offsets, cache, kpool=3, always_select_tail=True, compact=compact, block_table=table, block_size=2)


def test_aligned_runs_store_16_bytes_and_misaligned_rows_the_same_values_without():
    rng = np.random.default_rng(3)
    offsets, cache = np.array([0, 4], np.int32), np.array([37], np.int32)
    ids = rng.integers(-1, 300, (4, 300)).astype(np.int32)
    want = reference.kpool_expand_topk(ids, offsets, cache, kpool=4)
    buffer = np.full(4 * 1200 + 1, 7, np.int32)
    for out, vector in ((buffer[:-1].reshape(4, 1200), True), (buffer[1:].reshape(4, 1200), False)):
        with recording() as launches:
            got = emulate.kpool_expand_topk(ids, offsets, cache, kpool=4, out=out)
        assert got is out
        np.testing.assert_array_equal(got, want)
        assert (launches[0].vector_accesses == 4 * 1200 // 4) == vector, launches  # every run one store, or none
        assert launches[0].grid == 4 * 2  # a block a row and span: 1,200 columns are two spans


def test_tail_positions_stop_at_int32s_edge():
    # kpool 5 and 2^31 cached positions: the token sees 2^31 + 1, its tail holds 4 positions from 2^31 - 3, of
    # which the last would pass int32 and is -1 (the row's tail count is cut where its positions would pass it).
    cache = np.array([2**31], np.int64)
    got = _both(np.zeros((1, 1), np.int32), np.array([0, 1], np.int32), cache, kpool=5, always_select_tail=True)
    np.testing.assert_array_equal(got[0, 5:], [2**31 - 3, 2**31 - 2, 2**31 - 1, -1])


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_a_row_wider_than_int32_columns_is_refused_naming_pool_ids(module):
    # 2^21 + 1 pools of 1,024 positions: 2^31 + 1,024 columns, which the kernel cannot count in 32 bits.
    ids = np.zeros((1, 2**21 + 1), np.int32)
    with pytest.raises(ValueError, match=r"Invalid pool_ids: expected pool_topk \* kpool \+ tail <= 2147483647"):
        module.kpool_expand_topk(ids, np.array([0, 1], np.int32), np.array([0], np.int32), kpool=1024)


@pytest.mark.parametrize("kpool, block_size", [(4, None), (4, 64), (4, 16), (8, 16), (4, 6), (2, 16)])
def test_selected_rows_write_whole_passes_as_the_general_loop_would(kpool, block_size):
    # kpool_index_topk's rows (kp::write_expanded_row, which the fused select shares): without COMPACT, the passes
    # of 1,024 columns inside the pool columns go through a loop of their own where kpool and the page size are
    # multiples of 4. 300 pools a row: 1,200 columns at kpool 4 (one such pass and a partial one), 2,400 at kpool
    # 8 (two and a partial); the tail's columns after; page sizes 6 and kpool 2 take the general loop alone. The
    # reference is the oracle; table entries past int32's slots and negative ones, and ids of no pool, included.
    # Seen failing with the whole loop's pool id read one pool off (no other test wrote such a pass).
    rng = np.random.default_rng(kpool * 1000 + (block_size or 0))
    offsets = np.array([0, 2, 3], np.int32)
    cache = np.array([4000, 2500], np.int32)  # 500 pools or more a token at kpool 8: more than 300 to select
    width = (int(cache.max()) + 3) // kpool + 1  # every pool a token sees
    logits = rng.standard_normal((3, width)).astype(np.float32)
    logits[0, :50] = np.nan  # no pool beats a number, whatever its id
    paged = {}
    if block_size is not None:
        pages = -(-(int(cache.max()) + 3) // block_size)
        table = rng.integers(0, 100_000, (2, pages)).astype(np.int32)
        table[0, ::7] = -1
        table[1, ::5] = 2**31 // block_size  # its slots pass int32: -1
        paged = {"block_table": table, "block_size": block_size}
    call = {"kpool": kpool, "pool_topk": 300, **paged}
    for tail in (False, True):
        for compact in (False, True):
            got = emulate.kpool_index_topk(logits, offsets, cache, always_select_tail=tail, compact=compact, **call)
            want = reference.kpool_index_topk(logits, offsets, cache, always_select_tail=tail, compact=compact, **call)
            for g, w in zip(got if compact else (got,), want if compact else (want,), strict=True):
                np.testing.assert_array_equal(g, w, err_msg=f"tail {tail} compact {compact}")


@pytest.mark.usefixtures("sass_tools")
def test_a_whole_run_takes_its_own_path_of_one_id_and_one_table_entry():
    # kpool_expand_topk's run in one pool and one page (kpool 4, pages of 64: every run of the engines' rows)
    # branches to run_values' whole form: one position, one table entry, the other three values consecutive,
    # where the general form kept each of the four columns' work under predicates. The path a row of whole runs
    # takes (tools/expand_paths cuts the other): 631 instructions on sm_90, 923 with the general form; 516 since
    # the request search walks in 32 bits (2026-12-07). The bound leaves 5% for changes elsewhere and fails at
    # the general form.
    from kpool_cupy.kernel.declarations import EXPAND_TOPK
    from kpool_cupy.kernel.sources import kernel_source
    from kpool_cupy.tools.expand_paths import whole_runs_code
    from kpool_cupy.tools.sass import summarize_code_sass

    name = EXPAND_TOPK.instance(KPOOL=4, IPID=np.int32, IO=np.int32, IC=np.int32, PAGED=True, COMPACT=False)
    summary = summarize_code_sass(whole_runs_code(kernel_source(EXPAND_TOPK.source)), name)
    assert summary.instructions <= 542, summary.instructions
