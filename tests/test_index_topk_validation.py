"""Walks the selection table of docs/validation.md on both CPU backends (and the GPU path where one exists)."""

from __future__ import annotations

import numpy as np
import pytest
from validation_tables import Row, refused, table

from kpool_cupy import emulate, reference


def good() -> dict:
    """A valid call: 5 tokens of 2 requests, kpool 2, 3 pools selected of up to 4 seen, pages of 4 positions."""
    rng = np.random.default_rng(0)
    return {
        "logits": rng.standard_normal((5, 4)).astype(np.float32),  # request 0's last token sees (3 + 1 + 1) // 2
        "input_row_offsets": np.array([0, 2, 5], np.int32),
        "cache_lengths": np.array([3, 5], np.int32),
        "kpool": 2,
        "pool_topk": 3,
        "always_select_tail": True,
        "block_table": np.array([[1, 0, 7], [2, 3, 4]], np.int32),  # request 1's last position, 7: block 1
        "block_size": 4,
    }


MUTATIONS = {
    "topk-logits-dtype": lambda a: a.update(logits=a["logits"].astype(np.float64)),
    "topk-logits-rank": lambda a: a.update(logits=a["logits"].reshape(-1)),
    "topk-logits-last-dim": lambda a: a.update(logits=np.zeros((5, 8), np.float32)[:, ::2]),
    "topk-logits-narrow": lambda a: a.update(logits=a["logits"][:, :3]),
    "topk-pool-topk-zero": lambda a: a.update(pool_topk=0),
    "topk-pool-topk-large": lambda a: a.update(pool_topk=4097),
    "topk-pool-topk-type": lambda a: a.update(pool_topk=2.0),
    "topk-kpool": lambda a: a.update(kpool=0),
    "topk-block-size-missing": lambda a: a.update(block_size=None),
    "topk-block-table-dtype": lambda a: a.update(block_table=a["block_table"].astype(np.int64)),
    "topk-block-table-rows": lambda a: a.update(block_table=a["block_table"][:1]),
    "topk-block-table-reach": lambda a: a.update(block_table=a["block_table"][:, :1]),
    "topk-compact-type": lambda a: a.update(compact="yes"),
    "topk-offsets-end": lambda a: a.update(input_row_offsets=np.array([0, 2, 4], np.int32)),
    "topk-lengths-negative": lambda a: a.update(cache_lengths=np.array([3, -1], np.int32)),
}

ROWS = table("Selection function")


def test_table_and_mutations_match():
    assert len(ROWS) >= 12, "the selection table in docs/validation.md did not parse"
    assert sorted(r.id for r in ROWS) == sorted(MUTATIONS)


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_the_good_call_passes(module):
    positions = module.kpool_index_topk(**good())
    assert positions.shape == (5, 3 * 2 + 1)


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_call_names_the_argument(module, row: Row):
    args = good()
    MUTATIONS[row.id](args)
    with refused(row):
        module.kpool_index_topk(**args)


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_without_validation_a_short_table_gives_minus_one_slots(module):
    args = good()
    args["block_table"] = args["block_table"][:, :1]  # positions 4 and on have no block
    got = module.kpool_index_topk(**args, validate=False)
    positions = module.kpool_index_topk(**{**good(), "block_table": None, "block_size": None})
    assert ((got == -1) == ((positions == -1) | (positions >= 4))).all(), (got, positions)


@pytest.mark.gpu
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_gpu_bad_call_names_the_argument(row: Row):
    import cupy

    import kpool_cupy

    if row.id == "topk-logits-last-dim":
        pytest.skip("CuPy copies a strided host array contiguous")
    args = good()
    MUTATIONS[row.id](args)
    device = {n: cupy.asarray(v) if isinstance(v, np.ndarray) else v for n, v in args.items()}
    with refused(row):
        kpool_cupy.kpool_index_topk(**device)
