"""kpool_index_logits_fp8's walk: a block scores a range of several key tiles, loading the next tile's keys and
the pages after them while it scores this one, with its tokens' query rows staged once in shared memory.

At the tests' small shapes the launch gives every block one step of its walk, so these tests shrink the grid the
launcher aims at (kernel.geometry.INDEX_TARGET_BLOCKS) until one block walks the whole row: each logit must keep
the bits it has with one step a block, on every tensor-core path (sm_90's converts each tile's keys once, when a warp
takes them), across requests inside a tile, missing pages and unaligned queries."""

from __future__ import annotations

import numpy as np
import pytest
from index_cases import index_case, repaged

from kpool_cupy import emulate, reference
from kpool_cupy.backends.emulate import EmulateBackend
from kpool_cupy.backends.host import host_binding
from kpool_cupy.emulator.launch import recording
from kpool_cupy.functions import definition
from kpool_cupy.kernel import geometry
from kpool_cupy.kernel.declarations import MMA_E4M3, MMA_E4M3_HMMA, MMA_F16, MMA_WGMMA
from kpool_cupy.ops.framework.binding import bind
from kpool_cupy.ops.index_logits_fp8 import SPEC, tokens_per_block


def _scorer(mma: int):
    class Backend(EmulateBackend):
        def tensor_core(self) -> int:
            return mma

    return bind(definition(SPEC), host_binding("emulate", lambda extras: Backend()))


def _bits(logits: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(logits).view(np.uint32)


def _walks(monkeypatch, case, mma: int, target: int, **options):
    """The logits with the grid aimed at ``target`` blocks, and the pools a block walked (the launch's grid is
    checked against the launcher's geometry)."""
    monkeypatch.setattr(geometry, "INDEX_TARGET_BLOCKS", target)
    with recording() as launches:
        got = _scorer(mma)(*case.args, kpool=case.kpool, **options)
    (launch,) = [entry for entry in launches if entry.kernel_name.startswith("kpool_index_logits_fp8<")]
    tokens, heads, head_dim = case.q.shape
    per_tile = tokens_per_block(heads, head_dim, tokens, len(case.cache_lengths), mma)
    grid, per_block = geometry.index_geometry(tokens, got.shape[1], per_tile, geometry.index_block_pools(head_dim, mma))
    assert launch.grid == grid.grid
    return got, per_block


def _case(head_dim: int, seed: int):
    # Ragged requests (a decode tile of 2 meets request boundaries at odd offsets), long enough cached prefixes for
    # several key tiles of 64 or 128 pools, pages shuffled.
    rng = np.random.default_rng(seed)
    return index_case(
        rng,
        head_dim=head_dim,
        heads=20,
        kpool=2,
        block_size=8,
        counts=(3, 1, 2, 0, 3),
        cache_lengths=(600, 5, 333, 9, 270),
    )


@pytest.mark.parametrize("mma", [MMA_E4M3, MMA_F16, MMA_E4M3_HMMA, MMA_WGMMA])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_one_block_walking_the_whole_row_gives_the_bits_of_one_step_a_block(monkeypatch, head_dim, mma):
    case = _case(head_dim, head_dim + mma)
    one_step, per_block = _walks(monkeypatch, case, mma, target=1 << 20)
    walked, walk = _walks(monkeypatch, case, mma, target=1)
    block_pools = geometry.index_block_pools(head_dim, mma)
    assert per_block == block_pools and walk >= 3 * block_pools, (per_block, walk)  # the walk is what is tested
    np.testing.assert_array_equal(_bits(walked), _bits(one_step))
    want = reference.kpool_index_logits_fp8(*case.args, kpool=case.kpool)
    np.testing.assert_array_equal(np.isneginf(walked), np.isneginf(want))


@pytest.mark.parametrize("mma", [MMA_E4M3, MMA_E4M3_HMMA, MMA_WGMMA])
@pytest.mark.parametrize("target", [1, 2, 5])
def test_missing_pages_and_unaligned_queries_along_the_walk(monkeypatch, target, mma):
    case = _case(128, 11 + target)
    case.cache_block_table[0, 3] = -1  # a hole inside request 0's prefix
    case.cache_block_table[2, 5] = case.cache.shape[0] + 7  # a page past the cache
    raw = np.zeros(case.q.size + 1, np.uint8)
    raw[1:] = case.q.reshape(-1)
    case.q = raw[1:].reshape(case.q.shape)  # one byte off: the stage reads byte by byte
    unchecked = {"validate": False, "max_pools": int(case.visible().max())}  # the table is refused otherwise
    one_step, _ = _walks(monkeypatch, case, mma, target=1 << 20, **unchecked)
    walked, _ = _walks(monkeypatch, case, mma, target=target, **unchecked)
    np.testing.assert_array_equal(_bits(walked), _bits(one_step))
    hole = np.arange(3 * 8, 4 * 8)  # block_size 8: the pools of column 3
    assert np.isneginf(walked[0:3, hole]).all()
    assert np.isfinite(walked[0:3, : 3 * 8]).all()


def test_the_walk_agrees_with_emulate_without_a_target(monkeypatch):
    # The default launch of the public call is one of the geometries above: same bits.
    case = _case(128, 5)
    walked, _ = _walks(monkeypatch, case, MMA_E4M3, target=1)
    default = emulate.kpool_index_logits_fp8(*case.args, kpool=case.kpool)
    np.testing.assert_array_equal(_bits(walked), _bits(default))


@pytest.mark.parametrize(
    ("tokens", "max_pools", "per_tile"),
    [(1, 32768, 1), (64, 32768, 1), (128, 32768, 2), (512, 32768, 1), (1024, 32768, 2), (2048, 2560, 4), (3, 5, 1)],
)
def test_the_grid_covers_every_pool_once_in_whole_steps(tokens, max_pools, per_tile):
    block_pools = geometry.index_block_pools(128, MMA_E4M3)
    grid, per_block = geometry.index_geometry(tokens, max_pools, per_tile, block_pools)
    tiles = grid.items
    ranges = grid.grid // tiles
    assert tiles == -(-tokens // per_tile) and grid.grid == tiles * ranges
    assert per_block % block_pools == 0
    assert (ranges - 1) * per_block < max_pools <= ranges * per_block  # no range empty, none missing
    # Near the target where the pools allow it: a grid of a few waves, not one block per key tile.
    assert grid.grid <= 2 * geometry.INDEX_TARGET_BLOCKS or per_block == block_pools


@pytest.mark.parametrize(("heads", "head_dim"), [(1, 64), (64, 128), (128, 256), (128, 64), (20, 256)])
def test_a_tile_fits_the_kernels_stage(heads, head_dim):
    for tokens, batch in [(1, 1), (2048, 1), (64, 32), (7, 0)]:
        per_tile = tokens_per_block(heads, head_dim, tokens, batch, MMA_E4M3)
        assert 1 <= per_tile <= geometry.INDEX_TILE_TOKENS
        assert per_tile * heads * (head_dim + 16) <= geometry.INDEX_STAGE_BYTES
        # The wgmma path: each token's heads in whole M-tiles of 64 rows.
        per_tile = tokens_per_block(heads, head_dim, tokens, batch, MMA_WGMMA)
        assert 1 <= per_tile <= geometry.INDEX_TILE_TOKENS
        assert per_tile * -(-heads // 64) * 64 * head_dim <= geometry.WGMMA_STAGE_BYTES


@pytest.mark.parametrize("block_size", [64, 128])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_a_tile_in_one_page_gives_the_bits_of_a_tile_across_pages(monkeypatch, head_dim, block_size):
    # The sm_90a walk finds and copies a key tile from one page where the page size is a multiple of 64 (the
    # engines' 64; kp::wgmma_find_tile_page, kp::wgmma_copy_tile_page), else row by row: the same keys in pages
    # of 8 and of block_size give the same bits, with a hole, a page past the cache and a request whose last
    # tile ends inside a page (rows past its reach are read from that page and written -inf).
    case = _case(head_dim, head_dim + block_size)
    hole = slice(block_size, 2 * block_size)  # the pools of a new page: block_size / 8 pages of 8
    case.cache_block_table[0, block_size // 8 : block_size // 4] = -1  # missing in request 0's prefix
    case.cache_block_table[2, block_size // 8 : block_size // 4] = case.cache.shape[0] + 2  # past the cache
    paged = repaged(case, block_size, np.random.default_rng(block_size))
    unchecked = {"validate": False, "max_pools": int(case.visible().max())}  # the holes are refused otherwise
    for target in (1 << 20, 1):  # a step a block, and one block walking the row through the ring
        rows, _ = _walks(monkeypatch, case, MMA_WGMMA, target=target, **unchecked)
        one_page, _ = _walks(monkeypatch, paged, MMA_WGMMA, target=target, **unchecked)
        np.testing.assert_array_equal(_bits(one_page), _bits(rows))
    assert np.isneginf(rows[0:3, hole]).all() and np.isfinite(rows[0:3, :block_size]).all()
    assert np.isneginf(rows[4:6, hole]).all()
