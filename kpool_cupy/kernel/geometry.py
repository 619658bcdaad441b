"""The one launch-geometry rule, shared by the GPU launcher and the CPU emulator.

The emulator runs the grid this returns thread by thread, surplus threads
included, so what it checks is the launch the GPU gets; the NumPy kernels
cover the same work items.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .declarations import MMA_F16, MMA_WGMMA

CHANNELS_PER_THREAD = 8  # kp::kChannelsPerThread in kernels/kpool_common.cuh
# A group of head_dim / 8 threads serves one pool; at 4096 that is one
# 512-thread block, which leaves each thread the 128 registers the kernels use
# at most (tests/test_ptx.py). 8192 would need 1024-thread blocks at 64
# registers, and the launch would fail.
MAX_HEAD_DIM = 4096
# Every kernel's head_dim rule (an op may take fewer: the scorer's, the rotation's), in an error's words.
HEAD_DIM_RULE = f"a positive multiple of {CHANNELS_PER_THREAD} up to {MAX_HEAD_DIM}"


def takes_head_dim(head_dim: int) -> bool:
    """Whether ``head_dim`` (an integer) keeps ``HEAD_DIM_RULE``: whole threads of 8 channels, one block's
    worth at most."""
    return 0 < head_dim <= MAX_HEAD_DIM and head_dim % CHANNELS_PER_THREAD == 0


def check_head_dim(name: str, head_dim: Any) -> None:
    """A head_dim given as a number (a sizing function's, the tools' variants), not read off an array: an integer
    (a TypeError naming ``name`` otherwise) that keeps ``HEAD_DIM_RULE`` (a ValueError otherwise)."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)):
        raise TypeError(f"Invalid {name}: expected an integer, got {type(head_dim).__name__}")
    if not takes_head_dim(int(head_dim)):
        raise ValueError(f"Invalid {name}: expected {HEAD_DIM_RULE}, got {head_dim}")


# kp::kWholePoolBytes and kp::kStreamBytes: a thread loads a whole pool at
# once up to the first, else chunks of the second (tests/test_kernel_codes.py
# compares them with the header).
WHOLE_POOL_BYTES, STREAM_BYTES = 448, 256
TARGET_THREADS_PER_BLOCK = 256  # kp::group_block_bound's floor: a block of groups never has more


def group_block_bound(head_dim: int) -> int:
    """The most threads ``group_geometry`` puts in a block at ``head_dim`` (``kp::group_block_bound``): the
    launch bound of a kernel that needs more than 128 registers a thread (tail update on a split ring)."""
    return max(TARGET_THREADS_PER_BLOCK, head_dim // CHANNELS_PER_THREAD)


@dataclass(frozen=True)
class LaunchGeometry:
    grid: int
    block: int
    items: int  # work items (pools, requests or elements) the grid covers, surplus ones included
    # Dynamic shared memory a block, in bytes: CuPy's shared_mem, the emulator's buffer (KP_DYNAMIC_SHARED). Above
    # 48 KB (less the kernel's static shared memory) the GPU launch opts the function in (backends/cupy_launch).
    shared_bytes: int = 0


def group_geometry(head_dim: int, groups: int) -> LaunchGeometry:
    """Blocks of several groups of head_dim / 8 threads, one group per pool or request, covering ``groups``.

    ``groups`` may exceed the real pool count (when the count lives only on
    the device); the kernel reads the exact count and surplus threads exit.
    """
    lanes = head_dim // CHANNELS_PER_THREAD
    groups_per_block = max(1, TARGET_THREADS_PER_BLOCK // lanes)
    grid = -(-groups // groups_per_block)
    return LaunchGeometry(grid=grid, block=lanes * groups_per_block, items=grid * groups_per_block)


# The blocks a decode step spreads its requests over when it has few: about
# one per SM of an H100/H200 (132), so that a small batch is not served by a
# handful of SMs while the rest idle.
DECODE_BLOCKS = 128


def spread_geometry(head_dim: int, groups: int) -> LaunchGeometry:
    """``group_geometry``'s groups (the decode step's requests, compress's pools), but as few per block as
    spread ``groups`` over about DECODE_BLOCKS blocks, down to one warp (a group that fills a warp or more:
    one group). A warp stays whole where groups are a power-of-two count of lanes, as the FP8 epilogue's
    whole-warp shuffles need; never more groups than ``group_geometry`` puts in a block. Few groups then
    reach about every SM, where ``group_geometry``'s full blocks would leave most of them idle."""
    lanes = head_dim // CHANNELS_PER_THREAD
    most = max(1, TARGET_THREADS_PER_BLOCK // lanes)
    warp = max(1, 32 // lanes)  # the groups one warp holds (all of it where lanes is a power of two)
    wanted = -(-groups // DECODE_BLOCKS)
    groups_per_block = min(most, max(warp, -(-wanted // warp) * warp))
    grid = -(-groups // groups_per_block)
    return LaunchGeometry(grid=grid, block=lanes * groups_per_block, items=grid * groups_per_block)


# kp::kExpandThreads and kp::kExpandSpan (kernels/kpool_expand.cuh): a block writing expanded rows, and the columns
# it writes in one pass (4 a thread).
EXPAND_THREADS, EXPAND_SPAN = 256, 1024
# The most blocks an expansion launches; past it each block takes several rows (the grid's x is at most 2^31 - 1).
MAX_EXPAND_BLOCKS = 1 << 30


def expand_geometry(rows: int, width: int, compact: bool) -> LaunchGeometry:
    """``kpool_expand_topk``'s grid: a block per row and span of EXPAND_SPAN columns, or per row when compacting
    (its valid entries packed left by the row's one block); ``items`` the blocks' work (row spans). Past
    MAX_EXPAND_BLOCKS a block takes several rows."""
    spans = 1 if compact else -(-width // EXPAND_SPAN)
    # A whole number of rows' spans (the kernel finds its span and first row by 32-bit division).
    grid = spans * min(rows, MAX_EXPAND_BLOCKS // spans)
    return LaunchGeometry(grid=grid, block=EXPAND_THREADS, items=rows * spans)


# kp::kApeSlices and kp::kApeColumns (kernels/kpool_compress.cu): the backward's sum of ape's partials, a
# block of 64 slices of 8 consecutive elements (a 32-byte sector).
APE_SLICES, APE_COLUMNS = 64, 8


def ape_sum_geometry(elements: int) -> LaunchGeometry:
    """The grid of ``kpool_compress_backward_ape``: a block per APE_COLUMNS elements; ``items`` the elements."""
    grid = -(-elements // APE_COLUMNS)
    return LaunchGeometry(grid=grid, block=APE_SLICES * APE_COLUMNS, items=grid * APE_COLUMNS)


INDEX_THREADS = 128  # kp::kIndexThreads: 4 warps
INDEX_TILE_TOKENS = 16  # kp::kIndexTileTokens: the most tokens a block's tile holds
INDEX_STAGE_BYTES = 36864  # kp::kIndexStageBytes: shared memory for a tile's query rows
# Blocks the scorer's grid aims at: enough for several waves of an H200's 132 SMs at 2 blocks each, few enough that
# a block walks several key tiles (its staged queries and its load-ahead pay). A choice, not yet tuned on a GPU.
INDEX_TARGET_BLOCKS = 2048


# The sm_90a path (kernels/kpool_index_wgmma.cuh, kp::kMmaWgmma): a key tile of 64 rows (the wgmma's M) a chain, and
# a stage of chunks of 64 query rows (kp::kWgmmaStageBytes), a chunk the wgmma's N.
WGMMA_ROWS = 64
WGMMA_STAGE_BYTES = 32768


def wgmma_tile_bytes(head_dim: int) -> int:
    """A key tile of the sm_90a path: 64 rows of head_dim bytes (kp::wgmma_tile_bytes)."""
    return WGMMA_ROWS * head_dim


WGMMA_STAGES = 3  # kp::kWgmmaStages: the key tiles in the scorer's ring


def index_logits_shared_bytes(heads: int, head_dim: int, tokens_per_block: int, mma: int) -> int:
    """The scorer's dynamic shared memory a block (kp::WgmmaScorerShared): none on the mma.sync paths; on the
    wgmma path a ring of WGMMA_STAGES key tiles and a spare, their scales and presence, then the tile's weights and
    query rows in whole chunks of 64 a token."""
    if mma != MMA_WGMMA:
        return 0
    rows = tokens_per_block * -(-heads // WGMMA_ROWS) * WGMMA_ROWS
    return (WGMMA_STAGES + 1) * (wgmma_tile_bytes(head_dim) + 8 * WGMMA_ROWS) + rows * (4 + head_dim)


SELECT_CHUNK = 1024  # kp::kSelectChunk: candidates a selecting block takes a step
SELECT_GROUP_TOKENS = 4  # kp::kSelectGroupTokens: the most tokens a block of the fused select selects for
# The dynamic shared memory the fused select's group of tokens may take a block: the shared memory a block may opt
# into, 227 KiB on sm_90 (the wgmma path runs there only) and 99 KiB on the mma.sync paths (the least a GPU they
# run on gives: sm_86, sm_89, sm_120), so a launch's group is the same on every GPU of a path and on the emulator;
# less SELECT_STATIC_RESERVE for the kernel's static shared memory, which counts against the same limit (1 KiB
# on every architecture: tests/test_select_sass.py).
SELECT_STATIC_RESERVE = 2 * 1024
SELECT_SHARED_LIMIT = {MMA_WGMMA: 227 * 1024 - SELECT_STATIC_RESERVE}
SELECT_SHARED_LIMIT_MMA_SYNC = 99 * 1024 - SELECT_STATIC_RESERVE


def select_buffer_bytes(cap: int) -> int:
    """kp::SelectGroupShared<CAP>::kBufferBytes: a kp::SelectBuffer<CAP> (CAP + a chunk of keys and ids, a
    256-bin histogram, a radix round's 3 found words and 2 span words, 2 x 8 warp totals, all 4-byte) at a
    multiple of 128 bytes."""
    size = 8 * (cap + SELECT_CHUNK) + 4 * 256 + 4 * (3 + 2) + 4 * 2 * (SELECT_THREADS // 32)
    return -(-size // 128) * 128


def wgmma_select_stages(head_dim: int) -> int:
    """The key tiles in each ring of the fused select's two warpgroups (kp::wgmma_select_stages): 3, or 2 at
    head_dim 256."""
    return 2 if head_dim > 128 else 3


def index_select_shared_bytes(heads: int, head_dim: int, mma: int, cap: int, tokens: int) -> int:
    """The fused select's dynamic shared memory a block of ``tokens`` tokens (kp::SelectGroupShared, then
    kp::WgmmaSelectShared): each token's selection buffer and chunk of logits; on the wgmma path then, for each
    of 2 warpgroups, a ring of wgmma_select_stages key tiles and their keys' scales and presence, and each
    token's weights and query rows in whole chunks of 64."""
    held = tokens * (select_buffer_bytes(cap) + 4 * SELECT_CHUNK)
    if mma != MMA_WGMMA:
        return held
    rows = -(-heads // WGMMA_ROWS) * WGMMA_ROWS
    ring = wgmma_select_stages(head_dim) * (wgmma_tile_bytes(head_dim) + 8 * WGMMA_ROWS)
    return held + 2 * ring + tokens * rows * (4 + head_dim)


def select_group_tokens(num_tokens: int, batch: int, heads: int, head_dim: int, mma: int, cap: int, splits: int) -> int:
    """Tokens a block of the fused select scores and selects for, from shapes alone: a request's mean tokens
    (a decode step's next_n; 4 at most, for a prefill), as many as the shared memory holds (1 always fits). One
    where a token's pools are split over blocks (``splits`` > 1: 128 tokens or fewer): there the grid is about
    as many blocks as the GPU holds, and a group would cut it by its size."""
    if splits > 1:
        return 1
    wanted = max(1, min(SELECT_GROUP_TOKENS, -(-num_tokens // batch) if batch > 0 else 1))
    limit = SELECT_SHARED_LIMIT.get(mma, SELECT_SHARED_LIMIT_MMA_SYNC)
    while wanted > 1 and index_select_shared_bytes(heads, head_dim, mma, cap, wanted) > limit:
        wanted -= 1
    return wanted


def index_block_pools(head_dim: int, mma: int) -> int:
    """Pools a block of the scorer covers per step of its walk: on the mma.sync paths (``mma`` MMA_E4M3,
    MMA_E4M3_HMMA or MMA_F16 of kernel.declarations) 4 warps x 8 x NT, NT as kp::index_key_tiles
    (kernels/kpool_index.cuh) sets it; on the wgmma path one key tile of 64, kp::wgmma_keys."""
    if mma == MMA_WGMMA:
        return WGMMA_ROWS
    key_tiles = 2 if head_dim > 128 or (mma == MMA_F16 and head_dim == 128) else 4
    return 4 * 8 * key_tiles


def index_stage_tokens(heads: int, head_dim: int, mma: int) -> int:
    """The most tokens whose query rows the scorer's stage holds: head_dim bytes and 16 of padding each on the
    mma.sync paths; on the wgmma path each token's heads padded to whole chunks of 64 rows."""
    if mma == MMA_WGMMA:
        return min(INDEX_TILE_TOKENS, WGMMA_STAGE_BYTES // (-(-heads // WGMMA_ROWS) * WGMMA_ROWS * head_dim))
    return min(INDEX_TILE_TOKENS, INDEX_STAGE_BYTES // (heads * (head_dim + 16)))


def index_geometry(tokens: int, max_pools: int, tokens_per_block: int, block_pools: int) -> tuple[LaunchGeometry, int]:
    """The scorer's grid, token tiles (fastest) x pool ranges, 4 warps a block (``items``: the token tiles), and
    the pools of a range: whole steps of ``block_pools``, as many as bring the grid near INDEX_TARGET_BLOCKS."""
    token_tiles = -(-tokens // tokens_per_block)
    steps = -(-max_pools // block_pools)
    ranges = min(steps, max(1, -(-INDEX_TARGET_BLOCKS // token_tiles)))
    per_range = -(-steps // ranges)
    ranges = -(-steps // per_range)
    return LaunchGeometry(grid=token_tiles * ranges, block=INDEX_THREADS, items=token_tiles), per_range * block_pools


def chunk_members(kpool: int, member_bytes: int) -> int:
    """Members pool8 loads before it uses any (``kp::chunk_members``): the whole pool, or a stream chunk."""
    if kpool * member_bytes <= WHOLE_POOL_BYTES:
        return kpool
    return max(1, STREAM_BYTES // member_bytes)


SELECT_THREADS = 256  # kp::kSelectThreads in kernels/kpool_select.cuh


def select_geometry(tokens: int) -> LaunchGeometry:
    """The selection's grid: one block of SELECT_THREADS a token."""
    return LaunchGeometry(grid=tokens, block=SELECT_THREADS, items=tokens)


# A batch large enough that every block of a launch is full: what the developer tools size a launch by
# (``OpSpec.large_launch``: the blocks one SM holds).
LARGE_BATCH = 1 << 20


def groups_launch(head_dim: int) -> LaunchGeometry:
    """A large launch of head_dim / 8-thread groups (``group_geometry``): most pooling and epilogue kernels."""
    return group_geometry(head_dim, LARGE_BATCH)
