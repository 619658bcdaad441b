"""How far a pooled value may sit from the float64 answer, and how far it does."""

from __future__ import annotations

import numpy as np

from ..dtypes import BFLOAT16, FLOAT16, FLOAT32

# (stored mantissa bits, smallest normal exponent) of each output dtype.
_FORMATS = {BFLOAT16: (7, -126), FLOAT16: (10, -14), FLOAT32: (23, -126)}


def ulp(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Spacing of ``dtype`` at each float64 value (subnormal spacing near zero)."""
    mantissa_bits, min_exponent = _FORMATS[np.dtype(dtype)]
    with np.errstate(divide="ignore"):
        exponent = np.floor(np.log2(np.abs(values)))
    exponent = np.where(np.isfinite(exponent), np.maximum(exponent, min_exponent), min_exponent)
    return np.exp2(exponent - mantissa_bits)


def allowed_error(
    want: np.ndarray, dtype: np.dtype, kpool: int, max_abs_key: float, max_abs_logit: float = 0.0
) -> np.ndarray:
    """Per-element bound on |got - want| for a kernel result against the float64 answer, on any backend.

    With K the largest |key| and L the largest |logit| (gate + ape) of the
    pool, one ulp of the output dtype plus K * 2^-23 * (2 kpool + L + 8) plus
    (2 kpool + 1) * 2^-126:

    - rounding once to the output dtype is half an ulp, and the float32 error
      before it can tip a value across a rounding midpoint: one ulp;
    - a relative error d in a member's weight moves the weighted mean by at
      most 2 d K. A weight errs by its logit's rounding (L 2^-24), the
      difference and the log2(e) scaling (each at most 2^-24 of a weight that
      is e^-|difference|), and exp2 (2 ulp = 2^-22 on the GPU's ex2.approx,
      half an ulp on the CPU): d <= (L + 6) 2^-24, so (L + 6) 2^-23 K;
    - the sums of weights and of weighted keys round once per member, each
      at most 2^-24 of the total: kpool 2^-23 K; a streamed pool's rescale
      between chunks errs like one more exp2 per chunk: at most kpool 2^-23 K;
    - the reciprocal (1 ulp on the GPU's rcp.approx) and the multiply by it:
      2^-22 K;
    - flush-to-zero (the README's "Subnormals"), each loss below 2^-126 and
      none scaled up (the reciprocal of the weights' sum is at most 1): a
      member's key read as zero or its step of the weighted sum flushed, one
      per member; a chunk's rescaled sums, at most one per member; the
      result written as zero: (2 kpool + 1) 2^-126. A weight or a rescale
      factor that flushes (a logit difference past about 87) loses a term of
      at most K 2^-126 (kpool K 2^-126 for a rescale), a relative error far
      inside the arithmetic term above, which holds it.
    """
    arithmetic = (2 * kpool + max_abs_logit + 8) * 2.0**-23 * max_abs_key
    flushed = (2 * kpool + 1) * 2.0**-126
    return ulp(want, dtype) + arithmetic + flushed


def compare(
    got: np.ndarray, want: np.ndarray, dtype: np.dtype, kpool: int, max_abs_key: float, max_abs_logit: float = 0.0
) -> dict[str, float]:
    """Max abs error, max error in output ulps, the largest bound, the worst error over its bound, how many
    elements' NaN or infinity the other side does not match, and the verdict.

    NaN must meet NaN and infinity the same infinity; the errors are measured where both are finite.
    """
    got64 = np.asarray(got).astype(np.float64)
    want64 = np.asarray(want).astype(np.float64)
    if got64.size == 0:
        return {
            "max_abs_err": 0.0,
            "max_ulp_err": 0.0,
            "max_allowed_abs": 0.0,
            "worst_error_over_bound": 0.0,
            "special_mismatches": 0,
            "ok": True,
        }
    special = ~np.isfinite(want64) | ~np.isfinite(got64)
    same_special = np.where(np.isnan(want64), np.isnan(got64), got64 == want64)
    finite = ~special
    with np.errstate(invalid="ignore"):  # inf - inf where both are infinite: left out below
        error = np.where(finite, np.abs(got64 - want64), 0.0)
    bound = allowed_error(want64, dtype, kpool, max_abs_key, max_abs_logit)
    special_mismatches = int((special & ~same_special).sum())
    ok = bool(np.all(error <= bound) and special_mismatches == 0)
    return {
        "max_abs_err": float(error.max()),
        "max_ulp_err": float((error / ulp(want64, dtype)).max()),
        "max_allowed_abs": float(bound.max()),
        "worst_error_over_bound": float((error / bound).max()),
        "special_mismatches": special_mismatches,  # NaN or infinity where the answer is not the same
        "ok": ok,
    }
