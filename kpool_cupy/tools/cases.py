"""Random ragged batches that cover what goes wrong in k-pool kernels, for `kpool-cupy check`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..dtypes import FLOAT32

SENTINEL = -7.0  # fills surplus rows of an over-sized out; a kernel must leave them alone


@dataclass
class Case:
    name: str
    k: np.ndarray
    gate: np.ndarray
    ape: np.ndarray
    input_row_offsets: np.ndarray
    cache_lengths: np.ndarray
    extra: dict[str, Any] = field(default_factory=dict)  # pool_row_offsets= / out= keyword arguments
    batch: str = ""  # what the batch is without its extras (the name where it has none)

    def __post_init__(self) -> None:
        self.batch = self.batch or self.name

    def name_for(self, reads: frozenset[str]) -> str:
        """The case's name for a check that reads the extras ``reads``: the batch's where it reads not all."""
        return self.name if set(self.extra) <= reads else self.batch

    @property
    def requests(self) -> int:
        return int(self.cache_lengths.shape[0])

    @property
    def tokens(self) -> int:
        return int(self.k.shape[0])


def _batch(
    rng: np.random.Generator,
    name: str,
    lengths: list[int],
    cache: list[int],
    head_dim: int,
    kpool: int,
    dtype: np.dtype,
    *,
    index_dtype: Any = np.int32,
    fused: bool = False,
) -> Case:
    total = int(sum(lengths))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(index_dtype)
    # Gate scores spread over several units, so a wrong member mapping or a
    # per-member (not per-channel) softmax moves the result visibly.
    if fused:  # k and gate as column slices of one fused projection: rows strided, no copy
        fused_rows = rng.standard_normal((total, 3 * head_dim)).astype(np.float32)
        fused_rows[:, head_dim : 2 * head_dim] *= 3.0
        fused_rows = fused_rows.astype(dtype)
        k, gate = fused_rows[:, :head_dim], fused_rows[:, head_dim : 2 * head_dim]
    else:
        k = rng.standard_normal((total, head_dim)).astype(dtype)
        gate = (3.0 * rng.standard_normal((total, head_dim))).astype(dtype)
    ape = rng.standard_normal((kpool, head_dim)).astype(np.float32)
    return Case(name, k, gate, ape, offsets, np.asarray(cache, dtype=index_dtype))


def check_cases(head_dim: int, kpool: int, dtype: np.dtype, seed: int) -> list[Case]:
    """At least eight batches: every phase, empty requests, ragged tails, big caches, odd layouts."""
    rng = np.random.default_rng(seed)

    def phases(count: int) -> list[int]:
        return [int(p) for p in rng.integers(0, 4, count) * kpool + np.arange(count) % kpool]

    # Each phase of a pool the cached prefix opened, twice, in requests of
    # their own; past kpool 32 the first and last 8 phases and 16 more at
    # random, so the batch grows linearly with kpool (every phase would be
    # 4 * kpool^2 tokens: 4.2 million at kpool 1024).
    if kpool <= 32:
        every_phase = phases(2 * kpool)
    else:
        middle = rng.choice(np.arange(8, kpool - 8), size=min(16, kpool - 16), replace=False)
        sampled = np.concatenate([np.arange(8), np.arange(kpool - 8, kpool), np.sort(middle)])
        every_phase = [int(p) for p in rng.integers(0, 4, sampled.size) * kpool + sampled]
    cases = [
        _batch(rng, "one-long-request", [16 * kpool + 3], [0], head_dim, kpool, dtype),
        _batch(rng, "every-phase", [2 * kpool + 1] * len(every_phase), every_phase, head_dim, kpool, dtype),
        _batch(rng, "ragged-tails", [7, 5, 3, 1, 3 * kpool - 1], [0, 0, 0, 0, 1], head_dim, kpool, dtype),
        _batch(rng, "empty-requests", [0, 3 * kpool + 2, 0, 0, kpool, 0], [5, 1, 0, 9, 0, 2], head_dim, kpool, dtype),
        _batch(rng, "decode-like", list(rng.integers(1, kpool + 2, 24)), phases(24), head_dim, kpool, dtype),
        _batch(
            rng,
            "cache-near-2^32",
            [3 * kpool + 1, 2 * kpool],
            [2**32 - 1 - kpool, 2**32 - 2],
            head_dim,
            kpool,
            dtype,
            index_dtype=np.uint32,
        ),
        _batch(
            rng,
            "cache-past-2^32",
            [4 * kpool, kpool + 1],
            [2**33 + 1, 2**40],
            head_dim,
            kpool,
            dtype,
            index_dtype=np.int64,
        ),
        _batch(
            rng, "strided-rows", [5 * kpool + 2, kpool - 1, 2 * kpool], phases(3), head_dim, kpool, dtype, fused=True
        ),
    ]
    from ..pool_offsets import pool_row_offsets

    oversized = _batch(rng, "oversized-out", [4 * kpool + 1, 2 * kpool], phases(2), head_dim, kpool, dtype)
    oversized.batch = "two-requests"
    pools = int(pool_row_offsets(oversized.input_row_offsets, oversized.cache_lengths, kpool)[-1])
    oversized.extra["out"] = np.full((pools + 5, head_dim), SENTINEL, dtype=dtype)
    cases.append(oversized)

    explicit = _batch(rng, "explicit-pool-offsets", [3 * kpool, 2 * kpool + 1], phases(2), head_dim, kpool, dtype)
    explicit.batch = "two-more-requests"
    explicit.extra["pool_row_offsets"] = pool_row_offsets(
        explicit.input_row_offsets, explicit.cache_lengths, kpool
    ).astype(np.uint32)
    cases.append(explicit)

    float_out = _batch(rng, "float32-out", [6 * kpool + 1], [kpool - 1], head_dim, kpool, dtype)
    float_out.batch = "one-request-mid-pool"
    pools = int(pool_row_offsets(float_out.input_row_offsets, float_out.cache_lengths, kpool)[-1])
    float_out.extra["out"] = np.full((pools, head_dim), SENTINEL, dtype=FLOAT32)
    cases.append(float_out)
    return cases
