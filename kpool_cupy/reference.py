"""The NumPy reference of kpool_compress, vectorized over pools and channels.

    logits[m, c] = gate[member m, c] + ape[m, c]
    w[:, c]      = softmax over m of logits[:, c]
    pooled[p, c] = sum_m w[m, c] * k[member m, c]

The softmax is per channel, not per member. The arithmetic is float32 like
the kernel's (or float64 with ``accumulate="float64"``), rounded once to the
output dtype; the order of the sums differs from the kernel's streaming
softmax, so the two agree to rounding, not bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import HostArrays
from ._driver import run_compress
from ._reference_ring import kpool_expand_topk, kpool_ring_close, kpool_seed_tail, kpool_tail_update
from ._validate import CompressCall, check_host_arrays

_ACCUMULATE = {"float32": np.float32, "float64": np.float64}

__all__ = [
    "kpool_compress",
    "kpool_expand_topk",
    "kpool_ring_close",
    "kpool_seed_tail",
    "kpool_tail_update",
    "member_rows",
    "pool_members",
]


def member_rows(call: CompressCall, slots: int, input_row_offsets: Any, cache_lengths: Any, pool_row_offsets: Any):
    """First member row of each pool in [0, slots) and whether it may be written.

    The same search and the same checks as ``kp::locate_pool`` in
    kernels/kpool_compress.cu, so garbage offsets with ``validate=False`` index
    nothing outside ``k`` here either.
    """
    pool = np.arange(slots, dtype=np.int64)
    pools = np.asarray(pool_row_offsets).astype(np.int64)
    offsets = np.asarray(input_row_offsets).astype(np.int64)
    cached = np.asarray(cache_lengths).astype(np.int64)
    if call.batch == 0:
        return pool, np.zeros(slots, dtype=bool)
    # The largest b with pools[b] <= pool; on sorted offsets this is the binary search's answer.
    request = np.clip(np.searchsorted(pools[: call.batch], pool, side="right") - 1, 0, call.batch - 1)
    begin, end = pools[request], pools[request + 1]
    row_begin, row_end = offsets[request], offsets[request + 1]
    ok = (begin >= 0) & (pool >= begin) & (pool < end) & (pool < pools[call.batch])
    ok &= (row_begin >= 0) & (row_end <= call.total_tokens) & (row_begin <= row_end) & (cached[request] >= 0)
    local = np.where(ok, pool - begin, 0)
    ok &= local <= (row_end - row_begin) // call.kpool
    phase = np.where(ok, cached[request], 0) % call.kpool
    first = row_begin + np.where(phase == 0, 0, call.kpool - phase) + np.where(ok, local, 0) * call.kpool
    ok &= first + call.kpool <= row_end
    return np.where(ok, first, 0), ok


def pool_members(keys: np.ndarray, gates: np.ndarray, ape: np.ndarray, accumulate: type[np.floating]) -> np.ndarray:
    """Pooled keys ``[pools, head_dim]`` from members ``[pools, kpool, head_dim]``, unrounded.

    The one pooling function of the reference: compress and the ring
    functions all call it, so the reference agrees with itself bit for bit.
    """
    acc = accumulate
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        logits = gates.astype(acc) + ape.astype(acc)[None]
        peak = logits.max(axis=1, keepdims=True)
        # A logit equal to the maximum weighs exactly 1 (so all -inf gives the
        # members' mean, like the kernel's PoolChannel), the rest exp(l - max).
        weights = np.where(logits == peak, acc(1), np.exp(logits - peak))
        return (weights * keys.astype(acc)).sum(axis=1) / weights.sum(axis=1)


class _ReferenceBackend(HostArrays):
    def __init__(self, accumulate: type[np.floating]) -> None:
        self.accumulate = accumulate

    def pool(self, call: CompressCall, slots: int, arrays: tuple[Any, ...], out: np.ndarray) -> None:
        k, gate, ape, input_row_offsets, cache_lengths, pools = arrays
        slots = min(slots, out.shape[0])
        first, ok = member_rows(call, slots, input_row_offsets, cache_lengths, pools)
        rows = first[ok][:, None] + np.arange(call.kpool)  # [pools, kpool]
        pooled = pool_members(k[rows], gate[rows], ape, self.accumulate)
        with np.errstate(over="ignore"):
            out[np.flatnonzero(ok)] = pooled.astype(out.dtype)


def kpool_compress(
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    pool_row_offsets: np.ndarray | None = None,
    out: np.ndarray | None = None,
    validate: bool = True,
    accumulate: str = "float32",
) -> np.ndarray:
    """Pool each complete k-pool of a ragged batch into one key, in NumPy.

    Same arguments and result as :func:`kpool_cupy.kpool_compress`, on host
    arrays (bfloat16 as ``ml_dtypes.bfloat16``).

    Parameters
    ----------
    accumulate
        ``"float32"`` (the kernel's arithmetic) or ``"float64"``.
    """
    if accumulate not in _ACCUMULATE:
        raise ValueError(f"Invalid accumulate: expected 'float32' or 'float64', got {accumulate!r}")
    check_host_arrays(
        "reference",
        k=k,
        gate=gate,
        ape=ape,
        input_row_offsets=input_row_offsets,
        cache_lengths=cache_lengths,
        pool_row_offsets=pool_row_offsets,
        out=out,
    )
    backend = _ReferenceBackend(_ACCUMULATE[accumulate])
    return run_compress(backend, k, gate, ape, input_row_offsets, cache_lengths, pool_row_offsets, out, validate)
