"""Benchmarks of the indexer's selection: kpool_index_select_fp8 (one launch, no logits) against the scorer then
kpool_index_topk (``kpool-cupy-two-step``: two launches through [tokens, pools] float32 logits) and against a
torch composite on the
same logits (``torch.topk``, a sort of the chosen ids, the expansion and the block-table gather as tensor
operations). GPU only, but for the sizes.

Every record credits all three with the bytes the fused call must move at least: each request's visible
pooled keys once, the queries and weights once, the positions written once (``select_bytes``), and with the
scorer's FLOPs. Each implementation's entry says the device memory it holds beyond its inputs and outputs
(``working_bytes``: the workspace; the logits; the logits, the top-k values and ids and the expanded
positions before they are cast). The two-step result on the first input set is compared with the fused one
bit for bit; the torch composite's, row by row (its order for ties and NaN is torch's).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..kernel.pages import FP8_PAGES
from ..ops.index_select_fp8 import call_workspace_bytes
from .fp8 import CACHE_BLOCK_SIZE
from .index import HEAD_DIM, KPOOL, IndexShape, _input_sets, index_bytes, index_flops
from .lifecycle import device_rotation
from .stats import ratios_to
from .timing import copy_roof, timed_entry

POOL_TOPK = 512  # GLM-5.x: 512 pools of 4 tokens
KV_BLOCK_SIZE = 64  # the token KV cache's pages the positions map to


def select_shapes(quick: bool = False) -> list[IndexShape]:
    """Decode B 1/64/512 at 8K and 128K of context, next_n 1 and 2, and prefill chunks of 2048 and 8192
    tokens ending at 128K, at 32 heads. ``quick``: sizes the CPU emulator behind the CuPy double runs."""
    if quick:
        return [IndexShape("decode", 16, 2, 2, 4096), IndexShape("prefill", 16, 1, 16, 4096)]
    shapes = []
    for context in (8192, 131072):
        for requests in (1, 64, 512):
            for next_n in (1, 2):
                shapes.append(IndexShape("decode", 32, requests, next_n, context))
    shapes += [IndexShape("prefill", 32, 1, 2048, 131072), IndexShape("prefill", 32, 1, 8192, 131072)]
    return shapes


def select_bytes(shape: IndexShape, pool_topk: int = POOL_TOPK) -> int:
    """The least the fused call moves: the scorer's reads (``index_bytes`` less its logits) and the positions."""
    return index_bytes(shape) - shape.tokens * shape.pools * 4 + shape.tokens * pool_topk * KPOOL * 4


def kv_table(requests: int, context: int) -> Any:
    """Each request's token KV pages, in a shuffled order: enough for every position its tokens see."""
    import cupy
    import numpy as np

    columns = -(-context // KV_BLOCK_SIZE)
    order = np.random.default_rng(8).permutation(requests * columns).astype(np.int32)
    return cupy.asarray(order.reshape(requests, columns))


def _torch_composite(shape: IndexShape, logits: Any, block_table: Any, pool_topk: int):
    """The same selection in torch tensor operations on the scorer's logits (on CuPy's current stream, which
    the events time), or the reason there is none."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, "torch has no CUDA device"
    import cupy

    stream = torch.cuda.ExternalStream(cupy.cuda.get_current_stream().ptr)
    request = torch.arange(shape.requests, device="cuda").repeat_interleave(shape.next_n)[:, None]
    table = torch.as_tensor(block_table, device="cuda")
    scores = [torch.as_tensor(logits[i], device="cuda") for i in range(logits.shape[0])]
    member = torch.arange(KPOOL, device="cuda")

    def run(i: int) -> Any:
        with torch.cuda.stream(stream):
            ids = torch.topk(scores[i], pool_topk, dim=1, sorted=False).indices.sort(dim=1).values
            positions = (ids[:, :, None] * KPOOL + member).reshape(shape.tokens, -1)
            slots = table[request, positions // KV_BLOCK_SIZE] * KV_BLOCK_SIZE + positions % KV_BLOCK_SIZE
            return slots.to(torch.int32)

    return run, None


def bench_select(shape: IndexShape, samples: int, pool_topk: int = POOL_TOPK) -> dict[str, Any]:
    """The fused call, the two calls and the torch composite on the same input sets."""
    import cupy

    import kpool_cupy

    nbytes = select_bytes(shape, pool_topk)
    page_bytes = CACHE_BLOCK_SIZE * FP8_PAGES.entry_bytes(HEAD_DIM)
    allocated = shape.requests * shape.columns * page_bytes + shape.tokens * shape.heads * (HEAD_DIM + 4)
    allocated += shape.tokens * shape.pools * 4  # each set's logits, for the two-step and torch
    rotated = device_rotation(nbytes, allocated)
    count = rotated["sets"]
    sets, logits, _ = _input_sets(shape, count)
    table = kv_table(shape.requests, shape.context)
    workspace = cupy.zeros(call_workspace_bytes(shape.tokens, pool_topk), cupy.uint8)  # this call's need
    paged = {"block_table": table, "block_size": KV_BLOCK_SIZE}

    def fused(i: int) -> Any:
        return kpool_cupy.kpool_index_select_fp8(
            **sets[i], kpool=KPOOL, pool_topk=pool_topk, workspace=workspace, validate=False, **paged
        )

    def two_step(i: int) -> Any:
        s = sets[i]
        kpool_cupy.kpool_index_logits_fp8(**s, kpool=KPOOL, max_pools=shape.pools, out=logits[i], validate=False)
        return kpool_cupy.kpool_index_topk(
            logits[i], s["input_row_offsets"], s["cache_lengths"], kpool=KPOOL, pool_topk=pool_topk,
            validate=False, **paged,
        )  # fmt: skip

    want = cupy.array(fused(0), copy=True)
    two_step_result = two_step(0)  # also fills logits[0] for the torch composite's comparison
    copy = copy_roof(nbytes, count, samples)
    implementations = {"kpool-cupy": timed_entry(fused, count, samples, nbytes, copy["gbps"])}
    implementations["kpool-cupy"]["working_bytes"] = int(workspace.nbytes)
    entry = timed_entry(two_step, count, samples, nbytes, copy["gbps"])
    entry["same_as_fused"] = bool(cupy.array_equal(two_step_result, want))
    entry["working_bytes"] = shape.tokens * shape.pools * 4
    implementations["kpool-cupy-two-step"] = entry
    composite, reason = _torch_composite(shape, logits, table, pool_topk)
    if composite is None:
        implementations["torch-composite"] = {"skipped": reason}
    else:
        got = cupy.asarray(composite(0))  # zero copy through __cuda_array_interface__
        entry = timed_entry(composite, count, samples, nbytes, copy["gbps"], "torch operations")
        entry["rows_equal_to_fused"] = int(cupy.all(got == want[:, : got.shape[1]], axis=1).sum())
        entry["working_bytes"] = shape.tokens * (shape.pools * 4 + pool_topk * (4 + 8 + 8 * KPOOL))
        implementations["torch-composite"] = entry
    ratios_to(implementations)
    flops = index_flops(shape)
    for item in implementations.values():
        if "median_ms" in item:
            item["tflops"] = flops / (item["median_ms"] * 1e9) if item["median_ms"] > 0 else 0.0
    return {
        "name": f"select {shape.name} top{pool_topk}",
        "kind": shape.kind,
        "requests": shape.requests,
        "next_n": shape.next_n,
        "heads": shape.heads,
        "context": shape.context,
        "pool_topk": pool_topk,
        "head_dim": HEAD_DIM,
        "kpool": KPOOL,
        "bytes": nbytes,
        "flops": flops,
        "input_sets": count,
        "rotation": rotated,
        "copy": copy,
        "implementations": implementations,
    }


def run_select(quick: bool, samples: int) -> Iterator[dict[str, Any]]:
    """The selection's records, one at a time (the caller saves each)."""
    for shape in select_shapes(quick):
        yield bench_select(shape, samples)
