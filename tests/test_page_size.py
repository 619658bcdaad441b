"""kp::PageSize (kp::Divisor, kernels/kpool_common.cuh, which the expansion divides by kpool and the page size
with too) and kp::find_key_pages (kernels/kpool_index.cuh), on the emulator and on a GPU: a division by the
page size as a multiply and a shift gives exact quotients for every pool id below 2^31 and every page size the
kernels take (clamped to [1, 2^31]), and the key pages a lane finds at each step (8, 16, 32 pools) are those of
exact integer division: the table's entry where the pool is below its reach (taken at most 2^31 - 1) and its
column inside the table, -1 elsewhere, and the pool's row in its page; so is the sm_90a paths' page of a tile
that lies in one page (kp::wgmma_find_tile_page)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kpool_cupy.emulator.launch import launch_code
from kpool_cupy.kernel.sources import kernel_source

ROOT = Path(__file__).resolve().parent.parent
THREADS = 128
STEPS = (8, 16, 32)  # the mma.sync lane's step; kp::WgmmaKeyPart's kRowStep at head_dim 128 and 64
TABLE_COLUMNS = 40
INT32_MAX = 2**31 - 1


def page_code() -> str:
    """tests/kernels/page_size.cu after the index header (and what it includes)."""
    code = kernel_source("kpool_portability.h") + kernel_source("kpool_index.cuh")
    return code + '#line 1 "tests/kernels/page_size.cu"\n' + (ROOT / "tests" / "kernels" / "page_size.cu").read_text()


def clamped(block_sizes: np.ndarray) -> np.ndarray:
    """The page size the kernels divide by (kp::block_size32): block_size clamped to [1, 2^31]."""
    return np.clip(block_sizes, 1, 2**31)


def quotient_cases() -> tuple[np.ndarray, np.ndarray]:
    """(block_sizes int64, pools uint32): every page size near a power of two, the extremes and the clamped
    (0, negative, past 2^31), each against the pools next to its multiples, the largest pool ids and random
    ones; then random pairs. The largest pools make n e largest, where an inexact multiplier would show."""
    rng = np.random.default_rng(7)
    powers = [2**k + o for k in range(32) for o in (-1, 0, 1)]
    sizes = sorted({s for s in powers if s >= 1} | {3, 5, 7, 63, 65, 100, 1000, 2**31, 2**40, 0, -5})
    block_sizes, pools = [], []
    for size in sizes:
        d = int(clamped(np.array([size]))[0])
        near = [0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, 3 * d + 1, INT32_MAX, INT32_MAX - 1, INT32_MAX - d]
        top = INT32_MAX // d * d  # the largest multiple below 2^31, and its neighbours
        near += [top - 1, top, top + 1] + [int(x) for x in rng.integers(0, 2**31, 8)]
        near = [n for n in near if 0 <= n <= INT32_MAX]
        block_sizes += [size] * len(near)
        pools += near
    block_sizes += [int(x) for x in rng.integers(1, 2**31 + 1, 4000)]
    pools += [int(x) for x in rng.integers(0, 2**31, 4000)]
    return np.array(block_sizes, np.int64), np.array(pools, np.uint32)


def emulated_quotients(block_sizes: np.ndarray, pools: np.ndarray) -> np.ndarray:
    quotients = np.full(pools.size, 0xDEADBEEF, np.uint32)
    grid = -(-pools.size // THREADS)
    launch_code(page_code(), "page_quotients", grid, THREADS, (block_sizes, pools, np.int64(pools.size), quotients))
    return quotients


def test_the_page_sizes_multiply_divides_every_pool_id_exactly():
    block_sizes, pools = quotient_cases()
    want = pools.astype(np.int64) // clamped(block_sizes)
    got = emulated_quotients(block_sizes, pools)
    wrong = np.flatnonzero(got.astype(np.int64) != want)
    assert wrong.size == 0, [(int(block_sizes[i]), int(pools[i]), int(got[i]), int(want[i])) for i in wrong[:5]]


def test_the_multiply_divides_exactly_by_every_kpool_and_page_size():
    # kp::divisor_of's multiplier in NumPy (m = ceil(2^(31 + l) / d), l = ceil(log2 d); a quotient is n m >>
    # (31 + l)), for every divisor the expansion takes (kpool <= 1,024, block_size <= 2^20) at the numerators
    # where an inexact multiplier would show first (the largest multiples below 2^31 and their neighbours, 2^31
    # - 1): the emulated test above holds the kernel to exact division at sampled divisors, this one the formula
    # at all of these. Seen failing with m rounded down.
    d = np.arange(1, 2**20 + 1, dtype=np.uint64)
    bits = np.frexp((d - np.uint64(1)).astype(np.float64))[1].astype(np.uint64)  # l: d - 1's bit length
    multiplier = ((np.uint64(1) << (np.uint64(31) + bits)) + d - np.uint64(1)) // d
    assert (multiplier < 2**32).all()
    top = np.uint64(INT32_MAX) // d * d
    for n in (
        top - np.uint64(1),
        top,
        np.minimum(top + np.uint64(1), np.uint64(INT32_MAX)),
        np.full_like(d, INT32_MAX),
    ):
        quotient = (n * multiplier) >> (np.uint64(31) + bits)
        wrong = np.flatnonzero(quotient != n // d)
        assert wrong.size == 0, [(int(d[i]), int(n[i])) for i in wrong[:5]]


def key_page_cases() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(block_sizes, first_pools, reaches), int64: pages smaller and larger than every step; first pools at and
    next to page bounds; reaches before, inside and past the four steps, and past 2^31 - 1 (a kernel takes them
    at most that); first pools whose steps cross the table's end, the pool ids near 2^31, and negative first
    pools (garbage no caller passes: no page, so no entry outside its page)."""
    rng = np.random.default_rng(11)
    block_sizes, firsts, reaches = [], [], []
    for size in (1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 100, 2**31, 2**40):
        d = int(clamped(np.array([size]))[0])
        starts = {0, 1, d - 1, d, d + 1, 2 * d - 3} | {int(x) for x in rng.integers(0, 400, 6)}
        starts |= {INT32_MAX - 40, INT32_MAX - 1, -1, -d - 5, -(2**31) - 7}  # negative: garbage, never a caller's
        for first in sorted(s for s in starts if s <= INT32_MAX):
            for reach in (first, first + 1, first + 9, first + 17, first + 40, first + 200, INT32_MAX, 2**40):
                block_sizes.append(size)
                firsts.append(first)
                reaches.append(reach)
    return np.array(block_sizes, np.int64), np.array(firsts, np.int64), np.array(reaches, np.int64)


def model_key_pages(step, block_sizes, firsts, reaches, table):
    """The pages (-1 where none: none at all from a negative first pool) and the entries of exact division,
    entries compared where a page is found."""
    d = clamped(block_sizes)[:, None]
    pools = firsts[:, None] + step * np.arange(4)[None, :]
    columns = pools // d
    found = (pools < np.minimum(reaches, INT32_MAX)[:, None]) & (columns < table.size) & (firsts >= 0)[:, None]
    pages = np.where(found, table[np.clip(columns, 0, table.size - 1)], -1)
    return pages, pools % d, found


def emulated_key_pages(step, block_sizes, firsts, reaches, table):
    count = firsts.size
    pages = np.full(4 * count, -7, np.int32)
    entries = np.zeros(4 * count, np.uint32)
    args = (block_sizes, firsts, reaches, np.int64(count), table, np.int64(table.size), pages, entries)
    launch_code(page_code(), f"key_pages_step{step}", -(-count // THREADS), THREADS, args)
    return pages.reshape(count, 4), entries.reshape(count, 4)


@pytest.mark.parametrize("step", STEPS)
def test_a_lanes_key_pages_are_those_of_exact_division(step):
    block_sizes, firsts, reaches = key_page_cases()
    table = np.arange(1000, 1000 + TABLE_COLUMNS, dtype=np.int32)
    want_pages, want_entries, found = model_key_pages(step, block_sizes, firsts, reaches, table)
    pages, entries = emulated_key_pages(step, block_sizes, firsts, reaches, table)
    assert found.any() and (~found).any()  # both kinds of step are there
    wrong = np.flatnonzero((pages != want_pages).any(axis=1) | ((entries != want_entries) & found).any(axis=1))
    cases = [(int(block_sizes[i]), int(firsts[i]), int(reaches[i]), pages[i].tolist(), want_pages[i].tolist(),
              entries[i].tolist(), want_entries[i].tolist()) for i in wrong[:3]]  # fmt: skip
    assert wrong.size == 0, cases


def test_a_tiles_page_is_that_of_exact_division():
    # The sm_90a paths' one-page tiles (kp::wgmma_find_tile_page): the page of the tile's first pool where it is
    # below its reach (taken at most 2^31 - 1) and not negative (garbage no caller passes) and its column inside
    # the table, -1 elsewhere; a row's entry is its first pool's row in the page plus the row.
    code = kernel_source("kpool_portability.h") + kernel_source("kpool_index_wgmma.cuh")
    code += '#line 1 "tests/kernels/tile_page.cu"\n' + (ROOT / "tests" / "kernels" / "tile_page.cu").read_text()
    rng = np.random.default_rng(13)
    cases = []
    for size in (64, 128, 192, 640, 2**20, 2**31, 2**40):
        d = int(clamped(np.array([size]))[0])
        for first in (
            0,
            64,
            d - 64,
            d,
            5 * d,
            INT32_MAX - 63,
            INT32_MAX,
            2**31,
            -64,
            -(2**31),
            *rng.integers(0, 2**31, 3),
        ):
            for reach in (int(first) + 1, int(first), INT32_MAX, 2**40):
                cases.append((size, int(first), reach, int(rng.integers(0, 64))))
    columns = list(zip(*cases, strict=True))
    block_sizes, firsts, reaches = (np.array(column, np.int64) for column in columns[:3])
    rows = np.array(columns[3], np.uint32)
    table = np.arange(1000, 1000 + TABLE_COLUMNS, dtype=np.int32)
    pages = np.full(len(cases), -7, np.int32)
    entries = np.zeros(len(cases), np.uint32)
    args = (block_sizes, firsts, reaches, rows, np.int64(len(cases)), table, np.int64(table.size), pages, entries)
    launch_code(code, "tile_pages", -(-len(cases) // THREADS), THREADS, args)
    d = clamped(block_sizes)
    found = (firsts < reaches) & (firsts < INT32_MAX) & (firsts >= 0) & (firsts // d < table.size)
    want_pages = np.where(found, table[np.clip(firsts // d, 0, table.size - 1)], -1)
    want_entries = (firsts % d + rows).astype(np.uint32)
    assert found.any() and (~found).any()
    wrong = np.flatnonzero((pages != want_pages) | ((entries != want_entries) & found))
    assert wrong.size == 0, [(cases[i], int(pages[i]), int(want_pages[i])) for i in wrong[:3]]


@pytest.mark.gpu
def test_gpu_page_size_divides_and_finds_pages_as_the_emulator():
    # NVRTC's build of the same text: __clz, the 64-bit product and its shift as the emulator's host build.
    import cupy

    from kpool_cupy.kernel.sources import NVRTC_OPTIONS

    module = cupy.RawModule(code=page_code(), options=NVRTC_OPTIONS)
    block_sizes, pools = quotient_cases()
    quotients = cupy.zeros(pools.size, np.uint32)
    module.get_function("page_quotients")(
        (-(-pools.size // THREADS),), (THREADS,),
        (cupy.asarray(block_sizes), cupy.asarray(pools), np.int64(pools.size), quotients),
    )  # fmt: skip
    assert np.array_equal(cupy.asnumpy(quotients), pools.astype(np.int64) // clamped(block_sizes))
    block_sizes, firsts, reaches = key_page_cases()
    table = np.arange(1000, 1000 + TABLE_COLUMNS, dtype=np.int32)
    for step in STEPS:
        want_pages, want_entries, found = model_key_pages(step, block_sizes, firsts, reaches, table)
        pages = cupy.full(4 * firsts.size, -7, np.int32)
        entries = cupy.zeros(4 * firsts.size, np.uint32)
        args = (cupy.asarray(block_sizes), cupy.asarray(firsts), cupy.asarray(reaches), np.int64(firsts.size),
                cupy.asarray(table), np.int64(table.size), pages, entries)  # fmt: skip
        module.get_function(f"key_pages_step{step}")((-(-firsts.size // THREADS),), (THREADS,), args)
        got_pages, got_entries = cupy.asnumpy(pages).reshape(-1, 4), cupy.asnumpy(entries).reshape(-1, 4)
        assert np.array_equal(got_pages, want_pages), step
        assert np.array_equal(np.where(found, got_entries, 0), np.where(found, want_entries, 0)), step
