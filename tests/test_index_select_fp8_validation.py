"""Walks the fused scoring and selection table of docs/validation.md on both CPU backends (and the GPU path)."""

from __future__ import annotations

import numpy as np
import pytest
from validation_tables import Row, refused, table

from kpool_cupy import emulate, reference
from kpool_cupy.ops.families.split_selection import workspace_bytes
from kpool_cupy.ops.index_select_fp8 import select_splits


def good() -> dict:
    """A valid call: 5 tokens of 2 requests, 2 heads, head_dim 64, kpool 2, pages of 4 pools, 1 pool selected of
    up to 2 seen (so the selection runs), a token table of pages of 4 positions."""
    rng = np.random.default_rng(0)
    cache = np.zeros((3, 4, 68), np.uint8)
    cache.reshape(3, -1)[:, : 4 * 64] = rng.integers(0, 0x7E, (3, 4 * 64), dtype=np.uint8)
    cache.reshape(3, -1)[:, 4 * 64 :] = np.ones((3, 4), np.float32).view(np.uint8)
    return {
        "q": rng.integers(0, 0x7E, (5, 2, 64), dtype=np.uint8),
        "weights": np.ones((5, 2), np.float32),
        "cache": cache,
        "cache_block_table": np.array([[2, 0], [1, 0]], np.int32),
        "input_row_offsets": np.array([0, 2, 5], np.int32),
        "cache_lengths": np.array([3, 1], np.int32),
        "kpool": 2,
        "pool_topk": 1,
        "block_table": np.array([[0, 1], [2, 3]], np.int32),
        "block_size": 4,
        # What this call needs, so one byte less is refused (index_select_workspace_bytes covers smaller batches).
        "workspace": np.zeros(workspace_bytes(5, select_splits(5, 1), 1), np.uint8),
    }


def _dirty(a):
    a["workspace"][0] = 1


def _read_only_workspace(a):
    # Found by a hostile round (issue 36): the emulator wrote into an immutable buffer.
    workspace = a["workspace"].copy()
    workspace.flags.writeable = False
    a["workspace"] = workspace


MUTATIONS = {
    "select-q-dtype": lambda a: a.update(q=a["q"].astype(np.float32)),
    "select-weights-shape": lambda a: a.update(weights=a["weights"][:, :1]),
    "select-cache-width": lambda a: a.update(cache=np.zeros((3, 4, 72), np.uint8)),
    "select-cache-table-short": lambda a: a.update(
        cache_block_table=np.array([[2], [1]], np.int32),
        cache_lengths=np.array([9, 1], np.int32),
        block_table=np.zeros((2, 4), np.int32),
    ),
    "select-pool-topk-zero": lambda a: a.update(pool_topk=0),
    "select-pool-topk-type": lambda a: a.update(pool_topk=2.0),
    "select-kpool": lambda a: a.update(kpool=0),
    "select-block-size-missing": lambda a: a.update(block_size=None),
    "select-block-table-reach": lambda a: a.update(block_table=a["block_table"][:, :1], block_size=2),
    "select-workspace-dtype": lambda a: a.update(workspace=a["workspace"].view(np.int32)),
    "select-workspace-rank": lambda a: a.update(workspace=a["workspace"].reshape(-1, 4)),
    "select-workspace-small": lambda a: a.update(workspace=a["workspace"][:-1]),
    "select-workspace-aligned": lambda a: a.update(workspace=np.zeros(a["workspace"].size + 16, np.uint8)[1:]),
    "select-lengths-pools": lambda a: a.update(
        cache_lengths=np.array([3, 2**34], np.int64), input_row_offsets=np.array([0, 2, 5], np.int64)
    ),
    "select-workspace-dirty": _dirty,
    "select-workspace-read-only": _read_only_workspace,
    "select-offsets-end": lambda a: a.update(input_row_offsets=np.array([0, 2, 4], np.int32)),
}

ROWS = table("Fused scoring and selection")


def test_table_and_mutations_match():
    assert len(ROWS) >= 12, "the fused selection table in docs/validation.md did not parse"
    assert sorted(r.id for r in ROWS) == sorted(MUTATIONS)


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_the_good_call_passes_and_leaves_the_workspace_zeroed(module):
    args = good()
    positions = module.kpool_index_select_fp8(**args)
    assert positions.shape == (5, 2) and not args["workspace"][:512].any()  # the counters' region


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_call_names_the_argument(module, row: Row):
    args = good()
    MUTATIONS[row.id](args)
    with refused(row):
        module.kpool_index_select_fp8(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_gpu_bad_call_names_the_argument(row: Row):
    import cupy

    import kpool_cupy

    if row.id == "select-workspace-read-only":
        pytest.skip("CuPy has no read-only arrays")
    args = good()
    MUTATIONS[row.id](args)
    device = {n: cupy.asarray(v) if isinstance(v, np.ndarray) else v for n, v in args.items()}
    if row.id == "select-workspace-aligned":  # CuPy's copy starts aligned: the misaligned view made on the device
        device["workspace"] = cupy.zeros(args["workspace"].size + 16, cupy.uint8)[1:]
    with refused(row):
        kpool_cupy.kpool_index_select_fp8(**device)
