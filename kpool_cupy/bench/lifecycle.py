"""Benchmarks of the decode-side functions: tail update and expand top-k (GPU only).

Decode-shaped batches of 1 to 512 requests. Each implementation's median
device time is reported with its bandwidth against the minimum bytes and as a
fraction of a device-to-device copy of those bytes timed in the same run, the
same method as the compress sweep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import element_dtype
from .stats import MEMORY_BUDGET, bandwidth_gbps, fraction_of, input_sets, summarize_times
from .timing import copy_roof, device_times

POOL_TOPK = 512  # the indexer's selection width of the upstream suite (2048 expanded columns at kpool 4)


@dataclass(frozen=True)
class DecodeShape:
    requests: int
    next_n: int
    head_dim: int = 128
    kpool: int = 4
    dtype: str = "bfloat16"

    @property
    def name(self) -> str:
        return f"decode-{self.requests}x{self.next_n}"


def decode_shapes(quick: bool = False) -> list[DecodeShape]:
    if quick:
        return [DecodeShape(64, 1), DecodeShape(512, 1)]
    return [DecodeShape(r, n) for r in (1, 8, 64, 512) for n in (1, 2)]


def tail_update_bytes(shape: DecodeShape) -> int:
    """Each step token read (k, gate) and written to the ring once; every request closes one pool per step
    (the benchmark's positions make sure), reading the ring members this step did not just write and
    writing one pooled row."""
    itemsize = element_dtype(shape.dtype).itemsize
    row = shape.head_dim * itemsize
    step = shape.requests * shape.next_n * 2 * row * 2
    older_members = max(shape.kpool - shape.next_n, 0)
    closing = shape.requests * (older_members * 2 * row + row)
    return step + closing


def expand_bytes(tokens: int, pool_topk: int, kpool: int) -> int:
    """pool_ids read once (int32) and the positions written once (int32)."""
    return tokens * pool_topk * 4 + tokens * pool_topk * kpool * 4


def composite_tail_update(xp: Any, tail, k, gate, ape, positions, slots, kpool: int) -> Any:
    """The decode step in array operations (``xp`` is numpy or cupy): scatter every step token into its
    ring, then pool every request's ring. Right when each request's last token closes its pool and no
    other does, which is how the benchmark's positions are chosen."""
    from .impls import composite_pool

    for t in range(positions.shape[1]):
        ring = positions[:, t] % kpool
        tail[slots, 0, ring] = k[:, t]
        tail[slots, 1, ring] = gate[:, t]
    requests, head_dim = positions.shape[0], tail.shape[-1]
    keys = tail[slots, 0].reshape(requests * kpool, head_dim)
    gates = tail[slots, 1].reshape(requests * kpool, head_dim)
    return composite_pool(xp, keys, gates, ape, xp.arange(requests, dtype=xp.int64) * kpool, kpool)


def _entry(run, count: int, nbytes: int, copy_gbps: float, samples: int) -> dict[str, Any]:
    times = summarize_times(device_times(run, count, samples=samples))
    gbps = bandwidth_gbps(nbytes, times["median_ms"])
    return {**times, "gbps": gbps, "fraction_of_copy": fraction_of(gbps, copy_gbps)}


def _set_count(bytes_per_set: int) -> int:
    """Input sets to rotate so no call finds its inputs in L2, as in the compress sweep."""
    import cupy

    l2 = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["l2CacheSize"]
    return input_sets(bytes_per_set, l2, MEMORY_BUDGET)


def bench_tail_update(shape: DecodeShape, samples: int) -> dict[str, Any]:
    import cupy

    import kpool_cupy

    itemsize = element_dtype(shape.dtype).itemsize
    ring_bytes = shape.requests * 2 * shape.kpool * shape.head_dim * itemsize
    count = _set_count(ring_bytes + tail_update_bytes(shape))
    dtype = element_dtype(shape.dtype)
    rng = cupy.random.default_rng(0)
    sets = []
    for _ in range(count):
        last = (rng.integers(1, 4096, shape.requests) * shape.kpool + shape.kpool - 1).astype(cupy.int32)
        positions = last[:, None] - cupy.arange(shape.next_n, dtype=cupy.int32)[::-1]
        sets.append(
            {
                "tail": cupy.zeros((shape.requests, 2, shape.kpool, shape.head_dim), dtype=dtype),
                "k": rng.standard_normal((shape.requests, shape.next_n, shape.head_dim), dtype=cupy.float32).astype(
                    dtype
                ),
                "gate": rng.standard_normal((shape.requests, shape.next_n, shape.head_dim), dtype=cupy.float32).astype(
                    dtype
                ),
                "ape": rng.standard_normal((shape.kpool, shape.head_dim), dtype=cupy.float32),
                "positions": cupy.ascontiguousarray(positions),
                "slot_idx": cupy.arange(shape.requests, dtype=cupy.int32),
                "out": cupy.empty((shape.requests, -(-shape.next_n // shape.kpool), shape.head_dim), dtype=dtype),
                "closed": cupy.empty((shape.requests, -(-shape.next_n // shape.kpool)), dtype=cupy.int32),
            }
        )
    nbytes = tail_update_bytes(shape)
    copy = copy_roof(nbytes, count, samples)
    copy_gbps = copy["gbps"]

    def ours(i: int) -> Any:
        return kpool_cupy.kpool_tail_update(**sets[i], validate=False)

    def composite(i: int) -> Any:
        s = sets[i]
        return composite_tail_update(
            cupy, s["tail"], s["k"], s["gate"], s["ape"], s["positions"], s["slot_idx"], shape.kpool
        )

    return {
        "name": f"tail-update {shape.name}",
        "bytes": nbytes,
        "copy": copy,
        "implementations": {
            "kpool-cupy": _entry(ours, count, nbytes, copy_gbps, samples),
            "cupy-composite": _entry(composite, count, nbytes, copy_gbps, samples),
        },
    }


def bench_expand(tokens: int, kpool: int, samples: int) -> dict[str, Any]:
    import cupy

    import kpool_cupy

    count = _set_count(expand_bytes(tokens, POOL_TOPK, kpool))
    rng = cupy.random.default_rng(1)
    sets = []
    for _ in range(count):
        ids = rng.integers(-1, 8192, (tokens, POOL_TOPK)).astype(cupy.int32)
        sets.append((ids, cupy.asarray(np.array([0, tokens], np.int32)), cupy.zeros(1, dtype=cupy.int32)))
    nbytes = expand_bytes(tokens, POOL_TOPK, kpool)
    copy = copy_roof(nbytes, count, samples)
    copy_gbps = copy["gbps"]
    offsets = cupy.arange(kpool, dtype=cupy.int64)

    def ours(i: int) -> Any:
        return kpool_cupy.kpool_expand_topk(*sets[i], kpool=kpool, validate=False)

    def composite(i: int) -> Any:
        ids = sets[i][0].astype(cupy.int64)[..., None]
        return cupy.where(ids >= 0, ids * kpool + offsets, -1).reshape(tokens, -1).astype(cupy.int32)

    return {
        "name": f"expand-topk {tokens}x{POOL_TOPK}",
        "bytes": nbytes,
        "copy": copy,
        "implementations": {
            "kpool-cupy": _entry(ours, count, nbytes, copy_gbps, samples),
            "cupy-composite": _entry(composite, count, nbytes, copy_gbps, samples),
        },
    }


def run_lifecycle(quick: bool, samples: int) -> list[dict[str, Any]]:
    records = [bench_tail_update(shape, samples) for shape in decode_shapes(quick)]
    records += [bench_expand(tokens, 4, samples) for tokens in ((64, 512) if quick else (1, 64, 512))]
    return records
