"""On garbage with validate=False the NumPy kernels write where the CUDA kernels write.

The reference runs each kernel in NumPy, not the op, so even for offsets no
validator would pass (unsorted, overshooting, negative) it must pick the same
requests, write the same rows, ids and ring entries as the emulated kernel,
and pool them to within rounding.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
from garbage import (
    backward_garbage_cases,
    expand_garbage_cases,
    fp8_garbage_cases,
    fp8_ring_garbage_cases,
    garbage_cases,
    ring_garbage_cases,
    select_garbage_cases,
    topk_garbage_cases,
)
from model import TOLERANCES

from kpool_cupy import emulate, reference
from kpool_cupy.backends.host import EMULATE_MMA_VARIABLE
from kpool_cupy.kernel.requests import request_rows

CASES = 120  # per family: every variant of tests/garbage.py, in seconds
IDS = ["emulate", "reference"]
# A sweep's chunks: the first in the default tier, the rest with --full.
SWEEP_4 = [0, *(pytest.param(chunk, marks=pytest.mark.slow) for chunk in range(1, 4))]


def _run(module, function: str, case: dict):
    case = copy.deepcopy(case)  # each backend writes its own copies
    result = getattr(module, f"kpool_{function}")(**case, validate=False)
    written = {name: case[name] for name in ("out", "closed", "tail") if case.get(name) is not None}
    return result, written


def _assert_same(got, want, where: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, where
    if got.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want, err_msg=where)
        return
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    # Which elements were written is exact: zero-initialized outputs stay zero
    # where no pool landed.
    np.testing.assert_array_equal(got64 == 0, want64 == 0, err_msg=where)
    # Pooled values: each backend is within the dtype's tolerance of the exact
    # value (tests/model.py), so of each other within twice that.
    atol, rtol = TOLERANCES[got.dtype]
    np.testing.assert_allclose(got64, want64, atol=2 * atol, rtol=2 * rtol, err_msg=where)


def _compare(function: str, case: dict, label: str) -> None:
    got, got_written = _run(emulate, function, case)
    want, want_written = _run(reference, function, case)
    got_results = got if isinstance(got, tuple) else (got,) if got is not None else ()
    want_results = want if isinstance(want, tuple) else (want,) if want is not None else ()
    for i, (a, b) in enumerate(zip(got_results, want_results, strict=True)):
        _assert_same(a, b, f"{label} result {i}")
    for name in got_written:
        if name == "tail":  # the ring holds raw copies: byte for byte, whatever the dtype (a pair: each ring)
            rings = [r if isinstance(r, tuple) else (r,) for r in (got_written[name], want_written[name])]
            for a, b in zip(*rings, strict=True):
                assert a.tobytes() == b.tobytes(), f"{label} tail"
        else:
            _assert_same(got_written[name], want_written[name], f"{label} {name}")


@pytest.mark.parametrize("chunk", SWEEP_4)
def test_compress_garbage_lands_in_the_same_rows(chunk):
    compared = 0
    for i, case in enumerate(garbage_cases(seed=chunk, count=CASES // 4)):
        if case["out"] is None:  # rows no pool lands in are uninitialized: nothing to compare
            continue
        _compare("compress", case, f"seed {chunk} case {i}")
        compared += 1
    assert compared >= CASES // 16  # about 70% of the cases pass a zeroed out


def _shared_slot(function: str, case: dict) -> bool:
    """Two requests on one ring slot of a call that writes the ring: their writes race (validate=True refuses
    it), so the backends may differ there by contract."""
    if function not in ("seed_tail", "tail_update"):
        return False
    tail = case["tail"]
    max_slots = (tail[0] if isinstance(tail, tuple) else tail).shape[0]
    slots = case["slot_idx"].astype(np.int64)
    inside = slots[(slots >= 0) & (slots < max_slots)]
    return np.unique(inside).size != inside.size


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(4))
def test_lifecycle_garbage_lands_in_the_same_places(chunk):
    compared = 0
    for i, (function, case) in enumerate(ring_garbage_cases(seed=chunk, count=CASES // 4)):
        if _shared_slot(function, case):
            continue
        _compare(function, case, f"seed {chunk} case {i} {function}")
        compared += 1
    assert compared >= CASES // 4  # most cases: a shared slot takes two writers among few slots


def _memory(array: np.ndarray) -> np.ndarray:
    """The whole buffer a view lies in (a padded cache's flat backing, wider rows), padding included."""
    return array if array.base is None else array.base


def _where_in_cache(cache: np.ndarray, memory: np.ndarray, offset: int) -> str:
    """Byte ``offset`` of the cache's backing ``memory`` as a page, entry and part."""
    pages, size, width = cache.shape
    head_dim = width - 4
    relative = offset - (cache.ctypes.data - memory.ctypes.data)
    if relative < 0 or pages == 0:
        return f"byte {offset} of the backing, outside the pages"
    page, inside = divmod(relative, cache.strides[0] if pages > 1 else size * width)
    if page >= pages or inside >= size * width:
        return f"byte {offset} of the backing, in no page (padding or past the last)"
    if inside < size * head_dim:
        return f"page {page} entry {inside // head_dim} value byte {inside % head_dim}"
    return f"page {page} entry {(inside - size * head_dim) // 4} scale"


def _shared_cache_slot(case: dict) -> bool:
    """Two pools may land on one cache slot: two slots, or two block table entries, on one place inside the cache.
    Their writes race (validate=True refuses it), so the backends may differ there by contract."""
    if "cache" not in case:
        return False
    pages, size = case["cache"].shape[:2]
    places, bound = (case["slots"], pages * size) if "slots" in case else (case["block_table"], pages)
    places = places.astype(np.int64).reshape(-1)
    inside = places[(places >= 0) & (places < bound)]
    return np.unique(inside).size != inside.size


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(2))
def test_fp8_garbage_writes_the_same_bytes(chunk):
    # Garbage slots, block tables, caches and out rows for kpool_compress_fp8
    # and odd strides for hadamard_quant_fp8 (tests/garbage.py,
    # fp8_garbage_cases). Their pools are exact on both backends, so the
    # backends must leave every byte of every written buffer the same:
    # values, scales, and the padding and pages no pool reaches, which keep
    # their random bytes. Each backend gets its own arrays from the same
    # seed: a deep copy would make a padded view contiguous.
    pairs = zip(fp8_garbage_cases(chunk, CASES), fp8_garbage_cases(chunk, CASES), strict=True)
    compared = changed = 0
    for i, ((function, got_case), (_, want_case)) in enumerate(pairs):
        if _shared_cache_slot(got_case):
            continue
        label = f"seed {chunk} case {i} {function}"
        names = [name for name in ("cache", "out", "out_scale") if got_case.get(name) is not None]
        before = {name: _memory(got_case[name]).tobytes() for name in names}
        got = getattr(emulate, function)(**got_case, validate=False)
        want = getattr(reference, function)(**want_case, validate=False)
        wrote = False
        for name in names:
            a, b = (
                _memory(got_case[name]).view(np.uint8).reshape(-1),
                _memory(want_case[name]).view(np.uint8).reshape(-1),
            )
            if not np.array_equal(a, b):
                offset = int(np.argmax(a != b))
                where = _where_in_cache(got_case[name], a, offset) if name == "cache" else f"byte {offset}"
                pytest.fail(f"{label}: {name} differs at {where}: got {a[offset]:#04x}, want {b[offset]:#04x}")
            wrote |= a.tobytes() != before[name]
        if function == "hadamard_quant_fp8" and "out" not in got_case:  # new outputs, every row written
            assert got[0].tobytes() == want[0].tobytes(), f"{label}: values"
            assert got[1].tobytes() == want[1].tobytes(), f"{label}: scales"
        compared += 1
        changed += wrote
    assert compared >= CASES * 3 // 4  # a shared slot needs near-valid slots or pages, a tenth of the cases
    assert changed >= CASES // 5  # and many write: the comparison is not of untouched buffers alone


@pytest.mark.slow  # 33 s of compiles cold (26 variants) for its first chunk: the full tier's
@pytest.mark.parametrize("chunk", range(4))
def test_selection_garbage_lands_in_the_same_places(chunk):
    # Garbage offsets, lengths and block tables, logits of any width with ties, NaN and infinities: the
    # reference selects and expands exactly what the kernel does (the results are integers: no bound). A
    # workspace of random bytes is left out: its counters leave rows wrong or unwritten (garbage only after
    # garbage), which the sanitized runs cover.
    for i, (function, case) in enumerate(topk_garbage_cases(seed=chunk, count=CASES // 4)):
        case.pop("workspace", None)
        _compare(function.removeprefix("kpool_"), case, f"seed {chunk} case {i}")


@pytest.mark.parametrize(
    ("path", "chunk"),
    [
        ("e4m3", 0),
        *(pytest.param("e4m3", chunk, marks=pytest.mark.slow) for chunk in range(1, 4)),
        pytest.param("wgmma", 0, marks=pytest.mark.slow),  # 28 s cold: the default tier's budget keeps e4m3's
        pytest.param("hmma", 0, marks=pytest.mark.slow),  # sm_90's path, 33 s
    ],
)
def test_fused_selection_garbage_equals_the_two_calls(monkeypatch, path, chunk):
    # The scorer's garbage with selections on top: the fused call, with a zeroed workspace, equals the same
    # backend's two calls with the logits as wide as the cache table reaches (its candidates' limit without
    # validation), bit for bit on the emulator and on the reference alike. The sm_90a path (wgmma) and sm_90's
    # (hmma) take the default tier's chunk: the sweep's others would add minutes to the full tier for the same kernels.
    monkeypatch.setenv(EMULATE_MMA_VARIABLE, path)
    for i, (_, case) in enumerate(select_garbage_cases(seed=chunk, count=CASES // 8)):
        case.pop("workspace", None)
        label = f"seed {chunk} case {i}"
        scoring = {n: case[n] for n in ("q", "weights", "cache", "cache_block_table", "input_row_offsets")}
        scoring |= {"cache_lengths": case["cache_lengths"], "kpool": case["kpool"]}
        reach = case["cache_block_table"].shape[1] * case["cache"].shape[1]
        selection = {n: v for n, v in case.items() if n not in scoring or n == "kpool"}
        for module in (emulate, reference):
            logits = module.kpool_index_logits_fp8(**scoring, max_pools=reach, validate=False)
            offsets, lengths = case["input_row_offsets"], case["cache_lengths"]
            want = module.kpool_index_topk(logits, offsets, lengths, **selection, validate=False)
            got = module.kpool_index_select_fp8(**case, validate=False)
            for a, b in zip(got if case["compact"] else (got,), want if case["compact"] else (want,), strict=True):
                np.testing.assert_array_equal(a, b, err_msg=f"{label} {module.__name__}")


@pytest.mark.parametrize("module", [emulate, reference], ids=IDS)
@pytest.mark.parametrize("batch, max_blocks", [(1, 0), (0, 2)], ids=["no-columns", "no-rows"])
def test_an_fp8_block_table_without_rows_or_columns_writes_nothing(module, batch, max_blocks):
    # No columns: every pool's block is past the table. No rows: batch 0
    # with eight tokens, reachable with validate=False only. Either way no
    # pool has a page, and every byte of the cache stays.
    k = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    offsets = np.array([0, 8] if batch else [8], np.int32)
    cache = np.full((2, 4, 20), 0xA5, np.uint8)
    table = np.zeros((batch, max_blocks), np.int32)
    args = (k, k, np.zeros((4, 16), np.float32), offsets, np.zeros(batch, np.int32))
    assert module.kpool_compress_fp8(*args, cache=cache, block_table=table, validate=False) is None
    assert (cache == 0xA5).all()


def _packed(full: np.ndarray) -> np.ndarray:
    """Each row's non-negative entries moved left in column order, -1 after: compact=True by its docstring."""
    order = np.argsort(full < 0, axis=1, kind="stable")
    return np.take_along_axis(full, order, axis=1)


def _assert_slots_follow_the_table(plain: np.ndarray, paged: np.ndarray, table: np.ndarray, size: int, label: str):
    """What the docstring defines whatever request garbage offsets pick: a position past the table, or -1, gives -1;
    a slot is some request's entry for the position's block, times block_size, plus the position's place in it."""
    block = np.where(plain >= 0, plain // size, -1)
    undefined = (paged >= 0) & ((plain < 0) | (block >= table.shape[1]))
    assert not undefined.any(), f"{label}: a slot for position {plain[undefined][0]}, -1 or past the table"
    t, c = np.nonzero(paged >= 0)
    slot, position = paged[t, c].astype(np.int64), plain[t, c].astype(np.int64)
    assert (slot % size == position % size).all(), f"{label}: slot offsets in the block differ"
    from_table = (table[:, block[t, c]].astype(np.int64) == (slot // size)[None, :]).any(axis=0)
    assert from_table.all(), f"{label}: slot {slot[~from_table][0]} is no entry of its block's column"


@pytest.mark.parametrize("chunk", SWEEP_4)
def test_expand_garbage_block_tables_land_in_the_same_places(chunk):
    # Garbage tables (0 columns, too few, INT32 extremes, entries whose slot
    # is just past int32) and block sizes from 1 to 2^20, paged, compacting
    # or both, over garbage ids, offsets and lengths. The reference must
    # write what the kernel writes; and since which request garbage offsets
    # pick is the kernel's business, the kernel is also held to what the
    # docstring defines whatever the request: -1 past the table, slots from
    # the table, compact = the full row packed left.
    for i, case in enumerate(expand_garbage_cases(seed=chunk, count=CASES)):
        label = f"seed {chunk} case {i}"
        _compare("expand_topk", case, label)
        full = emulate.kpool_expand_topk(**(case | {"compact": False}), validate=False)
        if case["compact"]:
            positions, counts = emulate.kpool_expand_topk(**case, validate=False)
            np.testing.assert_array_equal(positions, _packed(full), err_msg=label)
            np.testing.assert_array_equal(counts, (full >= 0).sum(axis=1), err_msg=label)
        if case.get("block_table") is not None:
            unpaged = {name: value for name, value in case.items() if name not in ("block_table", "block_size")}
            plain = emulate.kpool_expand_topk(**(unpaged | {"compact": False}), validate=False)
            _assert_slots_follow_the_table(plain, full, case["block_table"], case["block_size"], label)


@pytest.mark.parametrize("module", [emulate, reference], ids=IDS)
@pytest.mark.parametrize("batch, max_blocks", [(1, 0), (0, 2)], ids=["no-columns", "no-rows"])
def test_a_table_without_rows_or_columns_gives_minus_one(module, batch, max_blocks):
    # No columns: every position is past the table (validate=True takes such
    # a table too, when no id is selected and no tail needs a page). No rows:
    # batch 0 with two tokens, reachable with validate=False only. Nothing
    # to read, all -1 (the reference once raised IndexError gathering from it).
    ids = np.array([[-1], [0]], np.int32)
    offsets = np.array([0, 2] if batch else [2], np.int32)
    table = np.zeros((batch, max_blocks), np.int32)
    got = module.kpool_expand_topk(
        ids, offsets, np.zeros(batch, np.int32), kpool=3, block_table=table, block_size=4, validate=False
    )
    assert (got == -1).all()


def _kernel_find_request(offsets: np.ndarray, batch: int, item: int) -> int:
    """kp::find_request of kernels/kpool_common.cuh, transcribed line for line."""
    lo, hi = 0, batch - 1
    while lo < hi:
        mid = lo + (hi - lo + 1) // 2
        if offsets[mid] <= item:
            lo = mid
        else:
            hi = mid - 1
    return lo


def test_the_reference_searches_unsorted_offsets_as_the_kernel_does():
    # Sorted offsets leave one answer; unsorted garbage leaves one per search
    # algorithm, and the reference must take the kernel's.
    from kpool_cupy.backends.reference_kernels import find_request

    rng = np.random.default_rng(5)
    differs_from_searchsorted = 0
    for _ in range(300):
        batch = int(rng.integers(1, 12))
        offsets = rng.integers(-5, 40, batch + 1)
        items = np.arange(-2, 42)
        want = [_kernel_find_request(offsets, batch, int(i)) for i in items]
        np.testing.assert_array_equal(find_request(offsets, batch, items), want)
        naive = np.clip(np.searchsorted(offsets[:batch], items, side="right") - 1, 0, batch - 1)
        differs_from_searchsorted += int((naive != want).any())
    assert differs_from_searchsorted > 0  # the cases above do tell the two apart


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_a_confirmed_guess_picks_the_request_where_the_search_would_not(module):
    # Unsorted pool_row_offsets [0, 5, 0, 3, 8] (batch 4, kpool 4; the launch
    # covers 4 pools, min(16 tokens // 4, 8 rows of out)): pool 0's guess,
    # floor(0 * 4 / 4) = 0, is bracketed by offsets 0 and 5, so the kernel
    # takes request 0 (rows 0-7, its first pool: rows 0-3); the binary search
    # alone would have stopped at request 2 (rows 8-11). Both backends must
    # make the kernel's choice.
    rng = np.random.default_rng(5)
    k = rng.standard_normal((16, 8)).astype(np.float32)
    gate = rng.standard_normal((16, 8)).astype(np.float32)
    ape = rng.standard_normal((4, 8)).astype(np.float32)
    offsets = np.array([0, 8, 8, 12, 16], np.int32)
    cache = np.zeros(4, np.int32)
    pools = np.array([0, 5, 0, 3, 8], np.int32)
    out = np.zeros((8, 8), np.float32)
    module.kpool_compress(k, gate, ape, offsets, cache, pool_row_offsets=pools, out=out, validate=False)
    rows_0_to_3 = module.kpool_compress(k[0:4], gate[0:4], ape, np.array([0, 4], np.int32), np.zeros(1, np.int32))
    rows_8_to_11 = module.kpool_compress(k[8:12], gate[8:12], ape, np.array([0, 4], np.int32), np.zeros(1, np.int32))
    np.testing.assert_array_equal(out[0], rows_0_to_3[0])
    assert not np.array_equal(out[0], rows_8_to_11[0])  # the search's request would pool other rows


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_a_pool_past_the_count_is_not_written_even_where_a_guess_brackets_it(module):
    # Unsorted pool_row_offsets [0, 4, 1] (batch 2, kpool 4): the count is 1, but the launch covers 4 pools
    # (16 tokens // 4, 4 rows of out) and pool 1's guess, floor(1 * 2 / 4) = 0, is bracketed by 0 and 4. The
    # kernel reads the count beside the guess and writes no pool at or past it.
    rng = np.random.default_rng(6)
    k, gate = (rng.standard_normal((16, 8)).astype(np.float32) for _ in range(2))
    ape = rng.standard_normal((4, 8)).astype(np.float32)
    out = np.full((4, 8), np.nan, np.float32)
    offsets, cache, pools = np.array([0, 8, 16], np.int32), np.zeros(2, np.int32), np.array([0, 4, 1], np.int32)
    module.kpool_compress(k, gate, ape, offsets, cache, pool_row_offsets=pools, out=out, validate=False)
    assert not np.isnan(out[0]).any() and np.isnan(out[1:]).all()


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_seed_tail_at_the_int64_limit_writes_nothing(module):
    # An empty request whose cache length is 2^63 - 1 (validate=False): the
    # kernel's loop runs no position; the reference must not wrap into one.
    tail = np.full((2, 2, 4, 8), 7, np.float32)
    k = np.ones((2, 8), np.float32)
    module.kpool_seed_tail(
        tail, k, k, np.array([0, 0, 2], np.int64), np.array([2**63 - 1, 0], np.int64), np.array([0, 1], np.int32),
        validate=False,
    )  # fmt: skip
    assert (tail[0] == 7).all()


@pytest.mark.parametrize("cached", [2**63 - 1, 2**63 - 2], ids=["2^63-1", "2^63-2"])
def test_lengths_at_the_int64_limit_see_every_pool_the_arrays_hold_at_kpool_one(cached):
    # A hostile round's finding: at kpool 1 a token's pool count, cached + local + 1, overflowed int64 (undefined
    # in C++) for a garbage length within a few tokens of 2^63 (validate=False); the emulated top-k then picked
    # pools for some tokens and the reference none. The count now saturates: each token sees every pool there
    # is, cut at the logits' width, max_pools and the table's reach as always, on both backends.
    offsets, lengths = np.array([0, 3], np.int64), np.array([cached], np.int64)
    heads, head_dim = 1, 64
    q = np.full((3, heads, head_dim), 0x38, np.uint8)  # e4m3 1.0
    weights = np.ones((3, heads), np.float32)
    page = np.concatenate([np.full(4 * head_dim, 0x38, np.uint8), np.ones(4, np.float32).view(np.uint8)])
    cache = page.reshape(1, 4, head_dim + 4)  # one page: 4 keys of 1.0, then their scales, 1.0
    table = np.zeros((1, 1), np.int32)
    scoring = (q, weights, cache, table, offsets, lengths)
    for module in (emulate, reference):
        picked = module.kpool_index_topk(np.zeros((3, 3), np.float32), offsets, lengths, kpool=1, pool_topk=2,
                                         validate=False)  # fmt: skip
        np.testing.assert_array_equal(picked, [[0, 1]] * 3)  # all tied: the lowest ids
        logits = module.kpool_index_logits_fp8(*scoring, kpool=1, max_pools=6, validate=False)
        assert (logits[:, :4] == head_dim).all() and np.isneginf(logits[:, 4:]).all()  # pools 4, 5: past the table
        fused = module.kpool_index_select_fp8(*scoring, kpool=1, pool_topk=2, validate=False)
        np.testing.assert_array_equal(fused, [[0, 1]] * 3)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(2))
def test_fp8_ring_garbage_writes_the_same_bytes(chunk):
    # Ring close and tail update into FP8 rows or a cache, over ring and
    # index garbage (tests/garbage.py, fp8_ring_garbage_cases): exact pools,
    # so every byte of every buffer a call writes (the cache and its padding,
    # out, out_scale, closed, the ring) and every result must agree.
    pairs = zip(fp8_ring_garbage_cases(chunk, CASES), fp8_ring_garbage_cases(chunk, CASES), strict=True)
    compared = changed = 0
    for i, ((function, got_case), (_, want_case)) in enumerate(pairs):
        short = function.removeprefix("kpool_").removesuffix("_fp8")
        if _shared_cache_slot(got_case) or _shared_slot(short, got_case):
            continue
        label = f"seed {chunk} case {i} {function}"
        names = [name for name in ("cache", "out", "out_scale") if got_case.get(name) is not None]
        before = {name: _memory(got_case[name]).tobytes() for name in names}
        got = getattr(emulate, function)(**got_case, validate=False)
        want = getattr(reference, function)(**want_case, validate=False)
        for name in names:
            a = _memory(got_case[name]).view(np.uint8).reshape(-1)
            b = _memory(want_case[name]).view(np.uint8).reshape(-1)
            if not np.array_equal(a, b):
                offset = int(np.argmax(a != b))
                where = _where_in_cache(got_case[name], a, offset) if name == "cache" else f"byte {offset}"
                pytest.fail(f"{label}: {name} differs at {where}: got {a[offset]:#04x}, want {b[offset]:#04x}")
            changed += a.tobytes() != before[name]
        got_results = got if isinstance(got, tuple) else (got,)
        for j, (a, b) in enumerate(zip(got_results, want if isinstance(want, tuple) else (want,), strict=True)):
            assert a.tobytes() == b.tobytes(), f"{label}: result {j}"
        closed = got_results[-1]  # closed: the last result in either form
        changed += bool((closed >= 0).any()) and "cache" not in names and "out" not in names  # new rows written
        rings = [r if isinstance(r, tuple) else (r,) for r in (got_case["tail"], want_case["tail"])]
        for a, b in zip(*rings, strict=True):
            assert a.tobytes() == b.tobytes(), f"{label}: tail"
        compared += 1
    assert compared >= CASES * 3 // 4  # a shared slot takes near-valid slots among few
    # About a quarter close a pool somewhere (half the requests hold their
    # tokens, and need a pending pool that the call completes): the
    # comparison is not of untouched buffers alone.
    assert changed >= CASES // 8


def _requests_share_rows(case: dict) -> bool:
    """Two usable requests whose rows overlap (unsorted garbage offsets): both write their pools' d k and d gate
    rows there, a race the backends may settle differently (validate=True refuses such offsets)."""
    offsets = np.asarray(case["input_row_offsets"]).astype(np.int64)
    cached = np.asarray(case["cache_lengths"]).astype(np.int64)
    batch = cached.shape[0]
    begin, end, _, usable = request_rows(offsets, cached, np.arange(batch), case["k"].shape[0])
    spans = sorted((b, e) for b, e, u in zip(begin, end, usable, strict=True) if u and b < e)
    return any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))


def _backward_bounds(case: dict, got: tuple, want: tuple) -> tuple[np.ndarray, ...]:
    """|emulate - reference| allowed on garbage, without a model of which pools garbage offsets pick.

    tests/test_compress_backward.py's agreement bound, taken at its largest
    over the call: a weight w <= 1 errs by c = (2 D + 2)(chunks + 1) 2 +
    2 kpool + 8 units of 2^-24 between the backends, D = 2 max|gate + ape|
    bounding any pool's logit span; d k = w g then differs by (c + 2) u G,
    d gate by (c + kpool + 5) u G 2 K (G = max|grad_pooled|, K = max|k|:
    k - pooled is at most 2 K), each plus one ulp of its dtype where the two
    roundings part; d ape sums at most ``grad rows`` pools (a pool without a
    row is not read), each term's difference plus the additions' rounding.
    """
    from test_compress_backward import ROUND, U, chunks

    k, gate, ape, grad = case["k"], case["gate"], case["ape"], case["grad_pooled"]
    kpool = ape.shape[0]
    key_max = float(np.abs(k.astype(np.float64)).max(initial=0))
    grad_max = float(np.abs(grad.astype(np.float64)).max(initial=0))
    span = 2 * (float(np.abs(gate.astype(np.float64)).max(initial=0)) + float(np.abs(ape).max(initial=0)))
    c = (2 * span + 2) * (chunks(kpool, k.dtype, gate.dtype) + 1) * 2 + 2 * kpool + 8
    pools = grad.shape[0]
    dk = (c + 2) * U * grad_max + 2 * ROUND[k.dtype] * np.abs(want[0].astype(np.float64))
    term = (c + kpool + 5) * U * grad_max * 2 * key_max
    dgate = term + 2 * ROUND[gate.dtype] * np.abs(want[1].astype(np.float64))
    dape = np.full(want[2].shape, pools * (term + pools * U * grad_max * 2 * key_max))
    return dk, dgate, dape


@pytest.mark.parametrize("chunk", SWEEP_4)
def test_backward_garbage_lands_in_the_same_rows(chunk):
    # Garbage offsets, lengths and pool offsets with validate=False, grad_pooled of fewer rows than the pools
    # claimed and at odd strides: the reference's gradients land where the kernels' do, to within the
    # backends' agreement bound; rows no pool reaches are zero on both. Where two requests share rows only
    # d ape (no race: a sum over every pool) is compared.
    compared = shared = wrote = 0
    for i, (_, case) in enumerate(backward_garbage_cases(seed=chunk, count=CASES // 20)):  # about a compile each
        label = f"seed {chunk} case {i}"
        got = emulate.kpool_compress_backward(**copy.deepcopy(case), validate=False)
        want = reference.kpool_compress_backward(**copy.deepcopy(case), validate=False)
        race = _requests_share_rows(case)
        for name, a, b, bound in zip(("grad_k", "grad_gate", "grad_ape"), got, want, _backward_bounds(case, got, want),
                                     strict=True):  # fmt: skip
            if race and name != "grad_ape":
                continue
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            error = np.abs(a64 - b64)
            bad = ~(error <= bound) & ~(np.isnan(a64) & np.isnan(b64))
            if bad.any():
                row, channel = np.argwhere(bad)[0]
                pytest.fail(
                    f"{label} {name}: row {row} channel {channel}: got {a64[row, channel]!r}, want "
                    f"{b64[row, channel]!r}, |error| {error[row, channel]:.3g} > {bound[row, channel]:.3g}"
                )
        compared += 1
        shared += race
        wrote += bool((np.isfinite(b64 := want[0].astype(np.float64)) & (b64 != 0)).any())
    assert compared - shared >= CASES // 40  # most cases compare every output
    assert wrote >= 1  # and some found pools: the comparison is not of untouched buffers alone
