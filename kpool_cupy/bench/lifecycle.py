"""Benchmarks of the decode-side functions: tail update and expand top-k (GPU only).

Decode-shaped batches of 1 to 512 requests. Each implementation's median
device time is reported with its bandwidth against the minimum bytes and as a
fraction of a device-to-device copy of those bytes timed in the same run, the
same method as the compress sweep (graph replay, three L2 sizes of rotation).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import element_dtype
from .stats import ratios_to, rotation
from .timing import copy_roof, l2_bytes, timed_entry

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


# Above this many calls, the composites (a Python loop of array operations per
# call) are timed with events: capturing tens of thousands of their calls
# would take longer than the rest of the sweep.
COMPOSITE_CAPTURE_CALLS = 4096


def _composite_refusal(count: int) -> str | None:
    if count <= COMPOSITE_CAPTURE_CALLS:
        return None
    return f"{count} calls of array operations from Python; a graph is captured for at most {COMPOSITE_CAPTURE_CALLS}"


def _rotation(bytes_per_set: int, allocated_per_set: int) -> dict[str, Any]:
    """Input sets to rotate so no call finds its inputs in L2, as in the compress sweep."""
    l2, source = l2_bytes()
    return {**rotation(bytes_per_set, allocated_per_set, l2), "l2_source": source}


def _record(name: str, nbytes: int, rotated: dict[str, Any], samples: int, ours, composite) -> dict[str, Any]:
    count = rotated["sets"]
    copy = copy_roof(nbytes, count, samples)
    implementations = {
        "kpool-cupy": timed_entry(ours, count, samples, nbytes, copy["gbps"]),
        "cupy-composite": timed_entry(composite, count, samples, nbytes, copy["gbps"], _composite_refusal(count)),
    }
    ratios_to(implementations)
    return {
        "name": name,
        "bytes": nbytes,
        "input_sets": count,
        "rotation": rotated,
        "copy": copy,
        "implementations": implementations,
    }


def bench_tail_update(shape: DecodeShape, samples: int) -> dict[str, Any]:
    """The input sets are views of one array per operand, so tens of thousands of them stay cheap to make."""
    import cupy

    import kpool_cupy

    dtype = element_dtype(shape.dtype)
    requests, next_n, kpool, head_dim = shape.requests, shape.next_n, shape.kpool, shape.head_dim
    pools = -(-next_n // kpool)
    row = head_dim * dtype.itemsize
    allocated = requests * (2 * kpool * row + 2 * next_n * row + pools * row + 8 * next_n + 4 * pools)
    nbytes = tail_update_bytes(shape)
    rotated = _rotation(nbytes, allocated)
    count = rotated["sets"]
    rng = cupy.random.default_rng(0)
    last = (rng.integers(1, 4096, (count, requests)) * kpool + kpool - 1).astype(cupy.int32)
    positions = cupy.ascontiguousarray(last[..., None] - cupy.arange(next_n, dtype=cupy.int32)[::-1])
    tail = cupy.zeros((count, requests, 2, kpool, head_dim), dtype=dtype)
    k = rng.standard_normal((count, requests, next_n, head_dim), dtype=cupy.float32).astype(dtype)
    gate = rng.standard_normal((count, requests, next_n, head_dim), dtype=cupy.float32).astype(dtype)
    out = cupy.empty((count, requests, pools, head_dim), dtype=dtype)
    closed = cupy.empty((count, requests, pools), dtype=cupy.int32)
    # ape and the slots are read by every call: shared, like the model's weights (not counted in the bytes).
    ape = rng.standard_normal((kpool, head_dim), dtype=cupy.float32)
    slots = cupy.arange(requests, dtype=cupy.int32)
    sets = [
        {"tail": tail[i], "k": k[i], "gate": gate[i], "ape": ape, "positions": positions[i], "slot_idx": slots,
         "out": out[i], "closed": closed[i]}
        for i in range(count)
    ]  # fmt: skip

    def ours(i: int) -> Any:
        return kpool_cupy.kpool_tail_update(**sets[i], validate=False)

    def composite(i: int) -> Any:
        s = sets[i]
        return composite_tail_update(cupy, s["tail"], s["k"], s["gate"], s["ape"], s["positions"], slots, kpool)

    return _record(f"tail-update {shape.name}", nbytes, rotated, samples, ours, composite)


def bench_expand(tokens: int, kpool: int, samples: int) -> dict[str, Any]:
    import cupy

    import kpool_cupy

    nbytes = expand_bytes(tokens, POOL_TOPK, kpool)
    rotated = _rotation(nbytes, nbytes)
    count = rotated["sets"]
    rng = cupy.random.default_rng(1)
    chunk = rng.integers(-1, 8192, (count, tokens, POOL_TOPK)).astype(cupy.int32)
    ids = [chunk[i] for i in range(count)]  # one array, a view per set
    offsets = cupy.asarray(np.array([0, tokens], np.int32))
    cache = cupy.zeros(1, dtype=cupy.int32)
    member = cupy.arange(kpool, dtype=cupy.int64)

    def ours(i: int) -> Any:
        return kpool_cupy.kpool_expand_topk(ids[i], offsets, cache, kpool=kpool, validate=False)

    def composite(i: int) -> Any:
        chosen = ids[i].astype(cupy.int64)[..., None]
        return cupy.where(chosen >= 0, chosen * kpool + member, -1).reshape(tokens, -1).astype(cupy.int32)

    return _record(f"expand-topk {tokens}x{POOL_TOPK}", nbytes, rotated, samples, ours, composite)


def run_lifecycle(quick: bool, samples: int) -> Iterator[dict[str, Any]]:
    """The decode-side records, one at a time (the caller saves each)."""
    for shape in decode_shapes(quick):
        yield bench_tail_update(shape, samples)
    for tokens in (64, 512) if quick else (1, 64, 512):
        yield bench_expand(tokens, 4, samples)
