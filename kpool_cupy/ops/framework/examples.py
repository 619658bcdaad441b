"""One small valid call of every op: each op picks its arguments (``OpSpec.example``) from one batch.

The op tests, the torch samples and ``torch.library.opcheck`` run these, so a
new op brings its own call with its spec instead of an entry in each test's
table. ``example_batch`` makes the arrays: two requests of 5 and 6 tokens
after cached prefixes of 2 and 7 (offsets ``[0, 5, 11]``), on slots 2 and 0
of a 3-slot ring of 6 rows (one array, or a pair of key and gate rings), a
decode step of 3 tokens a request (the second padded), 3 selected pool ids a
token, and a scoring batch: 5 tokens of 2 requests, 2 heads, head_dim 64, a
2-page FP8 cache of 4 entries a page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...dtypes import BFLOAT16, FLOAT32
from ...kernel.pages import FP8_PAGES
from ...pool_offsets import pool_row_offsets

# (positional arguments, keyword arguments) of one call.
Example = tuple[tuple[Any, ...], dict[str, Any]]

SCORING_HEAD_DIM = 64
SCORING_KPOOL = 2


@dataclass(frozen=True)
class ExampleBatch:
    """The arrays every op's example takes its arguments from (NumPy, host memory)."""

    head_dim: int
    kpool: int
    k: np.ndarray  # [11, head_dim]
    gate: np.ndarray  # like k (float32 with a split ring)
    ape: np.ndarray  # float32 [kpool, head_dim]
    offsets: np.ndarray  # int32 [3]
    lengths: np.ndarray  # int32 [2]
    ring: Any  # [3, 2, 6, head_dim], or a pair of [3, 6, head_dim]
    slots: np.ndarray  # int32 [2]
    step_k: np.ndarray  # [2, 3, head_dim]
    step_gate: np.ndarray
    positions: np.ndarray  # int32 [2, 3], -1 padding
    pool_ids: np.ndarray  # int32 [11, 3], -1 for none
    logits: np.ndarray  # float32 [11, 7], rounded so that ties occur
    grad_pooled: np.ndarray  # [pools, head_dim]: compress's gradient, one row a pool
    scoring: tuple[np.ndarray, ...]  # q, weights, cache, cache_block_table, input_row_offsets, cache_lengths


def example_batch(
    dtype: np.dtype = BFLOAT16, split: bool = False, head_dim: int = 16, kpool: int = 4, seed: int = 0
) -> ExampleBatch:
    """The batch in ``dtype`` (k and the rings; the gate and its ring float32 with ``split``)."""
    rng = np.random.default_rng(seed)
    gate_dtype = FLOAT32 if split else np.dtype(dtype)
    k = rng.standard_normal((11, head_dim)).astype(dtype)
    gate = (3 * rng.standard_normal((11, head_dim))).astype(gate_dtype)
    ape = rng.standard_normal((kpool, head_dim)).astype(np.float32)
    offsets, lengths = np.array([0, 5, 11], np.int32), np.array([2, 7], np.int32)
    ring: Any
    if split:
        ring = (
            rng.standard_normal((3, 6, head_dim)).astype(dtype),
            rng.standard_normal((3, 6, head_dim)).astype(gate_dtype),
        )
    else:
        ring = rng.standard_normal((3, 2, 6, head_dim)).astype(dtype)
    step_k = rng.standard_normal((2, 3, head_dim)).astype(dtype)
    step_gate = rng.standard_normal((2, 3, head_dim)).astype(gate_dtype)
    pool_ids = rng.integers(-1, 5, (11, 3)).astype(np.int32)
    scoring = _scoring(rng)
    logits = np.round(rng.standard_normal((11, 7))).astype(np.float32)
    pools = int(pool_row_offsets(offsets, lengths, kpool)[-1])
    grad = np.random.default_rng(seed + 1).standard_normal((pools, head_dim)).astype(dtype)
    return ExampleBatch(
        head_dim, kpool, k, gate, ape, offsets, lengths, ring, np.array([2, 0], np.int32), step_k, step_gate,
        np.array([[5, 6, 7], [9, 10, -1]], np.int32), pool_ids, logits, grad, scoring,
    )  # fmt: skip


def _scoring(rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """5 tokens of 2 requests (cached 3 and 1), 2 heads, head_dim 64; a 2-page cache of 4 entries a page with
    scales 0.5, request 0 on page 1, request 1 on page 0."""
    q = rng.integers(0, 0x7E, (5, 2, SCORING_HEAD_DIM), dtype=np.uint8)
    cache = np.zeros((2, 4, FP8_PAGES.entry_bytes(SCORING_HEAD_DIM)), np.uint8)
    scales_at = FP8_PAGES.scale_offset(4, SCORING_HEAD_DIM, 0)
    cache.reshape(2, -1)[:, :scales_at] = rng.integers(0, 0x7E, (2, scales_at), dtype=np.uint8)
    cache.reshape(2, -1)[:, scales_at:] = np.full((2, 4), 0.5, np.float32).view(np.uint8)
    weights = rng.standard_normal((5, 2)).astype(np.float32)
    table, offsets, lengths = np.array([[1], [0]], np.int32), np.array([0, 2, 5], np.int32), np.array([3, 1], np.int32)
    return (q, weights, cache, table, offsets, lengths)


def named(operands: tuple[str, ...], example: Example) -> dict[str, Any]:
    """An example's arguments by name: the positional ones are the first operands, in order."""
    args, kwargs = example
    return dict(zip(operands, args, strict=False)) | kwargs
