"""Benchmarks of the FP8 ring close: kpool_ring_close_fp8 into FP8 rows against the unfused sequence (GPU only,
but for the shapes and byte counts).

A chunk of a prefill after a cached prefix that ends mid-pool: each request's
pending pool takes ``from_ring`` members from its ring and the rest from the
chunk's first tokens. The unfused sequence is made of this package's own ops::

    pooled, closed = kpool_ring_close(tail, k, gate, ape, offsets, lengths, slots, out_dtype=bfloat16)
    values, scales = hadamard_quant_fp8(pooled)

Its bytes equal the fused op's bit for bit (the fused epilogue rounds each
pooled row to bf16 first), which each record checks on its first input set.
Both are credited with the fused op's bytes, so their bandwidths compare as
their times do; what the two passes really move is ``bytes_unfused``. There
is no target yet (issue 35): the records show where the ring close stands
beside a copy of its bytes and the empty kernel.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..dtypes import element_dtype
from .fp8 import fp8_row_bytes
from .tail_fp8 import bench_fused_and_unfused, fused_and_unfused_outputs

BATCHES = (1, 64, 512)  # as the FP8 decode step's records
CHUNK = 16  # tokens a request brings: a short chunk, since the close reads only its first kpool - from_ring


@dataclass(frozen=True)
class RingCloseShape:
    """``requests`` requests of ``chunk`` tokens each, whose cached prefixes end ``from_ring`` members into a
    pool: each closes one pool, from ``from_ring`` ring rows and ``kpool - from_ring`` of its tokens."""

    requests: int
    chunk: int = CHUNK
    head_dim: int = 128
    kpool: int = 4
    dtype: str = "bfloat16"
    from_ring: int = 2

    def __post_init__(self) -> None:
        if not 0 < self.from_ring < self.kpool or self.chunk < self.kpool - self.from_ring:
            raise ValueError(
                f"Invalid from_ring: expected 1 to kpool - 1 = {self.kpool - 1} members, with the chunk's "
                f"{self.chunk} tokens bringing the rest, got {self.from_ring}"
            )

    @property
    def name(self) -> str:
        return f"chunk-{self.requests}x{self.chunk}"


def ring_close_fp8_shapes(quick: bool = False) -> list[RingCloseShape]:
    """A request, a middle batch and the largest (``--quick``: the two larger)."""
    return [RingCloseShape(r) for r in (BATCHES[1:] if quick else BATCHES)]


def ring_close_bytes(shape: RingCloseShape) -> int:
    """The least the plain close moves: each request's kpool members' k and gate rows read (ring rows and chunk
    tokens alike) and one pooled row written in their dtype. The offsets, lengths, slots, closed ids and ape are
    not counted."""
    row = shape.head_dim * element_dtype(shape.dtype).itemsize
    return shape.requests * (shape.kpool * 2 * row + row)


def ring_close_fp8_bytes(shape: RingCloseShape) -> int:
    """The least the fused close moves: the plain close's, with one FP8 row (head_dim bytes and a float32 scale)
    written in place of each pooled row."""
    row = shape.head_dim * element_dtype(shape.dtype).itemsize
    return ring_close_bytes(shape) + shape.requests * (fp8_row_bytes(shape.head_dim) - row)


def ring_close_unfused_bytes(shape: RingCloseShape) -> int:
    """The least the unfused sequence moves: the fused bytes, and each bf16 pooled row written and read back."""
    row = shape.head_dim * element_dtype(shape.dtype).itemsize
    return ring_close_fp8_bytes(shape) + shape.requests * 2 * row


def _close_sets(shape: RingCloseShape, count: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``count`` input sets of one chunk (views of one array per operand), and the fused and unfused outputs."""
    import cupy

    dtype = element_dtype(shape.dtype)
    requests, chunk, kpool, head_dim = shape.requests, shape.chunk, shape.kpool, shape.head_dim
    rng = cupy.random.default_rng(5)
    tail = rng.standard_normal((count, requests, 2, kpool, head_dim), dtype=cupy.float32).astype(dtype)
    k = rng.standard_normal((count, requests * chunk, head_dim), dtype=cupy.float32).astype(dtype)
    gate = rng.standard_normal((count, requests * chunk, head_dim), dtype=cupy.float32).astype(dtype)
    ape = rng.standard_normal((kpool, head_dim), dtype=cupy.float32)  # shared by every call, like the weights
    offsets = cupy.arange(requests + 1, dtype=cupy.int32) * chunk
    # Each prefix ends from_ring members into a pool, at positions that differ per request and set.
    lengths = (rng.integers(0, 4096, (count, requests)) * kpool + shape.from_ring).astype(cupy.int32)
    slots = cupy.arange(requests, dtype=cupy.int32)
    sets = [
        {
            "tail": tail[i],
            "k": k[i],
            "gate": gate[i],
            "ape": ape,
            "input_row_offsets": offsets,
            "cache_lengths": lengths[i],
            "slot_idx": slots,
        }
        for i in range(count)
    ]
    return sets, fused_and_unfused_outputs(count, (requests,), head_dim, dtype)


def bench_ring_close_fp8(shape: RingCloseShape, samples: int) -> dict[str, Any]:
    """The fused op against the unfused sequence on the same input sets, writing FP8 rows; set 0's bytes of
    each are compared first."""
    import kpool_cupy

    requests, head_dim = shape.requests, shape.head_dim
    row = head_dim * element_dtype(shape.dtype).itemsize
    allocated = requests * (2 * shape.kpool * row + 2 * shape.chunk * row + row + 2 * fp8_row_bytes(head_dim) + 12)
    fields = {
        "requests": requests,
        "chunk": shape.chunk,
        "from_ring": shape.from_ring,
        "head_dim": head_dim,
        "kpool": shape.kpool,
        "dtype": shape.dtype,
    }
    return bench_fused_and_unfused(
        f"ring-close-fp8 {shape.name}",
        fields,
        (kpool_cupy.kpool_ring_close_fp8, kpool_cupy.kpool_ring_close),
        lambda count: _close_sets(shape, count),
        (ring_close_fp8_bytes(shape), ring_close_unfused_bytes(shape), allocated),
        samples,
    )


def run_ring_close_fp8(quick: bool, samples: int) -> Iterator[dict[str, Any]]:
    """The FP8 ring-close records, one at a time (the caller saves each)."""
    for shape in ring_close_fp8_shapes(quick):
        yield bench_ring_close_fp8(shape, samples)
