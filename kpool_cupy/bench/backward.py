"""Benchmarks of kpool_compress_backward against torch autograd through an eager implementation of the pooling
(the members gathered by index, a float32 softmax over them, the weighted sum; torch differentiates it and
keeps the weights for backward). GPU only, but for the sizes.

Each record credits both with the bytes the backward must move at least (``backward_bytes``): k, gate and the
pooled rows' gradient read once, the gradients of k and gate written once (ape's gradient and the offsets are
too small to count). Only the backward is timed: torch's forward graph is built once per input set and
``torch.autograd.grad`` replays it with ``retain_graph``; kpool-cupy's backward recomputes the weights itself.
Each entry says the device memory it holds from forward to backward beyond the inputs (``working_bytes``:
none for kpool-cupy, which saves only the inputs; torch keeps the gathered members and the float32 weights).
The torch gradients on the first input set are compared with kpool-cupy's within a few output ulps.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..pool_offsets import pool_row_offsets
from .lifecycle import device_rotation
from .stats import ratios_to
from .timing import copy_roof, timed_entry

HEAD_DIM = 128
KPOOL = 4


@dataclass(frozen=True)
class BackwardShape:
    """A training batch: ``requests`` sequences of ``tokens`` each, from position 0."""

    requests: int
    tokens: int
    head_dim: int = HEAD_DIM
    kpool: int = KPOOL

    @property
    def name(self) -> str:
        return f"backward B{self.requests}x{self.tokens} D{self.head_dim} k{self.kpool}"

    @property
    def total_tokens(self) -> int:
        return self.requests * self.tokens

    @property
    def pools(self) -> int:
        return self.requests * (self.tokens // self.kpool)


def backward_shapes(quick: bool = False) -> list[BackwardShape]:
    """Sequences of 4K tokens in batches of 1, 8 and 32 (bf16, head_dim 128, kpool 4: GLM-5.x's indexer).
    ``quick``: sizes the CPU emulator behind the CuPy double runs."""
    if quick:
        return [BackwardShape(2, 32)]
    return [BackwardShape(1, 4096), BackwardShape(8, 4096), BackwardShape(32, 4096)]


def backward_bytes(shape: BackwardShape, itemsize: int = 2) -> int:
    """k and gate read, their gradients written, the pooled rows' gradient read."""
    rows = shape.total_tokens * shape.head_dim * itemsize
    return 4 * rows + shape.pools * shape.head_dim * itemsize


def _input_sets(shape: BackwardShape, count: int) -> tuple[list[dict[str, Any]], Any]:
    import cupy

    from ..dtypes import BFLOAT16

    rng = np.random.default_rng(11)
    offsets = np.arange(shape.requests + 1, dtype=np.int32) * shape.tokens
    lengths = np.zeros(shape.requests, np.int32)
    pools = pool_row_offsets(offsets, lengths, shape.kpool).astype(np.int32)
    common = {"input_row_offsets": cupy.asarray(offsets), "cache_lengths": cupy.asarray(lengths)}
    common["pool_row_offsets"] = cupy.asarray(pools)
    sets = []
    for _ in range(count):
        rows = (shape.total_tokens, shape.head_dim)
        arrays = {
            "grad_pooled": rng.standard_normal((shape.pools, shape.head_dim)),
            "k": rng.standard_normal(rows),
            "gate": 3.0 * rng.standard_normal(rows),
        }
        made = {name: cupy.asarray(value.astype(np.float32).astype(BFLOAT16)) for name, value in arrays.items()}
        made["ape"] = cupy.asarray(rng.standard_normal((shape.kpool, shape.head_dim)).astype(np.float32))
        sets.append(made | common)
    members = np.arange(shape.pools)[:, None] * shape.kpool + np.arange(shape.kpool)  # position 0 onwards
    return sets, members


def _torch_eager(shape: BackwardShape, sets: list[dict[str, Any]], members: np.ndarray):
    """torch autograd's backward of the pooling written in torch operations, on CuPy's current stream (which the
    events time), per input set a graph built once; or the reason there is none."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, "torch has no CUDA device"
    import cupy

    stream = torch.cuda.ExternalStream(cupy.cuda.get_current_stream().ptr)
    index = torch.as_tensor(members, device="cuda")
    graphs = []
    with torch.cuda.stream(stream):
        for s in sets:
            k, gate, ape = (torch.from_dlpack(s[n]).clone().requires_grad_() for n in ("k", "gate", "ape"))
            grad = torch.from_dlpack(s["grad_pooled"])
            logits = gate[index].float() + ape
            pooled = (torch.softmax(logits, dim=1) * k[index].float()).sum(dim=1).to(torch.bfloat16)
            graphs.append((pooled, (k, gate, ape), grad))

    def run(i: int) -> Any:
        pooled, inputs, grad = graphs[i]
        with torch.cuda.stream(stream):
            return torch.autograd.grad(pooled, inputs, grad, retain_graph=True)

    return run, None


def bench_backward(shape: BackwardShape, samples: int) -> dict[str, Any]:
    """kpool_compress_backward and torch's autograd on the same input sets."""
    import cupy

    import kpool_cupy

    nbytes = backward_bytes(shape)
    rows = shape.total_tokens * shape.head_dim * 2
    rotated = device_rotation(nbytes, 4 * rows + shape.pools * shape.head_dim * 2)
    count = rotated["sets"]
    sets, members = _input_sets(shape, count)
    outputs = [
        {
            "grad_k": cupy.empty(s["k"].shape, s["k"].dtype),
            "grad_gate": cupy.empty(s["gate"].shape, s["gate"].dtype),
            "grad_ape": cupy.empty((shape.kpool, shape.head_dim), cupy.float32),
            # The partials in a buffer of the caller's: the call allocates nothing (the engine's way).
            "workspace": cupy.empty(
                kpool_cupy.compress_backward_workspace_bytes(shape.total_tokens, shape.head_dim, shape.kpool),
                cupy.uint8,
            ),
        }
        for s in sets
    ]

    def ours(i: int) -> Any:
        return kpool_cupy.kpool_compress_backward(**sets[i], **outputs[i], validate=False)

    want = [cupy.array(g, copy=True) for g in ours(0)]
    copy = copy_roof(nbytes, count, samples)
    implementations = {"kpool-cupy": timed_entry(ours, count, samples, nbytes, copy["gbps"])}
    implementations["kpool-cupy"]["working_bytes"] = 0
    eager, reason = _torch_eager(shape, sets, members)
    if eager is None:
        implementations["torch-eager-autograd"] = {"skipped": reason}
    else:
        got = [cupy.from_dlpack(g.float().detach()) for g in eager(0)]
        entry = timed_entry(eager, count, samples, nbytes, copy["gbps"], "torch autograd")
        # Within 4 bf16 ulps (2^-5 relative) of the larger magnitude, or 1e-3 absolute: float32 math on both
        # sides, torch's own order of sums and exp.
        entry["gradients_close_to_kpool_cupy"] = [
            bool(cupy.all(cupy.abs(a - b.astype(cupy.float32)) <= 2.0**-5 * cupy.abs(b.astype(cupy.float32)) + 1e-3))
            for a, b in zip(got, want, strict=True)
        ]
        entry["working_bytes"] = shape.pools * shape.kpool * shape.head_dim * (2 + 2 + 4 + 4)
        implementations["torch-eager-autograd"] = entry
    ratios_to(implementations)
    return {
        "name": shape.name,
        "kind": "backward",
        "requests": shape.requests,
        "tokens": shape.tokens,
        "head_dim": shape.head_dim,
        "kpool": shape.kpool,
        "bytes": nbytes,
        "input_sets": count,
        "rotation": rotated,
        "copy": copy,
        "implementations": implementations,
    }


def run_backward(quick: bool, samples: int) -> Iterator[dict[str, Any]]:
    """The backward's records, one at a time (the caller saves each)."""
    for shape in backward_shapes(quick):
        yield bench_backward(shape, samples)
