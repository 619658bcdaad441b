"""How far an index logit may sit from the float64 answer (``kpool_index_logits_fp8``).

For a token t and a pool p it sees, with the exact values of the e4m3 bytes,

    M  = sum over h of |w_h| |s| sum over d of |q_hd k_d|      (the terms' magnitudes)
    M1 = sum over h of       |s| sum over d of |q_hd k_d|      (the same without the weights)

a result of the CPU backends and the emulated kernel is within

    (D + H + 8) 2^-24 M  +  2^-126 (H + sum_h |w_h| + M1)

of the exact logit. Why: every product q_hd k_d of two e4m3 values is
exact in float32; the emulated mma adds the D products of a dot to its
float32 accumulator one after another, k order within each 32-wide step
((D - 1) roundings, each at most 2^-24 of the running sum's magnitude); s
times the dot and the weight times its relu round once each; each lane adds
its 2 H / 16 heads in turn and three butterfly steps add the lanes (fewer
than H / 8 + 5 roundings). The second term is flush-to-zero (the GPU build
and the emulator flush float32 subnormals): a weight, a scaled dot or a
weighted term below 2^-126 counts as zero. NaN stays NaN (relu keeps it);
a pool the token cannot see is exactly -inf.

On a GPU the tensor cores add a step's products in their own order, for FP8
inputs narrower than float32 (about 14 significant bits on Hopper by
public measurements; undocumented). The GPU bound replaces the D-sum's 2^-24
by 2^-(bits - 1) with ``accumulation_bits`` (default 13, a margin under those
reports): (D 2^-(bits-1) + (H + 8) 2^-24) M + the same second term. Only a
GPU run checks it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FP8_MMA_ACCUMULATION_BITS = 13  # assumed for a GPU's FP8 tensor cores; see the module docstring


def _magnitudes(q: np.ndarray, cache: np.ndarray, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """q and the cache with every e4m3 value's sign bit cleared and every scale made |scale|."""
    q_abs = q & np.uint8(0x7F)
    cache_abs = np.array(cache, copy=True)
    pages, block_size = cache.shape[0], cache.shape[1]
    flat = cache_abs.reshape(pages, -1)
    flat[:, : block_size * head_dim] &= np.uint8(0x7F)
    scales = flat[:, block_size * head_dim :].copy().view(np.float32)
    flat[:, block_size * head_dim :] = np.abs(scales).view(np.uint8)
    return q_abs, cache_abs


def index_logits_bound(
    q: np.ndarray,
    weights: np.ndarray,
    cache: np.ndarray,
    cache_block_table: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    kpool: int,
    max_pools: int,
    accumulation_bits: int = 24,
) -> np.ndarray:
    """Per-element bound on |got - exact| (float64 ``[num_tokens, max_pools]``; 0 where the logit is -inf).

    ``accumulation_bits`` 24: the CPU backends and the emulated kernel; a GPU:
    ``FP8_MMA_ACCUMULATION_BITS`` (an assumption the GPU run checks).
    """
    from .. import reference

    _, heads, head_dim = q.shape
    q_abs, cache_abs = _magnitudes(np.asarray(q), np.asarray(cache), head_dim)
    call: dict[str, Any] = {"kpool": kpool, "max_pools": max_pools, "validate": False}
    table, offsets, lengths = cache_block_table, input_row_offsets, cache_lengths
    weighted = reference.kpool_index_logits_fp8(
        q_abs, np.abs(weights).astype(np.float32), cache_abs, table, offsets, lengths, **call
    ).astype(np.float64)
    unweighted = reference.kpool_index_logits_fp8(
        q_abs, np.ones_like(weights, dtype=np.float32), cache_abs, table, offsets, lengths, **call
    ).astype(np.float64)
    seen = np.isfinite(weighted) | np.isnan(weighted)
    weighted = np.where(seen, weighted, 0.0) * (1 + 2.0**-20)  # the magnitudes' own float32 rounding
    unweighted = np.where(seen, unweighted, 0.0) * (1 + 2.0**-20)
    d_sum = head_dim * 2.0 ** -(accumulation_bits - 1) if accumulation_bits < 24 else head_dim * 2.0**-24
    rounding = (d_sum + (heads + 8) * 2.0**-24) * weighted
    weight_sum = np.abs(weights).astype(np.float64).sum(axis=1)[:, None]
    flushed = 2.0**-126 * (heads + weight_sum + unweighted)
    return np.where(seen, rounding + flushed, 0.0)


def index_logits_agree(got: np.ndarray, want: np.ndarray, bound: np.ndarray) -> dict[str, Any]:
    """Whether ``got`` meets the float64 ``want`` within ``bound``: -inf where it is -inf, NaN where NaN, and the
    worst error over its bound with where it is."""
    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    same_inf = np.array_equal(np.isneginf(got64), np.isneginf(want64))
    same_nan = np.array_equal(np.isnan(got64), np.isnan(want64))
    finite = np.isfinite(want64) & np.isfinite(got64)
    error = np.abs(np.where(finite, got64, 0.0) - np.where(finite, want64, 0.0))
    ratio = np.where(finite, error / np.maximum(bound, np.finfo(np.float64).tiny), 0.0)
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape) if ratio.size else ()
    return {
        "ok": bool(same_inf and same_nan and (ratio <= 1).all()),
        "same_minus_inf": same_inf,
        "same_nan": same_nan,
        "worst_error_over_bound": float(ratio.max(initial=0.0)),
        "worst_at": tuple(int(i) for i in worst),
        "max_abs_err": float(error.max(initial=0.0)),
        "max_allowed_abs": float(bound.max(initial=0.0)),
    }
