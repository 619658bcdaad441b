"""Numerics at the edges, as documented in the README ("Numerics at the edges"); every backend agrees.

One pool of kpool 4 over head_dim 8, channel c of member m set by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16, F16, F32

from kpool_cupy import emulate, reference
from kpool_cupy.tools.accuracy import allowed_error, compare

BACKENDS = {"emulate": emulate.kpool_compress, "reference": reference.kpool_compress}
KEYS = np.array([1.0, 2.0, 4.0, 8.0], np.float32)  # member m's key in every channel


def pool(backend, gate_column, keys=KEYS, dtype=F32, out=None):
    """Pool one channel pattern: gate[m, :] = gate_column[m], k[m, :] = keys[m]."""
    gate = np.repeat(np.asarray(gate_column, np.float32)[:, None], 8, axis=1).astype(dtype)
    k = np.repeat(np.asarray(keys, np.float32)[:, None], 8, axis=1).astype(dtype)
    result = BACKENDS[backend](
        k, gate, np.zeros((4, 8), np.float32), np.array([0, 4], np.int32), np.array([0], np.int32), out=out
    )
    return result.astype(np.float64)[0]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_nan_gate_makes_the_channel_nan(backend):
    assert np.isnan(pool(backend, [0.0, np.nan, 0.0, 0.0])).all()
    assert np.isnan(pool(backend, [np.nan, 0.0, 0.0, 0.0])).all()  # NaN as the first member too


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_nan_key_makes_the_channel_nan_even_at_zero_weight(backend):
    # 0 * NaN is NaN: a NaN key is never silently dropped.
    assert np.isnan(pool(backend, [0.0, -1e30, 0.0, 0.0], keys=[1.0, np.nan, 4.0, 8.0])).all()


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_huge_finite_gates_pick_the_largest(backend):
    # exp(-2e30) is exactly 0 in float32: the member with the largest gate wins outright.
    np.testing.assert_array_equal(pool(backend, [-1e30, 1e30, -1e30, -1e30]), 2.0)
    np.testing.assert_array_equal(pool(backend, [1e30, 1e30, -1e30, -1e30]), 1.5)  # a tie shares the weight


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_infinite_gates(backend):
    np.testing.assert_array_equal(pool(backend, [0.0, 0.0, np.inf, 0.0]), 4.0)  # +inf takes it all
    np.testing.assert_array_equal(pool(backend, [np.inf, 0.0, np.inf, 0.0]), 2.5)  # two +inf share it
    np.testing.assert_array_equal(pool(backend, [-np.inf, 0.0, 0.0, -np.inf]), 3.0)  # -inf weighs nothing


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_all_minus_infinity_gives_the_members_mean(backend):
    # The limit of equal logits, instead of 0/0.
    np.testing.assert_array_equal(pool(backend, [-np.inf] * 4), KEYS.mean())


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "f32"])
def test_subnormals_flush_to_zero_as_on_the_gpu(backend, dtype):
    # Issue 9, finding 8: CuPy compiles with -ftz=true, so the device reads
    # float32 subnormals as zero and writes zero for a subnormal result. The
    # CPU backends follow (they kept subnormals before, unlike the GPU).
    tiny = 2.0**-130  # subnormal in float32 and in bfloat16 (whose smallest is 2^-133)
    for sign in (1.0, -1.0):
        got = pool(backend, [0.0] * 4, keys=[sign * tiny] * 4, dtype=dtype)
        assert np.all(got == 0) and np.all(np.signbit(got) == (sign < 0))
    # Normal keys whose mean is subnormal: 2^-125 / 4 = 2^-127.
    assert np.all(pool(backend, [0.0] * 4, keys=[2.0**-125, 0, 0, 0], dtype=dtype) == 0)
    assert np.all(pool(backend, [0.0] * 4, keys=[2.0**-124, 0, 0, 0], dtype=dtype) == 2.0**-126)  # the smallest normal


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "f32"])
def test_what_flushes_to_zero_stays_within_the_documented_bound(backend, dtype):
    # A hostile round's finding: the README's bound (tools/accuracy) allowed a subnormal spacing near zero, so
    # a mean of 1e-38 written as zero, as the paragraph on subnormals says it is, failed the package's own
    # check. The bound now carries (2 kpool + 1) 2^-126 for what flush-to-zero drops.
    cases = [
        ([2.0**-130] * 4, 2.0**-130),  # subnormal keys read as zero
        ([2.0**-125, 0, 0, 0], 2.0**-127),  # normal keys, a subnormal mean written as zero
    ]
    for keys, mean in cases:
        got = pool(backend, [0.0] * 4, keys=keys, dtype=dtype)
        verdict = compare(got, np.full(got.shape, mean), dtype, 4, max(keys))
        assert verdict["ok"], (keys, verdict)
    # A step of the sum flushed, the result normal: member 0 weighs e^-1, so its term e^-1 2^-126 is lost, a
    # loss far above the old bound's ~2^-139 at a result near 2^-122.
    gates, keys = [-1.0, 0.0, 0.0, 0.0], [2.0**-126, 2.0**-120, 0.0, 0.0]
    weights = np.exp(np.array(gates))
    exact = (weights * np.array(keys)).sum() / weights.sum()
    got = pool(backend, gates, keys=keys, dtype=F32)
    verdict = compare(got, np.full(got.shape, exact), F32, 4, max(keys), max_abs_logit=1.0)
    assert verdict["ok"], verdict
    # Away from zero the floor vanishes: the bound at 1.0 is the one it always was (16 2^-23 and an ulp).
    assert allowed_error(np.array([1.0]), F32, 4, 1.0)[0] == 17 * 2.0**-23


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_subnormal_key_at_kpool_one_is_zero(backend):
    # kpool 1 is the identity for every normal key; a subnormal one reads as zero.
    module = {"emulate": emulate, "reference": reference}[backend]
    k = np.array([[2.0**-130] * 4 + [1.5] * 4], np.float32)
    got = module.kpool_compress(k, np.zeros_like(k), np.zeros((1, 8), np.float32), np.array([0, 1]), np.array([0]))
    np.testing.assert_array_equal(got, [[0.0] * 4 + [1.5] * 4])


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_float16_keeps_its_own_subnormals(backend):
    # float16 subnormals are normal float32 values: nothing flushes them.
    got = pool(backend, [0.0] * 4, keys=[2.0**-20] * 4, dtype=F16)
    assert np.all(got == 2.0**-20)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_float16_output_does_not_overflow_from_finite_keys(backend):
    # The pooled value is a convex combination of the keys, so keys at the
    # float16 maximum stay finite: 65504, never inf.
    got = pool(backend, [0.3, -0.2, 0.1, 0.0], keys=[65504.0] * 4, dtype=F16)
    np.testing.assert_array_equal(got, 65504.0)
    got = pool(backend, [0.3, -0.2, 0.1, 0.0], keys=[-65504.0] * 4, dtype=F16)
    np.testing.assert_array_equal(got, -65504.0)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_infinite_key_with_weight_gives_infinity(backend):
    got = pool(backend, [0.0, 0.0, 0.0, 0.0], keys=[1.0, np.inf, 4.0, 8.0], dtype=F16)
    assert np.all(got == np.inf)


@pytest.mark.parametrize("backend", ["emulate", "reference"])
@pytest.mark.parametrize("kpool", [1, 4])
def test_keys_up_to_flt_max_over_kpool_stay_finite_and_above_may_overflow(backend, kpool):
    # Issue 9, finding 10: the float32 sums hold kpool keys of at most
    # FLT_MAX / kpool (README, "Numerics at the edges"); equal logits make
    # every weight 1, the worst case for the sum.
    module = {"emulate": emulate, "reference": reference}[backend]
    limit = np.finfo(np.float32).max / kpool
    offsets, cache = np.array([0, kpool], np.int32), np.array([0], np.int32)
    gate, ape = np.zeros((kpool, 8), np.float32), np.zeros((kpool, 8), np.float32)
    at_bound = np.full((kpool, 8), limit, np.float32)
    pooled = module.kpool_compress(at_bound, gate, ape, offsets, cache)
    assert np.isfinite(pooled).all()
    np.testing.assert_allclose(pooled, limit, rtol=2.0**-21)  # kpool float32 roundings of one value
    if kpool > 1:  # one member is the key itself: no sum to overflow
        above = np.full((kpool, 8), 2 * limit, np.float32)
        assert np.isinf(module.kpool_compress(above, gate, ape, offsets, cache)).all()


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_overflow_and_infinite_keys_give_the_same_class_on_both_backends(dtype):
    # Past the finite range the answer is +-inf or NaN; the reference takes
    # the kernel's chunks, so it gives the kernel's. Float32 pools of 5 and 7
    # members come in chunks of 2 (bf16: whole): two chunks overflowing to
    # +inf and -inf give NaN, and an infinite key weighted e^-50 within its
    # chunk (e^-110 against the pool's maximum) keeps its infinity.
    rows, cached = np.array([0, 5], np.int32), np.array([0], np.int32)
    huge = np.array([3e38, 3e38, -3e38, -3e38, 0.0])[:, None] * np.ones((5, 8))
    cases = [(huge, np.zeros((5, 8)), rows, cached)]
    keys = np.ones((7, 8))
    keys[0] = np.inf
    gate = np.zeros((7, 8))
    gate[0], gate[6] = -50.0, 60.0
    cases.append((keys, gate, np.array([0, 7], np.int32), cached))
    for k, g, r, c in cases:
        ape = np.zeros((k.shape[0], 8), np.float32)
        k, g = k.astype(dtype), g.astype(dtype)
        got = emulate.kpool_compress(k, g, ape, r, c, out_dtype="float32")
        want = reference.kpool_compress(k, g, ape, r, c, out_dtype="float32")
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got) * np.sign(got), np.isinf(want) * np.sign(want))
