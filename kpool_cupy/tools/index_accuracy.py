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

That holds while every scaled dot and every partial sum stays inside
float32's range (below 2^128 in magnitude): past it the kernel gives +-inf
where the float64 answer is finite, and ``index_logits_agree`` says so. A
scale below 2^-126 is a float32 subnormal, which the GPU build and the
emulator read as zero (denormals-are-zero): the pool's logit loses at most
2^-126 sum_h |w_h| sum_d |q_hd k_d|, added as a third term where the cache
holds such a scale.

On a GPU the tensor cores add a step's products in their own order: each
product aligned to the step's largest exponent and truncated, which costs
up to about one float32 unit in the last place a product and a step, so the
GPU bound replaces the D-sum's 2^-24 by 2^-(bits - 1), ``accumulation_bits``
from ``gpu_accumulation_bits``:

- 23 where the instruction is an f16 ``HMMA`` with float32 accumulation: the
  sm_80 path (e4m3 converted exactly to f16), sm_90's (``MMA_E4M3_HMMA``:
  the same on conversions by the hardware), and the e4m3 path had it run on
  sm_90, where ptxas lowers ``mma.sync`` e4m3 to two f16 ``HMMA.16816`` (the
  SASS tests pin it). The H200 run of that lowering met even the CPU bound
  (worst 0.057 of it, docs/gpu-runs/2026-12-04-h200/index-check.log).
- 13 where the tensor cores take e4m3 natively (sm_89, sm_100 and newer,
  and the sm_90a build's wgmma, ``QGMMA`` in the SASS): they accumulate FP8
  products narrower than float32. NVIDIA documents no width; the public
  figure is about 14 bits on Hopper's FP8 wgmma (DeepSeek-V3 technical
  report, section 3.3.2, measured on an H800), and 13 is one bit of margin
  under it. No GPU of these has run it yet.

A bound is only as useful as what it can catch: with a lane of the mma's
fragments misplaced (the emulator's ``-DKP_MMA_MISPLACED_LANE``), scores
leave the 24- and 23-bit bounds by 500 times and more at 4 to 128 heads,
but the 13-bit bound only at few heads (4 to 11 times at 4 heads, 1.4 to 5
at 16, inside it from about 32 heads on: a sum over many heads hides one
wrong product), so a GPU check at 13 bits includes a 4-head case.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ops.families.scoring import CACHE_LAYOUT

FP8_MMA_ACCUMULATION_BITS = 13  # assumed for native FP8 tensor cores, wgmma included; see the module docstring
HMMA_ACCUMULATION_BITS = 23  # f16 tensor cores with float32 accumulation: truncation, a unit a product a step
# Whether an mma step's products sum in f16 HMMAs rather than FP8 tensor cores, by compute capability (major *
# 10 + minor) for the e4m3 path: sm_90 lowers it to HMMA.16816.
E4M3_AS_HMMA = frozenset({90})


def gpu_accumulation_bits(compute_capability: int, mma: int) -> int:
    """``accumulation_bits`` for a GPU of ``compute_capability`` (90 for sm_90) running the scorer's ``mma``
    path (``kernel.declarations.MMA_E4M3``, ``MMA_E4M3_HMMA``, ``MMA_F16`` or ``MMA_WGMMA``)."""
    from ..kernel.declarations import MMA_E4M3_HMMA, MMA_F16, MMA_WGMMA

    if mma == MMA_WGMMA:  # sm_90a: QGMMA, Hopper's native FP8 tensor cores (sm_90's e4m3 mma.sync is HMMA)
        return FP8_MMA_ACCUMULATION_BITS
    if mma in (MMA_F16, MMA_E4M3_HMMA) or compute_capability in E4M3_AS_HMMA:
        return HMMA_ACCUMULATION_BITS
    return FP8_MMA_ACCUMULATION_BITS


def _magnitudes(q: np.ndarray, cache: np.ndarray, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """q and the cache with every e4m3 value's sign bit cleared and every scale made |scale|."""
    q_abs = q & np.uint8(0x7F)
    cache_abs = np.array(cache, copy=True)
    pages, block_size = cache.shape[0], cache.shape[1]
    flat = cache_abs.reshape(pages, -1)
    split = CACHE_LAYOUT.scale_offset(block_size, head_dim, 0)  # a page's values, then its scales
    flat[:, :split] &= np.uint8(0x7F)
    scales = flat[:, split:].copy().view(np.float32)
    flat[:, split:] = np.abs(scales).view(np.uint8)
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

    ``accumulation_bits`` 24: the CPU backends and the emulated kernel; a GPU: ``gpu_accumulation_bits`` (an
    assumption only a GPU run checks).
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
    flushed += _subnormal_scales(q_abs, np.abs(weights).astype(np.float32), cache_abs, head_dim, seen, call, table,
                                 offsets, lengths)  # fmt: skip
    return np.where(seen, rounding + flushed, 0.0)


def _subnormal_scales(q_abs, weights_abs, cache_abs, head_dim, seen, call, table, offsets, lengths) -> np.ndarray:
    """2^-126 sum_h |w_h| sum_d |q_hd k_d| for the pools whose scale is a float32 subnormal (read as zero), 0
    elsewhere: the magnitudes scored again with such scales set to 2^-126 and every other to 0."""
    from .. import reference

    pages, block_size = cache_abs.shape[0], cache_abs.shape[1]
    flat = cache_abs.reshape(pages, -1)
    split = CACHE_LAYOUT.scale_offset(block_size, head_dim, 0)
    scales = flat[:, split:].copy().view(np.float32)
    subnormal = (scales > 0) & (scales < np.float32(2.0**-126))
    if not subnormal.any():
        return np.zeros(seen.shape)
    marked = np.array(cache_abs, copy=True)
    marked_scales = np.where(subnormal, np.float32(2.0**-126), np.float32(0))
    marked.reshape(pages, -1)[:, split:] = marked_scales.view(np.uint8)
    lost = reference.kpool_index_logits_fp8(q_abs, weights_abs, marked, table, offsets, lengths, **call)
    return np.where(seen & np.isfinite(lost), lost.astype(np.float64), 0.0) * (1 + 2.0**-20)


def index_logits_agree(got: np.ndarray, want: np.ndarray, bound: np.ndarray) -> dict[str, Any]:
    """Whether ``got`` meets the float64 ``want`` within ``bound``: -inf where it is -inf, +inf where +inf, NaN
    where NaN, and the worst error over its bound with where it is."""
    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    inf_differs = np.isneginf(got64) != np.isneginf(want64)
    inf_differs |= np.isposinf(got64) != np.isposinf(want64)  # float32 overflow where want is finite
    nan_differs = np.isnan(got64) != np.isnan(want64)
    same_inf, same_nan = not inf_differs.any(), not nan_differs.any()
    finite = np.isfinite(want64) & np.isfinite(got64)
    error = np.abs(np.where(finite, got64, 0.0) - np.where(finite, want64, 0.0))
    ratio = np.where(finite, error / np.maximum(bound, np.finfo(np.float64).tiny), 0.0)
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape) if ratio.size else ()
    return {
        "ok": bool(same_inf and same_nan and (ratio <= 1).all()),
        "same_inf": same_inf,
        "same_nan": same_nan,
        "worst_error_over_bound": float(ratio.max(initial=0.0)),
        "worst_at": tuple(int(i) for i in worst),
        "max_abs_err": float(error.max(initial=0.0)),
        "max_allowed_abs": float(bound.max(initial=0.0)),
        "special_mismatches": int((inf_differs | nan_differs).sum()),
    }
