"""The shapes the benchmark sweeps, and the minimum bytes each one must move."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dtypes import element_dtype
from ..pool_offsets import pool_row_offsets


@dataclass(frozen=True)
class BenchShape:
    name: str
    kind: str  # "decode", "prefill" or "mixed"
    lengths: tuple[int, ...]
    cache: tuple[int, ...]
    head_dim: int
    kpool: int
    dtype: str = "bfloat16"

    @property
    def requests(self) -> int:
        return len(self.lengths)

    @property
    def tokens(self) -> int:
        return int(sum(self.lengths))

    @property
    def pools(self) -> int:
        offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        return int(pool_row_offsets(offsets, np.asarray(self.cache, dtype=np.int64), self.kpool)[-1])


def minimum_bytes(shape: BenchShape) -> int:
    """Bytes no implementation can avoid: each member row of k and gate read once, each pooled row written once.

    Tokens that complete no pool in this call are not counted (nothing needs
    to read them), nor is ape (kpool rows, cached after the first pool).
    """
    itemsize = element_dtype(shape.dtype).itemsize
    members = shape.pools * shape.kpool
    return members * shape.head_dim * 2 * itemsize + shape.pools * shape.head_dim * itemsize


def _decode(requests: int, head_dim: int, kpool: int, seed: int) -> BenchShape:
    # Each request brings one pool's worth of tokens, aligned to the grid: the
    # shape of a speculative or chunked decode step that closes pools.
    rng = np.random.default_rng(seed)
    cache = tuple(int(c) for c in rng.integers(1, 4096, requests) * kpool)
    return BenchShape(f"decode-{requests}x{kpool}", "decode", (kpool,) * requests, cache, head_dim, kpool)


def _prefill(requests: int, tokens: int, head_dim: int, kpool: int) -> BenchShape:
    name = f"prefill-{requests}x{tokens}" + ("" if (head_dim, kpool) == (128, 4) else f"-d{head_dim}-k{kpool}")
    return BenchShape(name, "prefill", (tokens,) * requests, (0,) * requests, head_dim, kpool)


def _mixed(requests: int, head_dim: int, kpool: int, seed: int) -> BenchShape:
    # A continuous-batching step: a few long prefills among many short ones,
    # cached prefixes at every phase.
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(requests) < 0.1, rng.integers(1024, 8192, requests), rng.integers(1, 64, requests))
    cache = rng.integers(0, 8192, requests)
    return BenchShape(
        f"mixed-{requests}", "mixed", tuple(int(n) for n in lengths), tuple(int(c) for c in cache), head_dim, kpool
    )


def sweep(quick: bool = False) -> list[BenchShape]:
    """head_dim 128, kpool 4, bf16 across decode, prefill and mixed; then head_dim and kpool variations."""
    shapes = [
        _decode(512, 128, 4, seed=1),
        _decode(4096, 128, 4, seed=2),
        _prefill(1, 4096, 128, 4),
        _prefill(4, 16384, 128, 4),
        _mixed(256, 128, 4, seed=3),
    ]
    if quick:
        return shapes[1:4]
    shapes += [_prefill(2, 65536, 128, 4)]
    shapes += [_prefill(4, 16384, head_dim, 4) for head_dim in (64, 256)]
    shapes += [_prefill(4, 16384, 128, kpool) for kpool in (2, 8, 16)]
    return shapes
