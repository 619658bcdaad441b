"""The FP8 epilogue in NumPy: Walsh-Hadamard rotation, a power-of-two scale, e4m3fn bytes.

Per row of ``head_dim`` D channels::

    x = bf16(pooled)                                  # hadamard_quant: x's own dtype, exactly
    y = bf16( B(x) * fl32(1/sqrt(D)) )                # B: butterflies (a+b, a-b) at strides 1, 2, ..., D/2
    v = fl32( fmax(fmax_c |y_c|, fl32(1e-4)) * fl32(1/448) )
    s = ue8m0_scale(v)                                # round_scale=True; s = v when False
    q = e4m3fn( clamp( fl32(y / s), -448, 448 ) )     # IEEE division, round to nearest even

Every operation is one float32 rounding, in that order; the butterflies
are not normalized, the one multiply by ``fl32(1/sqrt(D))`` is. Not to be
misread: the scale comes from ``y`` after its bf16 rounding, and ``s`` is
the smallest power of two >= v taken from v's bits, not ``exp2(ceil(log2
v))``, which a float32 log2 rounds down just above a power of two.

Subnormals follow the package's flush-to-zero policy (README, "Subnormals
follow the GPU"): float32 subnormal inputs and results of arithmetic are
zero of the same sign. float16's own subnormals are normal float32 values
and are kept.

NaN: the row maximum skips NaN like fmaxf, so a NaN row (one NaN input
spreads to every y of its row) gets the floor's scale and NaN bytes (0x7f).
NumPy and ml_dtypes only, so backends and tests can use it without an op.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

E4M3_MAX = np.float32(448)
AMAX_FLOOR = np.float32(1e-4)
INV_E4M3_MAX = np.float32(1 / 448)  # fl32(1/448): the multiply of v, not a division by 448
E4M3_NAN = 0x7F
_SMALLEST_NORMAL_BITS = 0x00800000  # 2^-126
_TINY = np.finfo(np.float32).tiny


def _flush(values: np.ndarray) -> np.ndarray:
    """Float32 subnormals to zero of the same sign, as the device's -ftz=true does."""
    return np.where(np.abs(values) < _TINY, np.copysign(np.float32(0), values), values)


def _check_rows(x: np.ndarray) -> int:
    """D of a ``[rows, D]`` array; D must be a power of two for any rotation."""
    if x.ndim != 2:
        raise ValueError(f"Invalid x: expected a [rows, head_dim] array, got shape {x.shape}")
    head_dim = x.shape[1]
    if head_dim < 1 or head_dim & (head_dim - 1):
        raise ValueError(f"Invalid head_dim: expected a power of two for the Hadamard rotation, got {head_dim}")
    return head_dim


def inverse_sqrt(head_dim: int) -> np.float32:
    """The float32 nearest 1/sqrt(D) for D a power of two.

    D = 4^k gives 2^-k exactly; D = 2 * 4^k gives 2^-k * sqrt(1/2), whose
    float32 rounding (0x3f3504f3) is also what rounding the float64 value
    gives: sqrt(1/2) is far from a float32 midpoint.
    """
    return np.float32(1 / np.sqrt(np.float64(head_dim)))


def hadamard(x: np.ndarray) -> np.ndarray:
    """The unnormalized Walsh-Hadamard transform of each row, ``[rows, D]`` float32.

        for h in 1, 2, 4, ..., D/2:   (x[i], x[i+h]) = (x[i] + x[i+h], x[i] - x[i+h])   for i with bit h clear

    Each add rounds to float32 and is flushed (the inputs too), stride 1
    first. The order matters for rounding only: in exact arithmetic every
    order gives Sylvester's matrix, so ``hadamard(hadamard(x)) == D * x``.
    """
    if x.dtype != np.float32:
        raise TypeError(f"Invalid x: expected float32, got {x.dtype}")
    head_dim = _check_rows(x)
    rows = x.shape[0]
    y = _flush(x)
    h = 1
    while h < head_dim:
        # [rows, blocks, 2, h]: index 0 holds x[i], index 1 holds x[i + h].
        pairs = y.reshape(rows, head_dim // (2 * h), 2, h)
        a, b = pairs[:, :, 0], pairs[:, :, 1]
        y = _flush(np.stack((a + b, a - b), axis=2)).reshape(rows, head_dim)
        h *= 2
    return y


def rotate(x: np.ndarray, out_dtype) -> np.ndarray:
    """``round_to(out_dtype)(hadamard(x) * fl32(1/sqrt(D)))``: the normalized rotation, one float32 multiply.

    ``x`` is float32 ``[rows, D]``; the result has ``out_dtype`` (bfloat16
    in the epilogue). Orthonormal up to those roundings, so rotating twice
    gives ``x`` back to the output dtype's rounding.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        product = _flush(hadamard(x) * inverse_sqrt(x.shape[1]))
    return product.astype(out_dtype)


def ue8m0_scale(v: np.ndarray) -> np.ndarray:
    """The smallest power of two >= v, from v's float32 bits (no log2, no exp2).

    A v with mantissa bits is raised to the next exponent (bits of the
    exponent + 1, mantissa cleared); a power of two is returned as it is.

    Edges, none of which the epilogue reaches for finite y (its v lies in
    [fl32(1e-4) * fl32(1/448), FLT_MAX / 448], about [2^-22.1, 2^119.2]):

    - zero and subnormal v give 2^-126. Under the flush-to-zero policy a
      subnormal v reads as zero, and the scale must be a normal float32: a
      subnormal power of two would itself flush to zero and y / s would be
      infinite. 2^-126 is the smallest power of two that survives.
    - v above 2^127 gives +inf (2^128 is past float32's range; the exponent
      bits carry into 0xff with a clear mantissa); +inf gives +inf. Only an
      infinite y makes v that large, and y / inf is then 0 or NaN.
    - NaN gives NaN. Negative v is not a scale: ValueError.
    """
    v = np.asarray(v)
    if v.dtype != np.float32:
        raise TypeError(f"Invalid v: expected float32, got {v.dtype}")
    if np.any(v < 0):
        raise ValueError(f"Invalid v: expected values >= 0, got a minimum of {v.min()}")
    bits = v.view(np.uint32).astype(np.int64) & 0x7FFFFFFF  # -0.0 is zero
    exponent, mantissa = bits >> 23, bits & 0x7FFFFF
    scale = np.where(mantissa == 0, exponent, exponent + 1) << 23
    scale = np.where(exponent == 0, _SMALLEST_NORMAL_BITS, scale)  # zero and subnormals
    scale = np.where(exponent == 0xFF, bits, scale)  # inf stays, NaN stays
    return scale.astype(np.uint32).view(np.float32)


def quantize_e4m3fn(y_over_s: np.ndarray) -> np.ndarray:
    """float32 to e4m3fn bit patterns (uint8): clamp to [-448, 448], round to nearest even.

    e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; normals from
    2^-6 to 448 (0x7e), subnormals m * 2^-9 for m = 1..7, no infinity, NaN
    0x7f/0xff. Written with integer operations on the float32 bits:

    - |x| >= 2^-6: keep the top 3 mantissa bits, rounding the 20 below to
      nearest even (a carry moves into the exponent, as it should); rebias.
    - |x| < 2^-6: the significand (implicit bit included) in units of 2^-9,
      rounded to nearest even; m = 8 is 2^-6's pattern, which is correct.
      float32 subnormals are below 2^-10 and give zero whether flushed or not.

    The sign is kept, so -0.0 and negatives that round to zero give 0x80.
    ±inf clamps to ±448. NaN gives 0x7f whatever its sign bit: arithmetic's
    NaN sign differs between hosts (x86's default NaN is negative, the GPU's
    canonical NaN positive), and the bytes should not.
    """
    x = np.asarray(y_over_s)
    if x.dtype != np.float32:
        raise TypeError(f"Invalid y_over_s: expected float32, got {x.dtype}")
    nan = np.isnan(x)
    clamped = np.clip(np.where(nan, np.float32(0), x), -E4M3_MAX, E4M3_MAX)
    bits = clamped.view(np.uint32).astype(np.int64)
    sign = (bits >> 24) & 0x80
    magnitude = bits & 0x7FFFFFFF
    exponent = magnitude >> 23  # float32's biased exponent

    # Normal e4m3: round away the low 20 mantissa bits, ties to the even kept bit.
    kept = (magnitude + 0x7FFFF + ((magnitude >> 20) & 1)) >> 20
    normal = kept - ((127 - 7) << 3)

    # Subnormal e4m3: |x| = significand * 2^(exponent - 150), in units of 2^-9.
    significand = np.where(exponent == 0, magnitude, (magnitude & 0x7FFFFF) | 0x800000)
    # 141 = 150 - 9. Below 2^-6 the shift is >= 21; at 40 everything rounds to 0.
    # (Normal values take the other branch; their shift is only kept >= 1.)
    shift = np.clip(141 - exponent, 1, 40)
    half = np.int64(1) << (shift - 1)
    odd = (significand >> shift) & 1
    subnormal = (significand + half - 1 + odd) >> shift

    code = np.where(exponent >= 127 - 6, normal, subnormal) | sign
    return np.where(nan, E4M3_NAN, code).astype(np.uint8)


def scale_and_quantize(y: np.ndarray, round_scale: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(q, s)`` of rotated rows ``y`` (float32 holding bf16 values): the epilogue after the rotation."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        # fmax skips NaN like fmaxf; starting from 0 changes nothing above the floor.
        amax = np.fmax.reduce(np.abs(y), axis=1, initial=np.float32(0))
        v = np.fmax(amax, AMAX_FLOOR) * INV_E4M3_MAX  # >= 2^-23: never subnormal
        s = ue8m0_scale(v) if round_scale else v
        q = quantize_e4m3fn(_flush(y / s[:, None]))
    return q, s


def epilogue(pooled: np.ndarray, round_scale: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The key side: pooled float32 ``[rows, D]`` to e4m3fn bytes uint8 ``[rows, D]`` and scales float32 ``[rows]``.

        x = bf16(pooled);  y = bf16(hadamard(x) * fl32(1/sqrt(D)));  q, s as in the module's docstring

    x is bf16 whatever k's dtype was: the cache stores what a bf16 key would.
    """
    if pooled.dtype != np.float32:
        raise TypeError(f"Invalid pooled: expected float32, got {pooled.dtype}")
    _check_rows(pooled)
    x = pooled.astype(ml_dtypes.bfloat16).astype(np.float32)
    y = rotate(x, ml_dtypes.bfloat16).astype(np.float32)
    return scale_and_quantize(y, round_scale)


QUERY_DTYPES = (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32))


def hadamard_quant(x: np.ndarray, round_scale: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The query side: ``x`` ``[rows, D]`` bf16, fp16 or fp32 to e4m3fn bytes and scales, as ``epilogue``.

    x is converted to float32 exactly (every bf16 and fp16 value is a
    float32); unlike the key side it is not rounded to bf16 first, so a
    float32 query keeps its bits into the butterflies.
    """
    if x.dtype not in QUERY_DTYPES:
        raise TypeError(f"Invalid x: expected bfloat16, float16 or float32, got {x.dtype}")
    _check_rows(x)
    y = rotate(x.astype(np.float32), ml_dtypes.bfloat16).astype(np.float32)
    return scale_and_quantize(y, round_scale)
