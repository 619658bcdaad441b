"""Device input sets for one benchmark shape (GPU only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import element_dtype
from ..pool_offsets import pool_row_offsets
from .shapes import BenchShape


@dataclass
class InputSet:
    k: Any
    gate: Any
    ape: Any
    input_row_offsets: Any  # int32
    cache_lengths: Any  # int32 (int64 copies below for the baseline kernel)
    pool_row_offsets: Any  # int64
    first_rows: Any  # int64 [pools]: first member row of each pool, for the composites
    out: Any
    offsets64: Any
    cache64: Any


def first_member_rows(shape: BenchShape) -> np.ndarray:
    """The first token row of every pool, in output order (host, vectorized)."""
    offsets = np.concatenate([[0], np.cumsum(shape.lengths)]).astype(np.int64)
    cache = np.asarray(shape.cache, dtype=np.int64)
    pools = pool_row_offsets(offsets, cache, shape.kpool)
    counts = np.diff(pools)
    request = np.repeat(np.arange(shape.requests), counts)
    local = np.arange(int(pools[-1])) - pools[request]
    align = (-cache[request]) % shape.kpool
    return offsets[request] + align + local * shape.kpool


def make_input_sets(shape: BenchShape, count: int, seed: int = 0) -> list[InputSet]:
    import cupy

    dtype = element_dtype(shape.dtype)
    offsets = np.concatenate([[0], np.cumsum(shape.lengths)])
    cache = np.asarray(shape.cache)
    pools = pool_row_offsets(offsets.astype(np.int64), cache.astype(np.int64), shape.kpool)
    first = cupy.asarray(first_member_rows(shape))
    generator = cupy.random.default_rng(seed)
    sets = []
    for _ in range(count):
        k = generator.standard_normal((shape.tokens, shape.head_dim), dtype=cupy.float32).astype(dtype)
        gate = (3 * generator.standard_normal((shape.tokens, shape.head_dim), dtype=cupy.float32)).astype(dtype)
        sets.append(
            InputSet(
                k=k,
                gate=gate,
                ape=generator.standard_normal((shape.kpool, shape.head_dim), dtype=cupy.float32),
                input_row_offsets=cupy.asarray(offsets, dtype=cupy.int32),
                cache_lengths=cupy.asarray(cache, dtype=cupy.int32),
                pool_row_offsets=cupy.asarray(pools),
                first_rows=first,
                out=cupy.empty((shape.pools, shape.head_dim), dtype=dtype),
                offsets64=cupy.asarray(offsets, dtype=cupy.int64),
                cache64=cupy.asarray(cache, dtype=cupy.int64),
            )
        )
    return sets
