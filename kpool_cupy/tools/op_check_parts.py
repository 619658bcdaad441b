"""What every `kpool-cupy check --op` check is made of: the backend it runs, its verdict, bit-for-bit counts,
the float64 pools and accuracy bounds, the rotation and FP8 epilogue a fused form must equal, index dtypes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from .. import reference
from ..backends.reference_epilogue import epilogue, rotate
from ..ops.families.fp8_target import check_rotation_head_dim
from .cache_places import empty_cache, filled_cache, places
from .cases import Case


@dataclass
class Backend:
    """An op module with its way in and out: NumPy arrays as they are, or copies on the device."""

    ops: Any
    put: Callable[[np.ndarray], Any]
    get: Callable[[Any], np.ndarray]
    on_gpu: bool = False  # the GPU path: the scorer's bound takes the device's accumulation


@dataclass
class Verdict:
    rows: int  # the rows compared: pools, ring rows, selected ids or quantized rows
    mismatches: int  # elements that had to be equal bit for bit and were not
    accuracy: dict[str, float] | None  # accuracy.compare of the pooled values; None where nothing pools

    @property
    def ok(self) -> bool:
        return self.mismatches == 0 and (self.accuracy is None or bool(self.accuracy["ok"]))


def differ(got: np.ndarray, want: np.ndarray) -> int:
    """Elements whose bytes differ; a shape mismatch counts every element."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return max(got.size, want.size, 1)
    if got.size == 0:
        return 0
    width = got.dtype.itemsize
    raw = np.ascontiguousarray(got).view(np.uint8).reshape(-1, width)
    expected = np.ascontiguousarray(want).view(np.uint8).reshape(-1, width)
    return int(np.any(raw != expected, axis=1).sum())


def accuracy_bounds(keys: np.ndarray, gates: np.ndarray, ape: np.ndarray) -> tuple[float, float]:
    """The largest |key| and |gate + ape| bound accuracy.compare takes."""
    max_key = float(np.abs(keys.astype(np.float32)).max(initial=0.0))
    return max_key, float(np.abs(gates.astype(np.float32)).max(initial=0.0)) + float(np.abs(ape).max(initial=0.0))


def token_counts(case: Case) -> tuple[np.ndarray, np.ndarray]:
    offsets = case.input_row_offsets.astype(np.int64)
    return np.diff(offsets), case.cache_lengths.astype(np.int64)


def float64_pools(case: Case, dtype: np.dtype) -> np.ndarray:
    """The case's pools from float64 math, rounded once to ``dtype``."""
    arrays = (case.k, case.gate, case.ape, case.input_row_offsets, case.cache_lengths)
    return reference.kpool_compress(*arrays, out_dtype=dtype, accumulate="float64")


def rotates(head_dim: int) -> bool:
    """Whether ``rotate=True`` takes this head_dim (a power of two from 8 to 256)."""
    try:
        check_rotation_head_dim("head_dim", head_dim)
    except ValueError:
        return False
    return True


def rotation(pooled: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """What ``rotate=True`` writes for float32 pools: the bf16 rotation of their bf16 rounding, in ``dtype``."""
    x = pooled.reshape(-1, pooled.shape[-1]).astype(ml_dtypes.bfloat16).astype(np.float32)
    return rotate(x, ml_dtypes.bfloat16).astype(dtype).reshape(pooled.shape)


def on_host(backend: Backend, result: Any) -> Any:
    """An op's result on the host: an array, a tuple of them, or None."""
    if result is None:
        return None
    return tuple(backend.get(r) for r in result) if isinstance(result, tuple) else backend.get(result)


# An FP8 form run at a round_scale, into the rows or the cache in its keyword arguments:
# what it returned and the ring after it (None for an op without one).
Fused = Callable[..., tuple[Any, "np.ndarray | None"]]


def fp8_mismatches(
    backend: Backend,
    fused: Fused,
    pooled: np.ndarray,
    want_closed: np.ndarray | None,
    pools: list[list[int]],
    rng: np.random.Generator,
    slot_per: str | None,
    ring: np.ndarray | None,
) -> int:
    """The FP8 form into rows, then into a paged cache, against the epilogue of the float32 ``pooled`` rows.

    Rows: the closed ids, bytes and scales of the rows something closed into.
    Cache (``cache_places``): those bytes and scales at each pool's slot,
    nothing else written, the same ids. Both leave ``ring`` as the plain op did.
    """
    round_scale = bool(rng.integers(2))
    done = np.ones(len(pooled), bool) if want_closed is None else want_closed >= 0
    want_values, want_scales = epilogue(pooled[done], round_scale)
    (values, scales, *closed), ring_after = fused(round_scale)
    mismatches = differ(values[done], want_values) + differ(scales[done].reshape(-1), want_scales)
    if want_closed is not None:  # the ids, returned as the last result
        mismatches += differ(closed[0], want_closed) if len(closed) == 1 else max(want_closed.size, 1)
    mismatches += differ(ring_after, ring) if ring is not None else 0
    where = places(pools, rng, slot_per)
    if where is not None:
        cache = backend.put(empty_cache(where, pooled.shape[-1]))
        result, ring_after = fused(round_scale, cache=cache, **{n: backend.put(v) for n, v in where.target.items()})
        mismatches += differ(backend.get(cache), filled_cache(where, want_values, want_scales))
        mismatches += differ(result, want_closed) if want_closed is not None else int(result is not None)
        mismatches += differ(ring_after, ring) if ring is not None else 0
    return mismatches


def index_dtype(end: int, rng: np.random.Generator) -> np.dtype:
    """int32, uint32 or int64 at random, among those that hold values below ``end`` and -1 (uint32: all ones)."""
    fits = [
        np.dtype(t) for t, top in ((np.int32, 2**31 - 1), (np.uint32, 2**32 - 1), (np.int64, 2**63 - 1)) if end <= top
    ]
    return fits[int(rng.integers(len(fits)))]
