"""Benchmarks of the FP8 scorer, kpool_index_logits_fp8, against a CuPy and a torch composite (GPU only, but for
the sizes).

The CuPy composite does what an engine without the kernel does, in float32 CuPy array operations::

    keys    = e4m3(cache[block_table]) * scales            # [B, pools, D], every page of every request
    queries = e4m3(q)                                      # [B, next_n, H, D]
    logits  = sum over h of weights * relu(queries @ keys)  # [B, next_n, pools], -inf past what a token sees

Every record credits both with the bytes the kernel must move at least: each
request's visible pooled keys read once (head_dim e4m3 bytes and a float32
scale each), the queries and weights read once, the logits written once; and
with the FLOPs of the dot products, 2 * tokens * heads * pools * head_dim.
The torch composite (``bench/index_torch.py``, when torch has CUDA) does the
same in bf16, as engines do on sm_80 and sm_120. Each composite's result on
the first input set is compared with the kernel's
(``max_abs_diff_vs_kpool_cupy``; the two add in different orders; the torch
one's also against its bound, ``worst_fraction_of_bf16_bound``). Every
timed entry, the copy's too, gives its bandwidth as a fraction of the copy
in the same run and of a fixed ``FIXED_ROOF_GBPS`` (``fraction_of_fixed_roof``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kernel.pages import FP8_PAGES
from .fp8 import CACHE_BLOCK_SIZE, fp8_row_bytes
from .index_torch import torch_index_composite, torch_index_logits, worst_fraction_of_bound
from .lifecycle import composite_refusal, device_rotation
from .stats import bandwidth_gbps, fraction_of, ratios_to
from .timing import copy_roof, describe, timed_entry

HEAD_DIM = 128  # the engines'
KPOOL = 4
# The composite holds float32 keys [B, pools, D] and scores [B, next_n, H, pools]; past this it is skipped
# (a prefill chunk of 8192 tokens at 128K would need 68 GB of scores).
COMPOSITE_BYTES = 24 * 2**30
# A fixed yardstick, not a measurement: a nominal figure for the H200's HBM3e (issue 33's; 0.81 of the 4.8 TB/s on
# the spec sheet). Records of every run and shape are held against this one number,
# while the same-run copy (fraction_of_copy) varies with the shape (2026-12-04: 4.19 TB/s at decode-64x1 128K,
# 2.77 at decode-512x1 128K), so a fraction of copy above 1 is expected at the largest shapes: not clamped.
FIXED_ROOF_GBPS = 3900.0


@dataclass(frozen=True)
class IndexShape:
    """``requests`` requests of ``next_n`` query tokens each, after ``context - next_n`` cached tokens."""

    kind: str  # "decode" or "prefill"
    heads: int
    requests: int
    next_n: int
    context: int  # tokens of a request up to and with its last query token

    @property
    def name(self) -> str:
        size = f"{self.context // 1024}K" if self.context >= 1024 else str(self.context)
        return f"{self.kind}-{self.requests}x{self.next_n} {size} h{self.heads}"

    @property
    def tokens(self) -> int:
        return self.requests * self.next_n

    @property
    def pools(self) -> int:
        """Pools the last token of a request sees: every column of the result."""
        return self.context // KPOOL

    @property
    def columns(self) -> int:
        """Block-table columns (pages) a request needs."""
        return -(-self.pools // CACHE_BLOCK_SIZE)


def index_shapes(quick: bool = False) -> list[IndexShape]:
    """The engines' shapes: decode at 8K and 128K tokens of context, B 1/64/512, next_n 1 and 2, and prefill
    chunks of 2048 and 8192 tokens ending at 8K and 128K, at 32 and 64 heads. ``--quick``: small sizes the
    CPU emulator behind the CuPy double runs in seconds."""
    if quick:
        return [IndexShape("decode", 16, 4, 2, 512), IndexShape("prefill", 16, 1, 64, 512)]
    shapes = []
    for heads in (64, 32):
        shapes.append(IndexShape("prefill", heads, 1, 2048, 8192))
        for context in (8192, 131072):
            for requests in (1, 64, 512):
                for next_n in (1, 2):
                    shapes.append(IndexShape("decode", heads, requests, next_n, context))
        shapes.append(IndexShape("prefill", heads, 1, 8192, 131072))
    return shapes


def index_bytes(shape: IndexShape) -> int:
    """The least a call moves: each request's visible keys once, the queries and weights once, the logits once."""
    keys = shape.requests * shape.pools * fp8_row_bytes(HEAD_DIM)
    queries = shape.tokens * shape.heads * (HEAD_DIM + 4)
    return keys + queries + shape.tokens * shape.pools * 4


def index_flops(shape: IndexShape) -> int:
    return 2 * shape.tokens * shape.heads * shape.pools * HEAD_DIM


def fraction_of_fixed_roof(nbytes: int, milliseconds: float) -> float:
    """``nbytes`` moved in ``milliseconds`` as a fraction of ``FIXED_ROOF_GBPS`` (above 1: faster than it)."""
    return fraction_of(bandwidth_gbps(nbytes, milliseconds), FIXED_ROOF_GBPS)


def visible_pools(shape: IndexShape) -> np.ndarray:
    """bool ``[next_n, pools]``: the pools each of a request's tokens sees, the same for every request."""
    seen_by = (shape.context - shape.next_n + np.arange(shape.next_n) + 1) // KPOOL
    return np.arange(shape.pools)[None, :] < seen_by[:, None]


def _input_sets(shape: IndexShape, count: int) -> tuple[list[dict[str, Any]], Any, Any]:
    """``count`` input sets (views of one array per operand; the block table and offsets shared), the logits
    outputs, and each set's page order (request b's pages in table order)."""
    import cupy

    requests, next_n, heads = shape.requests, shape.next_n, shape.heads
    pages = requests * shape.columns
    rng = cupy.random.default_rng(5)
    entry, split = FP8_PAGES.entry_bytes(HEAD_DIM), FP8_PAGES.scale_offset(CACHE_BLOCK_SIZE, HEAD_DIM, 0)
    raw = rng.integers(0, 256, (count, pages, CACHE_BLOCK_SIZE * entry), dtype=cupy.int32)
    raw = raw.astype(cupy.uint8)
    raw = cupy.where((raw & 0x7F) == 0x7F, raw ^ 1, raw)  # no NaN bytes
    powers = np.random.default_rng(7).integers(-8, 4, (count, pages, CACHE_BLOCK_SIZE))
    scales = cupy.asarray(np.exp2(powers).astype(np.float32))  # ue8m0 scales, as the writers make them
    raw[:, :, split:] = scales.view(cupy.uint8).reshape(count, pages, -1)
    cache = raw.reshape(count, pages, CACHE_BLOCK_SIZE, entry)
    order = np.random.default_rng(6).permutation(pages).astype(np.int32)
    table = cupy.asarray(order.reshape(requests, shape.columns))
    q = rng.integers(0, 256, (count, shape.tokens, heads, HEAD_DIM), dtype=cupy.int32).astype(cupy.uint8)
    q = cupy.where((q & 0x7F) == 0x7F, q ^ 1, q)
    weights = rng.standard_normal((count, shape.tokens, heads), dtype=cupy.float32)
    offsets = cupy.arange(0, shape.tokens + 1, next_n, dtype=cupy.int32)
    lengths = cupy.full(requests, shape.context - next_n, dtype=cupy.int32)
    out = cupy.empty((count, shape.tokens, shape.pools), dtype=cupy.float32)
    shared = {"cache_block_table": table, "input_row_offsets": offsets, "cache_lengths": lengths}
    sets = [{"q": q[i], "weights": weights[i], "cache": cache[i], **shared} for i in range(count)]
    return sets, out, table


def _composite(shape: IndexShape, sets: list[dict[str, Any]], out: Any) -> Any:
    """The CuPy composite, writing each set's logits into ``out``."""
    import cupy

    values = cupy.asarray(np.arange(256, dtype=np.uint8).view(_e4m3()).astype(np.float32))
    requests, next_n, heads, pools = shape.requests, shape.next_n, shape.heads, shape.pools
    seen = cupy.asarray(visible_pools(shape))

    def run(i: int) -> Any:
        s = sets[i]
        pages = s["cache"][s["cache_block_table"]].reshape(requests, shape.columns, -1)  # [B, cols, page bytes]
        split = FP8_PAGES.scale_offset(CACHE_BLOCK_SIZE, HEAD_DIM, 0)  # a page's values, then its scales
        keys = values[pages[:, :, :split].reshape(requests, -1, HEAD_DIM)[:, :pools]]
        scales = pages[:, :, split:].copy().view(cupy.float32).reshape(requests, -1)[:, :pools]
        keys *= scales[:, :, None]
        queries = values[s["q"]].reshape(requests, next_n * heads, HEAD_DIM)
        scores = cupy.matmul(queries, keys.transpose(0, 2, 1)).reshape(requests, next_n, heads, pools)
        weighted = cupy.maximum(scores, 0) * s["weights"].reshape(requests, next_n, heads, 1)
        logits = weighted.sum(axis=2)
        out[i][...] = cupy.where(seen[None], logits, -cupy.inf).reshape(shape.tokens, pools)
        return out[i]

    return run


def _e4m3() -> Any:
    import ml_dtypes

    return ml_dtypes.float8_e4m3fn


def bench_index_logits(shape: IndexShape, samples: int) -> dict[str, Any]:
    """The kernel and the composite on the same input sets; set 0's logits compared first."""
    import cupy

    import kpool_cupy

    nbytes = index_bytes(shape)
    page_bytes = CACHE_BLOCK_SIZE * FP8_PAGES.entry_bytes(HEAD_DIM)
    allocated = shape.requests * shape.columns * page_bytes + shape.tokens * (shape.heads * (HEAD_DIM + 4))
    allocated += shape.tokens * shape.pools * 4
    rotated = device_rotation(nbytes, allocated)
    count = rotated["sets"]
    sets, out, _ = _input_sets(shape, count)
    composite_out = cupy.empty(out.shape, dtype=out.dtype)

    def ours(i: int) -> Any:
        return kpool_cupy.kpool_index_logits_fp8(
            **sets[i], kpool=KPOOL, max_pools=shape.pools, out=out[i], validate=False
        )

    want = cupy.array(ours(0), copy=True)
    copy = copy_roof(nbytes, count, samples)
    implementations = {"kpool-cupy": timed_entry(ours, count, samples, nbytes, copy["gbps"])}
    implementations["kpool-cupy"]["build"] = default_build()
    if hopper() and os.environ.get(BENCH_SM90A_VARIABLE) == "1":
        implementations["kpool-cupy-sm90a"] = _sm90a_entry(ours, want, count, samples, nbytes, copy["gbps"])
    elif hopper():
        implementations["kpool-cupy-sm90a"] = {"skipped": f"{BENCH_SM90A_VARIABLE} is not 1"}
    held = 4 * shape.requests * shape.pools * (HEAD_DIM + shape.next_n * shape.heads)
    if held > COMPOSITE_BYTES:
        implementations["cupy-composite"] = {"skipped": f"it would hold {held / 2**30:.0f} GiB of float32"}
    else:
        composite = _composite(shape, sets, composite_out)
        got = composite(0)
        finite = cupy.isfinite(want)
        same_minus_inf = bool(cupy.array_equal(cupy.isneginf(got), cupy.isneginf(want)))
        difference = float(cupy.abs(cupy.where(finite, got - want, 0)).max()) if want.size else 0.0
        entry = timed_entry(composite, count, samples, nbytes, copy["gbps"], composite_refusal(count))
        entry["max_abs_diff_vs_kpool_cupy"] = difference
        entry["same_minus_inf_as_kpool_cupy"] = same_minus_inf
        implementations["cupy-composite"] = entry
    implementations["torch-composite"] = _torch_entry(shape, sets, want, count, samples, nbytes, copy["gbps"])
    ratios_to(implementations)
    flops = index_flops(shape)
    copy["fraction_of_fixed_roof"] = fraction_of_fixed_roof(copy["bytes_moved"], copy["median_ms"])
    for entry in implementations.values():
        if "median_ms" in entry:
            entry["tflops"] = flops / (entry["median_ms"] * 1e9) if entry["median_ms"] > 0 else 0.0
            entry["fraction_of_fixed_roof"] = fraction_of_fixed_roof(nbytes, entry["median_ms"])
    return {
        "name": f"index {shape.name}",
        "kind": shape.kind,
        "requests": shape.requests,
        "next_n": shape.next_n,
        "heads": shape.heads,
        "context": shape.context,
        "head_dim": HEAD_DIM,
        "kpool": KPOOL,
        "block_size": CACHE_BLOCK_SIZE,
        "bytes": nbytes,
        "flops": flops,
        "fixed_roof_gbps": FIXED_ROOF_GBPS,
        "input_sets": count,
        "rotation": rotated,
        "copy": copy,
        "implementations": implementations,
    }


# "1": time the sm_90a build too on compute capability 9.0. scripts/gpu_check.sh sets it only once the run's index
# check passed on that build: a kernel that faults would end the bench's process, and the records after it.
BENCH_SM90A_VARIABLE = "KPOOL_CUPY_BENCH_SM90A"


def hopper() -> bool:
    """Whether the current device has compute capability 9.0, where the scorer has two builds."""
    import cupy

    return str(cupy.cuda.Device().compute_capability) == "90"


def default_build() -> str:
    """The build ``kpool-cupy`` ran: the device's own, or on compute capability 9.0 KPOOL_CUPY_SM90_BUILD's."""
    from ..backends.cupy import sm90_build

    return sm90_build() if hopper() else "device"


@contextmanager
def sm90_build_of(build: str) -> Iterator[None]:
    """Calls inside take ``build`` ("sm_90a" or "sm_90") on compute capability 9.0; plans (which replay the kernel
    their first call chose) are dropped on entry and exit."""
    from ..backends import cupy_plans
    from ..backends.cupy import SM90_BUILD_VARIABLE

    saved = os.environ.get(SM90_BUILD_VARIABLE)
    os.environ[SM90_BUILD_VARIABLE] = build
    cupy_plans.forget_all()
    try:
        yield
    finally:
        cupy_plans.forget_all()
        if saved is None:
            os.environ.pop(SM90_BUILD_VARIABLE, None)
        else:
            os.environ[SM90_BUILD_VARIABLE] = saved


def _sm90a_entry(
    ours: Callable[[int], Any], want: Any, count: int, samples: int, nbytes: int, copy_gbps: float
) -> dict[str, Any]:
    """The sm_90a build (wgmma) on the same sets: timed, and set 0 compared with ``want`` (the default build's;
    the two sum in different orders)."""
    import cupy

    try:
        with sm90_build_of("sm_90a"):
            got = cupy.array(ours(0), copy=True)
            entry = timed_entry(ours, count, samples, nbytes, copy_gbps)
    except Exception as error:  # a build that does not load is recorded; the sweep goes on
        return {"failed": describe(error)}
    finite = cupy.isfinite(want)
    entry["build"] = "sm_90a"
    entry["max_abs_diff_vs_kpool_cupy"] = float(cupy.abs(cupy.where(finite, got - want, 0)).max()) if want.size else 0.0
    entry["same_minus_inf_as_kpool_cupy"] = bool(cupy.array_equal(cupy.isneginf(got), cupy.isneginf(want)))
    return entry


def _torch_entry(
    shape: IndexShape, sets: list[dict[str, Any]], want: Any, count: int, samples: int, nbytes: int, copy_gbps: float
) -> dict[str, Any]:
    """The torch composite's entry: timed by events (torch operations), set 0 compared with ``want``; or why
    it was skipped."""
    import cupy

    # Gathered pages and bf16 keys (twice: before and after the scales), then bf16 scores and float32 products.
    held = shape.requests * shape.pools * (HEAD_DIM + 4 + 4 * HEAD_DIM) + 6 * shape.tokens * shape.heads * shape.pools
    if held > COMPOSITE_BYTES:
        return {"skipped": f"it would hold {held / 2**30:.0f} GiB"}
    composite, reason = torch_index_composite(sets, visible_pools(shape))
    if composite is None:
        return {"skipped": reason}
    import torch

    cupy.get_default_memory_pool().free_all_blocks()  # the CuPy composite's float32, before torch allocates
    got = cupy.asarray(composite(0))  # zero copy through __cuda_array_interface__
    s = sets[0]
    names = ("cache", "cache_block_table", "q")
    magnitude = torch_index_logits(
        *(torch.as_tensor(s[n], device="cuda") for n in names),
        torch.as_tensor(s["weights"], device="cuda").abs(),
        torch.as_tensor(visible_pools(shape), device="cuda"),
    )
    torch.cuda.synchronize()  # torch's stream wrote got and magnitude; CuPy reads them below
    finite = cupy.isfinite(want)
    entry = timed_entry(composite, count, samples, nbytes, copy_gbps, "torch operations")
    entry["max_abs_diff_vs_kpool_cupy"] = float(cupy.abs(cupy.where(finite, got - want, 0)).max()) if want.size else 0.0
    entry["same_minus_inf_as_kpool_cupy"] = bool(cupy.array_equal(cupy.isneginf(got), cupy.isneginf(want)))
    entry["worst_fraction_of_bf16_bound"] = worst_fraction_of_bound(cupy, got, want, cupy.asarray(magnitude))
    del composite, got, magnitude
    torch.cuda.empty_cache()  # torch's cached blocks, back for the next record's CuPy allocations
    return entry


def run_index(quick: bool, samples: int) -> Iterator[dict[str, Any]]:
    """The scorer's records, one at a time (the caller saves each)."""
    for shape in index_shapes(quick):
        yield bench_index_logits(shape, samples)
