"""Benchmarks of the FP8 decode step: kpool_tail_update_fp8 into FP8 rows against the unfused sequence, and the
host cost of its hot call (GPU only, but for the byte counts).

The unfused sequence is made of this package's own ops::

    pooled, closed = kpool_tail_update(tail, k, gate, ape, positions, slots, out_dtype=bfloat16)
    values, scales = hadamard_quant_fp8(pooled)

Its bytes equal the fused op's bit for bit (the fused epilogue rounds each
pooled row to bf16 first, as kpool_compress_fp8's does), which each record
checks on its first input set. Not to be misread: both are credited with the
fused op's bytes, so their bandwidths compare as their times do; what the two
passes really move is ``bytes_unfused``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..dtypes import element_dtype
from .fp8 import fp8_row_bytes
from .lifecycle import DecodeShape, composite_refusal, device_rotation, step_positions, tail_update_bytes
from .plans import plan_launch
from .stats import ratios_to
from .timing import HOST_REPEATS, copy_roof, host_call_microseconds, timed_entry

BATCHES = (1, 64, 512)  # the decode side's smallest, middle and largest batches
STEPS = (1, 2, 4)  # next_n: a plain step, and speculative steps of one and three drafts
HOST_SHAPE = DecodeShape(512, 1)  # the hot call whose host cost is measured: the largest batch, one token


def tail_fp8_shapes(quick: bool = False) -> list[DecodeShape]:
    """Rings of kpool rows at every batch and next_n (``--quick``: batch 64 and 512 at next_n 1 and 4)."""
    if quick:
        return [DecodeShape(r, n) for r in (64, 512) for n in (1, 4)]
    return [DecodeShape(r, n) for r in BATCHES for n in STEPS]


def tail_fp8_bytes(shape: DecodeShape) -> int:
    """The least the fused step moves: ``tail_update_bytes`` with each closed pool's FP8 row (head_dim bytes and a
    float32 scale) written in place of its pooled row."""
    row = shape.head_dim * element_dtype(shape.dtype).itemsize
    return tail_update_bytes(shape) + shape.requests * shape.pools * (fp8_row_bytes(shape.head_dim) - row)


def tail_unfused_bytes(shape: DecodeShape) -> int:
    """The least the unfused sequence moves: the plain step (its bf16 pooled rows written), those rows read back,
    and the FP8 rows written."""
    closed = shape.requests * shape.pools
    row = shape.head_dim * element_dtype(shape.dtype).itemsize
    return tail_update_bytes(shape) + closed * row + closed * fp8_row_bytes(shape.head_dim)


def _step_sets(shape: DecodeShape, count: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``count`` input sets of one step (views of one array per operand), and the fused and unfused outputs."""
    import cupy

    dtype = element_dtype(shape.dtype)
    requests, next_n, kpool, head_dim, ring, pools = (
        shape.requests, shape.next_n, shape.kpool, shape.head_dim, shape.ring, shape.pools,
    )  # fmt: skip
    rng = cupy.random.default_rng(4)
    positions = step_positions(cupy, rng, count, shape)
    tail = rng.standard_normal((count, requests, 2, ring, head_dim), dtype=cupy.float32).astype(dtype)
    k = rng.standard_normal((count, requests, next_n, head_dim), dtype=cupy.float32).astype(dtype)
    gate = rng.standard_normal((count, requests, next_n, head_dim), dtype=cupy.float32).astype(dtype)
    ape = rng.standard_normal((kpool, head_dim), dtype=cupy.float32)  # shared by every call, like the weights
    slots = cupy.arange(requests, dtype=cupy.int32)
    sets = [
        {"tail": tail[i], "k": k[i], "gate": gate[i], "ape": ape, "positions": positions[i], "slot_idx": slots}
        for i in range(count)
    ]
    return sets, fused_and_unfused_outputs(count, (requests, pools), head_dim, dtype)


def fused_and_unfused_outputs(count: int, rows: tuple[int, ...], head_dim: int, dtype: Any) -> dict[str, Any]:
    """What ``bench_fused_and_unfused`` writes, for each of ``count`` input sets: ``rows`` FP8 rows and scales of
    the fused op and of the unfused sequence, their closed ids, and the plain op's pooled rows in ``dtype``."""
    import cupy

    return {
        "values": cupy.empty((count, *rows, head_dim), dtype=cupy.uint8),
        "scales": cupy.empty((count, *rows), dtype=cupy.float32),
        "closed": cupy.empty((count, *rows), dtype=cupy.int32),
        "pooled": cupy.empty((count, *rows, head_dim), dtype=dtype),
        "unfused_values": cupy.empty((count, *rows, head_dim), dtype=cupy.uint8),
        "unfused_scales": cupy.empty((count, *rows), dtype=cupy.float32),
    }


def bench_tail_update_fp8(shape: DecodeShape, samples: int) -> dict[str, Any]:
    """The fused op against the unfused sequence on the same input sets, writing FP8 rows; set 0's bytes of
    each are compared first."""
    import kpool_cupy

    requests, pools, head_dim = shape.requests, shape.pools, shape.head_dim
    itemsize = element_dtype(shape.dtype).itemsize
    row = head_dim * itemsize
    allocated = requests * (
        2 * shape.ring * row + 2 * shape.next_n * row + pools * row + 2 * pools * fp8_row_bytes(head_dim)
    ) + requests * (4 * shape.next_n + 8 * pools)
    fields = {
        "requests": requests,
        "next_n": shape.next_n,
        "head_dim": head_dim,
        "kpool": shape.kpool,
        "dtype": shape.dtype,
    }
    # The ring rows a step stashes are the same tokens either way, so set 0's ring is the same for both.
    return bench_fused_and_unfused(
        f"tail-update-fp8 {shape.name}",
        fields,
        (kpool_cupy.kpool_tail_update_fp8, kpool_cupy.kpool_tail_update),
        lambda count: _step_sets(shape, count),
        (tail_fp8_bytes(shape), tail_unfused_bytes(shape), allocated),
        samples,
    )


def bench_fused_and_unfused(
    name: str,
    fields: dict[str, Any],
    ops: tuple[Callable[..., Any], Callable[..., Any]],
    make_sets: Callable[[int], tuple[list[dict[str, Any]], dict[str, Any]]],
    sizes: tuple[int, int, int],
    samples: int,
) -> dict[str, Any]:
    """The record of an FP8 ring form (``ops``: it and its plain form) against its unfused sequence: ``sizes``
    are the bytes credited to both, the bytes the unfused sequence moves, and the bytes a set allocates (which
    decide how many sets rotate); ``make_sets(count)`` makes the sets and ``fused_and_unfused_outputs``'s
    outputs. ``fields`` (the shape) follow the name."""
    nbytes, unfused_bytes, allocated = sizes
    rotated = device_rotation(nbytes, allocated)
    count = rotated["sets"]
    sets, out = make_sets(count)
    copy, implementations = _time_fused_and_unfused(*ops, sets, out, nbytes, samples)
    return {
        "name": name,
        **fields,
        "bytes": nbytes,
        "bytes_unfused": unfused_bytes,
        "input_sets": count,
        "rotation": rotated,
        "copy": copy,
        "implementations": implementations,
    }


def _time_fused_and_unfused(
    fused_op: Callable[..., Any],
    plain_op: Callable[..., Any],
    sets: list[dict[str, Any]],
    out: dict[str, Any],
    nbytes: int,
    samples: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """An FP8 ring form against its unfused sequence on the input sets ``sets``, and the copy of ``nbytes``:
    ``fused_op`` into ``out``'s FP8 rows, scales and closed ids; ``plain_op`` (its plain form) into bf16 rows
    (``out["pooled"]``), then ``hadamard_quant_fp8`` of those rows into ``out``'s unfused FP8 rows. The unfused
    rows and scales of set 0 are compared byte for byte with the fused ones first."""
    import cupy

    import kpool_cupy

    def fused(i: int) -> Any:
        fused_op(**sets[i], out=out["values"][i], out_scale=out["scales"][i], closed=out["closed"][i], validate=False)
        return out["values"][i]

    def unfused(i: int) -> Any:
        pooled = out["pooled"][i]
        plain_op(**sets[i], out=pooled, closed=out["closed"][i], validate=False)
        head_dim = pooled.shape[-1]
        kpool_cupy.hadamard_quant_fp8(
            pooled.reshape(-1, head_dim),
            out=out["unfused_values"][i].reshape(-1, head_dim),
            out_scale=out["unfused_scales"][i].reshape(-1),
            validate=False,
        )
        return out["unfused_values"][i]

    count = len(sets)
    fused(0)
    unfused(0)
    differing = sum(
        int(
            np.count_nonzero(
                cupy.asnumpy(out[f"unfused_{name}"][0]).view(np.uint8) != cupy.asnumpy(out[name][0]).view(np.uint8)
            )
        )
        for name in ("values", "scales")
    )
    copy = copy_roof(nbytes, count, samples)
    implementations = {
        "kpool-cupy": timed_entry(fused, count, samples, nbytes, copy["gbps"]),
        "unfused": timed_entry(unfused, count, samples, nbytes, copy["gbps"], composite_refusal(count)),
    }
    implementations["unfused"]["same_bytes_as_kpool_cupy"] = differing == 0
    implementations["unfused"]["differing_bytes_vs_kpool_cupy"] = differing
    ratios_to(implementations)
    return copy, implementations


def run_tail_fp8(quick: bool, samples: int) -> Iterator[dict[str, Any]]:
    """The FP8 decode-step records, one at a time (the caller saves each)."""
    for shape in tail_fp8_shapes(quick):
        yield bench_tail_update_fp8(shape, samples)


def tail_fp8_host_cost(repeats: int = HOST_REPEATS, shape: DecodeShape = HOST_SHAPE) -> dict[str, Any]:
    """Host time per call of the hot ``kpool_tail_update_fp8`` (``validate=False``, every output given: served
    by its launch plan), against the bare CuPy launch of the plan's kernel and arguments."""
    import cupy

    import kpool_cupy

    from ..ops import TAIL_UPDATE_FP8 as SPEC

    sets, out = _step_sets(shape, 1)
    operands = {**sets[0], "out": out["values"][0], "out_scale": out["scales"][0], "closed": out["closed"][0]}

    def hot() -> Any:
        return kpool_cupy.kpool_tail_update_fp8(**operands, validate=False)

    hot()  # the signature's first call runs the full path and makes the plan
    want = cupy.asnumpy(operands["out"])
    record: dict[str, Any] = {
        "shape": f"tail-update-fp8 {shape.name}",
        "call_us": host_call_microseconds(hot, repeats=repeats),
    }
    bare = plan_launch(SPEC, operands, {"validate": False})
    if isinstance(bare, str):
        record["bare_launch"] = bare
        return record
    operands["out"].fill(0)
    bare()
    record["bare_launch_matches"] = bool(np.array_equal(cupy.asnumpy(operands["out"]), want))
    record["bare_launch_us"] = host_call_microseconds(bare, repeats=repeats)
    record["overhead_over_bare_us"] = record["call_us"] - record["bare_launch_us"]
    return record
