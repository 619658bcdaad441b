"""The selection rule of kpool_index_topk in plain Python, for the tests: written from the contract, not the
kernels."""

from __future__ import annotations

import math

import numpy as np

from kpool_cupy import reference


def model_selection(row, candidates: int, pool_topk: int) -> list[int]:
    """The stated rule in plain Python: a larger logit first, equal logits by lower id (-0.0 == +0.0, which
    Python's == already says), NaN below everything; the chosen ids ascending."""
    if candidates <= pool_topk:
        return list(range(candidates))

    def rank(pool: int):
        value = float(row[pool])
        return (1, 0.0, pool) if math.isnan(value) else (0, -value, pool)

    return sorted(sorted(range(candidates), key=rank)[:pool_topk])


def model(logits, offsets, lengths, *, kpool, pool_topk, **expand):
    """Each token's visible pools (cut at the logits' width), the model's selection, then kpool_expand_topk."""
    ids = np.full((logits.shape[0], pool_topk), -1, np.int64)
    for b in range(len(lengths)):
        for t in range(int(offsets[b]), int(offsets[b + 1])):
            visible = (int(lengths[b]) + t - int(offsets[b]) + 1) // kpool
            chosen = model_selection(logits[t], min(visible, logits.shape[1]), pool_topk)
            ids[t, : len(chosen)] = chosen
    return reference.kpool_expand_topk(ids, offsets, lengths, kpool=kpool, validate=False, **expand)
