"""Benchmarks of kpool_index_topk alone, against ``torch.topk`` on the same logits. GPU only, but for the sizes.

The decode and prefill records take the arguments of the two-step inside the matching ``select`` record (kpool
4, no tail, its 64-token KV block table, top 512) on random float32 logits; ``topk rising`` the same with each
row increasing in pool id (the order that cuts the buffer back at every tile); ``topk kpool1`` the plain V3.2
indexer (kpool 1, 131,072 logits a row, top 2048, positions out, no block table). Each record credits the call
with the bytes it must move (``topk_bytes``): the logits of every token with more candidates than pool_topk,
read once, and the positions written. ``torch.topk`` (values and ids, unsorted) does less: no visibility, no
ordering of the ids, no expansion; it is the engines' usual baseline. Each entry says the device memory it
holds beyond its inputs and outputs (``working_bytes``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..ops.index_topk import call_workspace_bytes, topk_splits
from .lifecycle import device_rotation
from .select import KV_BLOCK_SIZE, kv_table
from .stats import ratios_to
from .timing import copy_roof, timed_entry


@dataclass(frozen=True)
class TopkShape:
    """``requests`` requests of ``next_n`` tokens each, after ``context - next_n`` cached tokens; each token's
    row holds the ``context // kpool`` pools its request's last token sees."""

    kind: str  # "decode" or "prefill"
    requests: int
    next_n: int
    context: int
    pool_topk: int = 512
    kpool: int = 4
    rising: bool = False  # each row increasing in pool id; random otherwise
    paged: bool = True  # positions become slots through a KV block table

    @property
    def name(self) -> str:
        size = f"{self.context // 1024}K" if self.context >= 1024 else str(self.context)
        variant = (" rising" if self.rising else "") + (f" kpool{self.kpool}" if self.kpool != 4 else "")
        return f"topk{variant} {self.kind}-{self.requests}x{self.next_n} {size} top{self.pool_topk}"

    @property
    def tokens(self) -> int:
        return self.requests * self.next_n

    @property
    def pools(self) -> int:
        return self.context // self.kpool


def topk_shapes(quick: bool = False) -> list[TopkShape]:
    """The issue's records; ``quick``: sizes the CPU emulator behind the CuPy double runs (a row split over
    blocks, and a prefill of a block a row)."""
    if quick:
        return [TopkShape("decode", 2, 1, 16384, 64, kpool=1), TopkShape("prefill", 1, 8, 4096, 64, rising=True)]
    decode = [TopkShape("decode", requests, 1, 131072) for requests in (1, 64, 512)]
    return [
        *decode,
        TopkShape("prefill", 1, 8192, 131072),
        TopkShape("decode", 512, 1, 131072, rising=True),
        TopkShape("decode", 1, 1, 131072, 2048, kpool=1, paged=False),
    ]


def visible_pools(shape: TopkShape) -> list[int]:
    """The pools each token of a request sees (every request alike)."""
    cached = shape.context - shape.next_n
    return [(cached + j + 1) // shape.kpool for j in range(shape.next_n)]


def topk_bytes(shape: TopkShape) -> int:
    """The least the call moves: the logits of each token with more candidates than pool_topk, and the
    positions written."""
    read = sum(4 * min(v, shape.pools) for v in visible_pools(shape) if v > shape.pool_topk)
    return shape.requests * read + shape.tokens * shape.pool_topk * shape.kpool * 4


def _logits(shape: TopkShape, count: int) -> Any:
    """``count`` sets of [tokens, pools] float32 logits: standard normal, or each row sorted (rising)."""
    import cupy

    rng = cupy.random.default_rng(11)
    logits = rng.standard_normal((count, shape.tokens, shape.pools), dtype=cupy.float32)
    return cupy.sort(logits, axis=2) if shape.rising else logits


def _torch_topk(logits: Any, pool_topk: int):
    """``torch.topk`` on each set's logits (on CuPy's current stream, which the events time), or the reason
    there is none."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, "torch has no CUDA device"
    import cupy

    stream = torch.cuda.ExternalStream(cupy.cuda.get_current_stream().ptr)
    scores = [torch.as_tensor(logits[i], device="cuda") for i in range(logits.shape[0])]

    def run(i: int) -> Any:
        with torch.cuda.stream(stream):
            return torch.topk(scores[i], pool_topk, dim=1, sorted=False).indices

    return run, None


def bench_topk(shape: TopkShape, samples: int) -> dict[str, Any]:
    """kpool_index_topk and torch.topk on the same input sets."""
    import cupy

    import kpool_cupy

    nbytes = topk_bytes(shape)
    rotated = device_rotation(nbytes, shape.tokens * shape.pools * 4)
    count = rotated["sets"]
    logits = _logits(shape, count)
    offsets = cupy.arange(0, shape.tokens + 1, shape.next_n, dtype=cupy.int32)
    lengths = cupy.full(shape.requests, shape.context - shape.next_n, dtype=cupy.int32)
    paged = {"block_table": kv_table(shape.requests, shape.context), "block_size": KV_BLOCK_SIZE}
    needed = call_workspace_bytes(shape.tokens, shape.pools, shape.pool_topk)  # this call's need
    workspace = cupy.zeros(needed, cupy.uint8) if needed else None

    def ours(i: int) -> Any:
        return kpool_cupy.kpool_index_topk(
            logits[i], offsets, lengths, kpool=shape.kpool, pool_topk=shape.pool_topk, workspace=workspace,
            validate=False, **(paged if shape.paged else {}),
        )  # fmt: skip

    want = cupy.array(ours(0), copy=True)
    copy = copy_roof(nbytes, count, samples)
    implementations = {"kpool-cupy": timed_entry(ours, count, samples, nbytes, copy["gbps"])}
    implementations["kpool-cupy"]["working_bytes"] = needed
    baseline, reason = _torch_topk(logits, shape.pool_topk)
    if baseline is None:
        implementations["torch-topk"] = {"skipped": reason}
    else:
        entry = timed_entry(baseline, count, samples, nbytes, copy["gbps"], "torch operations")
        if shape.kpool == 1 and not shape.paged:  # positions are the pool ids: the same set, row by row
            ids = cupy.sort(cupy.asarray(baseline(0)), axis=1).astype(cupy.int32)
            entry["rows_equal_to_kpool_cupy"] = int(cupy.all(ids == want, axis=1).sum())
        entry["working_bytes"] = shape.tokens * shape.pool_topk * (4 + 8)  # its values and int64 ids
        implementations["torch-topk"] = entry
    ratios_to(implementations)
    return {
        "name": shape.name,
        "kind": shape.kind,
        "requests": shape.requests,
        "next_n": shape.next_n,
        "context": shape.context,
        "kpool": shape.kpool,
        "pool_topk": shape.pool_topk,
        "rising": shape.rising,
        "paged": shape.paged,
        "splits": topk_splits(shape.tokens, shape.pools, shape.pool_topk),
        "bytes": nbytes,
        "input_sets": count,
        "rotation": rotated,
        "copy": copy,
        "implementations": implementations,
    }


def run_topk(quick: bool, samples: int) -> Iterator[dict[str, Any]]:
    """The top-k records, one at a time (the caller saves each)."""
    for shape in topk_shapes(quick):
        yield bench_topk(shape, samples)
