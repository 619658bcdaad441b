"""How far kpool_compress_backward's gradients may sit from the float64 answer, and how far they do."""

from __future__ import annotations

import numpy as np

from .accuracy import ulp

# An absolute allowance for values flushed to zero on the way (a subnormal
# weight times a gradient, say): far above float32's smallest normal, far
# below anything a test compares.
FLUSHED = 2.0**-100


def gradient_allowed_error(
    want: dict[str, np.ndarray], dtypes: dict[str, np.dtype], kpool: int, pools: int, grad: float, key: float,
    logit: float,
) -> dict[str, np.ndarray]:  # fmt: skip
    """Per-element bounds on |got - want| of each gradient against the float64 one rounded to its dtype.

    With G the largest |grad_pooled|, K the largest |key|, L the largest
    |logit| and u = 2^-24 (float32's unit roundoff), on any backend:

    - a weight w (at most 1) errs relatively by its logit's rounding and the
      exp2 of the difference (L u + 6 u, as ``accuracy.allowed_error``), the
      weight sum's member-order rounding (2 kpool u, a streamed pool's
      rescales included) and the reciprocal and its product (3 u): at most
      E = (2 kpool + L + 10) u;
    - d k = w g: G (E + 2 u), plus one ulp of its dtype (the float32 error
      can tip a value across a rounding midpoint);
    - d gate = (w g)(k - pooled): (w g)'s error times |k - pooled| <= 2K,
      pooled's own error times w G (``accuracy.allowed_error``'s
      (2 kpool + L + 8) 2u K), the subtraction and the product (3 u of
      2 G K): G K (4 kpool + 2 L + 24) 2u in all, plus one ulp;
    - d ape sums ``pools`` float32 d gate values (each within the d gate
      bound before its rounding) in some fixed order: every partial sum is at
      most pools x 2 G K, so the additions add pools^2 2 G K u; plus one
      float32 ulp.
    """
    u2 = 2.0**-23
    per_pool = grad * key * (4 * kpool + 2 * logit + 24) * u2
    return {
        "grad_k": ulp(want["grad_k"], dtypes["grad_k"]) + grad * ((2 * kpool + logit + 14) * u2 / 2) + FLUSHED,
        "grad_gate": ulp(want["grad_gate"], dtypes["grad_gate"]) + per_pool + FLUSHED,
        "grad_ape": ulp(want["grad_ape"], np.dtype(np.float32)) + pools * (per_pool + pools * grad * key * u2)
        + pools * FLUSHED,
    }  # fmt: skip


def compare_gradients(
    got: dict[str, np.ndarray], want: dict[str, np.ndarray], bounds: dict[str, np.ndarray]
) -> dict[str, float]:
    """Across the three gradients: the largest error, in ulps of its array's dtype, the largest bound, the
    worst error over its bound, how many NaN or infinities the other side does not match, and the verdict; NaN
    must meet NaN and infinity the same infinity."""
    worst, largest, ulps, allowed, ok, specials = 0.0, 0.0, 0.0, 0.0, True, 0
    for name, bound in bounds.items():
        g, w = np.asarray(got[name]).astype(np.float64), np.asarray(want[name]).astype(np.float64)
        if g.shape != w.shape:
            inf = float("inf")
            return {"max_abs_err": inf, "max_ulp_err": inf, "max_allowed_abs": 0.0, "worst_error_over_bound": inf,
                    "special_mismatches": 0, "ok": False}  # fmt: skip
        special = ~np.isfinite(w) | ~np.isfinite(g)
        same_special = np.where(np.isnan(w), np.isnan(g), g == w)
        with np.errstate(invalid="ignore"):  # inf - inf where both are infinite: left out
            error = np.where(special, 0.0, np.abs(g - w))
        specials += int((special & ~same_special).sum())
        ok &= bool(np.all(error <= bound) and np.all(same_special[special]))
        if error.size:
            largest = max(largest, float(error.max()))
            ulps = max(ulps, float((error / ulp(w, np.asarray(want[name]).dtype)).max()))
            allowed = max(allowed, float(bound.max()))
            worst = max(worst, float((error / bound).max()))
    return {"max_abs_err": largest, "max_ulp_err": ulps, "max_allowed_abs": allowed, "worst_error_over_bound": worst,
            "special_mismatches": specials, "ok": ok}  # fmt: skip
