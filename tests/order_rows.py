"""Rows of logits in the orders a streaming selection meets (shared by the top-k tests and the selection trace's
tests): what each order does to its cut-backs, never to its result."""

from __future__ import annotations

import numpy as np

from kpool_cupy.tools.selection_trace import SELECT_CHUNK, sample_positions, sample_rank

# select_best samples a range of more candidates than its buffer holds (CAP + kSelectChunk), CAP 512 at least.
SAMPLED_PAST = 512 + SELECT_CHUNK


def order_row(rng: np.random.Generator, width: int, kind: str) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal(width).astype(np.float32)
    if kind == "rising":  # every tile beats the last: a cut at every tile
        return np.sort(rng.standard_normal(width)).astype(np.float32)
    if kind == "falling":
        return -np.sort(rng.standard_normal(width)).astype(np.float32)
    if kind == "equal":  # one tie across the row: the lowest ids win
        return np.full(width, 0.5, np.float32)
    if kind == "nan":  # mostly NaN of both signs, a few numbers, -inf and -0.0
        row = np.where(rng.random(width) < 0.5, np.float32(np.nan), -np.float32(np.nan))
        numbers = rng.random(width) < 0.02
        row[numbers] = rng.choice(np.array([1.0, -np.inf, -0.0, 0.0, 3.0], np.float32), int(numbers.sum()))
        return row.astype(np.float32)
    if kind == "sampled-high":  # the logits select_best samples above all others: its seed fails, it starts again
        row = rng.standard_normal(width).astype(np.float32)
        if width > SAMPLED_PAST:
            sampled = sample_positions(width)
            row[sampled] = 10 + rng.random(sampled.size).astype(np.float32)
        return row
    raise ValueError(kind)


def seed_boundary_row(rng: np.random.Generator, width: int, k: int, delta: int) -> np.ndarray:
    """A row of ``width`` (more than its selection's buffer holds) whose sample's sample_rank-th key is exactly 5.0
    and which holds exactly k + delta logits of 5.0, the rest below it (many one ulp below, so ties decide a
    selection that takes them): select_best's seed is 5.0 and it offers the row again exactly when delta < 0."""
    sampled = sample_positions(width)
    rank = sample_rank(k, sampled.size, width)
    assert rank <= sampled.size and k + delta >= rank, (width, k, delta, rank)
    top = np.float32(5.0)
    below = np.nextafter(top, np.float32(0), dtype=np.float32)
    row = np.minimum(0.5 * rng.standard_normal(width), below).astype(np.float32)
    row[rng.random(width) < 0.05] = below
    others = np.setdiff1d(np.arange(width), sampled)
    row[rng.choice(sampled, rank, replace=False)] = top
    row[rng.choice(others, k + delta - rank, replace=False)] = top
    return row
