"""Walks the scoring table of docs/validation.md on both CPU backends (and the GPU path where one exists)."""

from __future__ import annotations

import numpy as np
import pytest
from validation_tables import Row, refused, table

from kpool_cupy import emulate, reference


def good() -> dict:
    """A valid call: 5 tokens of 2 requests, 2 heads, head_dim 64, kpool 2, 4-entry pages (2 pools a request)."""
    rng = np.random.default_rng(0)
    cache = np.zeros((3, 4, 68), np.uint8)
    cache.reshape(3, -1)[:, 4 * 64 :] = np.ones((3, 4), np.float32).view(np.uint8)
    return {
        "q": rng.integers(0, 0x7E, (5, 2, 64), dtype=np.uint8),
        "weights": np.ones((5, 2), np.float32),
        "cache": cache,
        "cache_block_table": np.array([[2, 0], [1, 0]], np.int32),
        "input_row_offsets": np.array([0, 2, 5], np.int32),
        "cache_lengths": np.array([3, 1], np.int32),
        "kpool": 2,
    }


def _out_over_q(a):
    raw = np.zeros(5 * 2 * 64 + 64, np.uint8)
    a["q"] = raw[: 5 * 2 * 64].reshape(5, 2, 64)
    a["out"] = raw[:40].view(np.float32).reshape(5, 2)  # the first pools' logits would land on q's bytes
    a["max_pools"] = 2


def _out_read_only(a):
    out = np.zeros((5, 2), np.float32)
    out.flags.writeable = False
    a["out"] = out


def _out_rows_overlap(a):
    raw = np.zeros(8, np.float32)
    a["out"] = np.lib.stride_tricks.as_strided(raw, shape=(5, 2), strides=(4, 4))  # row t+1 starts in row t


MUTATIONS = {
    "index-q-dtype": lambda a: a.update(q=a["q"].astype(np.float32)),
    "index-q-rank": lambda a: a.update(q=a["q"].reshape(5, 128)),
    "index-q-head-dim": lambda a: a.update(q=np.zeros((5, 2, 96), np.uint8)),
    "index-q-heads": lambda a: a.update(q=np.zeros((5, 129, 64), np.uint8), weights=np.ones((5, 129), np.float32)),
    "index-q-last-dim": lambda a: a.update(q=np.zeros((5, 2, 128), np.uint8)[..., ::2]),
    "index-weights-dtype": lambda a: a.update(weights=a["weights"].astype(np.float16)),
    "index-weights-shape": lambda a: a.update(weights=a["weights"][:, :1]),
    "index-cache-dtype": lambda a: a.update(cache=a["cache"].view(np.int8)),
    "index-cache-width": lambda a: a.update(cache=np.zeros((3, 4, 72), np.uint8)),
    "index-table-dtype": lambda a: a.update(cache_block_table=a["cache_block_table"].astype(np.int64)),
    "index-table-rows": lambda a: a.update(cache_block_table=a["cache_block_table"][:1]),
    "index-table-short": lambda a: a.update(
        cache_block_table=np.array([[2], [1]], np.int32),
        cache_lengths=np.array([9, 1], np.int32),
        input_row_offsets=np.array([0, 2, 5], np.int32),
    ),
    "index-table-page-range": lambda a: a.update(cache_block_table=np.array([[3, 0], [1, 0]], np.int32)),
    "index-kpool": lambda a: a.update(kpool=0),
    "index-max-pools-small": lambda a: a.update(max_pools=1),
    "index-max-pools-type": lambda a: a.update(max_pools=2.0),
    "index-out-dtype": lambda a: a.update(out=np.zeros((5, 2), np.float64)),
    "index-out-shape": lambda a: a.update(out=np.zeros((4, 2), np.float32)),
    "index-out-over-q": _out_over_q,
    "index-out-read-only": _out_read_only,
    "index-out-rows-overlap": _out_rows_overlap,
    "index-offsets-end": lambda a: a.update(input_row_offsets=np.array([0, 2, 4], np.int32)),
}

ROWS = table("Scoring function")


def test_table_and_mutations_match():
    assert len(ROWS) >= 15, "the scoring table in docs/validation.md did not parse"
    assert sorted(r.id for r in ROWS) == sorted(MUTATIONS)


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_the_good_call_passes(module):
    logits = module.kpool_index_logits_fp8(**good())
    assert logits.shape == (5, 2)  # request 0's last token sees (3 + 1 + 1) // 2 = 2 pools


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_call_names_the_argument(module, row: Row):
    args = good()
    MUTATIONS[row.id](args)
    with refused(row):
        module.kpool_index_logits_fp8(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_gpu_bad_call_names_the_argument(row: Row):
    import cupy

    import kpool_cupy

    if row.id in ("index-q-last-dim", "index-out-over-q", "index-out-read-only", "index-out-rows-overlap"):
        pytest.skip("CuPy copies a host array contiguous and writable, and copies share nothing")
    args = good()
    MUTATIONS[row.id](args)
    device = {n: cupy.asarray(v) if isinstance(v, np.ndarray) else v for n, v in args.items()}
    with refused(row):
        kpool_cupy.kpool_index_logits_fp8(**device)
