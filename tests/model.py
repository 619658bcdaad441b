"""An independent float64 model of kpool_compress and the batches the tests feed it.

The model is written the plain way, a loop over requests and pools with no
max-subtraction in the softmax, so a match also says the stabilization in the
kernel and the reference was neutral.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)

# (dtype, atol, rtol) for a result against the float64 model.
# rtol: at least one ulp of the output dtype (ulp / |x| lies in (2^-8, 2^-7]
#   for bf16, so 2^-7 allows one to two ulps depending on where in its binade
#   the value sits; likewise 2^-10 for f16). Rounding once costs half an ulp
#   and the float32 arithmetic before it can tip a midpoint. float32 output
#   gets 2^-22, two to four ulps: its own rounding is the arithmetic's.
# atol: the float32 arithmetic near zero, where an ulp vanishes. The pooled
#   value is a weighted mean, so a relative error d_m in member m's weight
#   moves it by at most max(d_m) * 2 max|k|; a weight errs by the rounding of
#   its logit (|logit| < 20 here: gate 3 N(0,1), ape N(0,1)) scaled through
#   exp, plus exp's and the sum's own: d_m < (20 + 3) * 2^-24. The weighted
#   sums add up to kpool roundings of 2^-24 max|k|. With kpool <= 128 (the
#   largest the suite uses) and |k| < 6: (2 * 23 + 128 + 4) * 2^-24 * 6 < 6.4e-5.
ATOL = 6.4e-5
TOLERANCES = {
    BF16: (ATOL, 2.0**-7),
    F16: (ATOL, 2.0**-10),
    F32: (ATOL, 2.0**-22),
}


def model_pooled(k, gate, ape, input_row_offsets, cache_lengths) -> np.ndarray:
    kpool, head_dim = ape.shape
    rows = []
    for b in range(len(cache_lengths)):
        start, end, cached = int(input_row_offsets[b]), int(input_row_offsets[b + 1]), int(cache_lengths[b])
        for q in range(-(-cached // kpool), (cached + end - start) // kpool):
            members = start + q * kpool - cached + np.arange(kpool)
            weights = np.exp(gate[members].astype(np.float64) + ape.astype(np.float64))
            rows.append((weights * k[members].astype(np.float64)).sum(axis=0) / weights.sum(axis=0))
    return np.array(rows, dtype=np.float64).reshape(-1, head_dim)


def assert_close_to_model(got: np.ndarray, want: np.ndarray, dtype: np.dtype) -> None:
    """Fail naming the first pool and channel outside (atol, rtol), with got and want."""
    atol, rtol = TOLERANCES[np.dtype(dtype)]
    assert got.shape == want.shape, f"shape: got {got.shape}, want {want.shape}"
    got64 = got.astype(np.float64)
    bad = ~(np.abs(got64 - want) <= atol + rtol * np.abs(want))
    if bad.any():
        pool, channel = np.argwhere(bad)[0]
        raise AssertionError(
            f"{int(bad.sum())} values off; first at pool {pool}, channel {channel}: "
            f"got {got64[pool, channel]!r}, want {want[pool, channel]!r} (atol {atol}, rtol {rtol})"
        )


@dataclass
class Batch:
    k: np.ndarray
    gate: np.ndarray
    ape: np.ndarray
    input_row_offsets: np.ndarray
    cache_lengths: np.ndarray

    def args(self) -> tuple[np.ndarray, ...]:
        return (self.k, self.gate, self.ape, self.input_row_offsets, self.cache_lengths)

    def model(self) -> np.ndarray:
        return model_pooled(*self.args())


def make_batch(
    lengths,
    cache,
    *,
    head_dim: int = 128,
    kpool: int = 4,
    dtype=BF16,
    gate_dtype=None,
    index_dtype=np.int32,
    cache_dtype=None,
    seed: int = 0,
    gate_scale: float = 3.0,
) -> Batch:
    """A ragged batch; gate scores spread over several units so a wrong member mapping shows."""
    rng = np.random.default_rng(seed)
    total = int(sum(lengths))
    return Batch(
        k=rng.standard_normal((total, head_dim)).astype(dtype),
        gate=(gate_scale * rng.standard_normal((total, head_dim))).astype(gate_dtype or dtype),
        ape=rng.standard_normal((kpool, head_dim)).astype(np.float32),
        input_row_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(index_dtype),
        cache_lengths=np.asarray(cache).astype(cache_dtype or index_dtype),
    )


def standard_lengths(kpool: int) -> tuple[list[int], list[int]]:
    """Several pools per request, a ragged tail, an empty request and every kind of phase."""
    lengths = [3 * kpool + 1, 0, 2 * kpool + kpool // 2, 5, kpool, 4 * kpool - 1]
    cache = [0, 3, kpool - 1, 1, kpool + 1, 2 * kpool]
    return lengths, cache
