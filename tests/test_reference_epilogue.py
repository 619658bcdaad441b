"""The FP8 epilogue's NumPy reference (issue 12): every rounding point, against ml_dtypes and a plain model.

Exact wherever the arithmetic is the same on both sides; where a bound is
used its size is said in e4m3 or bf16 ulps.
"""

from __future__ import annotations

import bisect
import decimal
import math

import ml_dtypes
import numpy as np
import pytest

from kpool_cupy.backends import reference_epilogue as ep

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
HEAD_DIMS = (1, 2, 8, 64, 128, 256)
FLOOR_V = np.float32(1e-4) * np.float32(1 / 448)  # v of an all-zero row: a float32 product

# The finite non-negative e4m3fn values, codes 0x00..0x7e, in increasing order.
E4M3_CODES = np.arange(0x7F, dtype=np.uint8)
E4M3_VALUES = E4M3_CODES.view(E4M3).astype(np.float64)


def e4m3_ulp(magnitude: np.ndarray) -> np.ndarray:
    """The e4m3 spacing at |x|: 2^(e-3) in the binade [2^e, 2^(e+1)) for e >= -6, 2^-9 below."""
    _, exponent = np.frexp(np.maximum(magnitude, 2.0**-6))  # magnitude = m * 2^exponent, m in [0.5, 1)
    return np.ldexp(1.0, exponent - 1 - 3)


def where_bytes_differ(got: np.ndarray, want: np.ndarray, inputs: np.ndarray) -> str:
    bad = np.argwhere(got != want)[:8]
    return "; ".join(
        f"at {tuple(int(i) for i in b)}: input {inputs[tuple(b)]!r} got {got[tuple(b)]:#04x} want {want[tuple(b)]:#04x}"
        for b in bad
    )


def dense_grid() -> np.ndarray:
    """float32 values over every e4m3 binade and past it, both signs.

    Binades 2^-12 (below e4m3's smallest subnormal, 2^-9) to [256, 512):
    the top 14 mantissa bits take every value, so each e4m3 value, each
    halfway point between two (a 1 followed by zeros below the kept bits)
    and eight more points between them appear, each with its float32
    neighbours on both sides (low bits 0, 1 and 0x1ff). Then the ends:
    zeros, float32 subnormals, 448 and just above, 464 (448's halfway point
    to 480), 480, huge values and infinity.
    """
    exponents = np.arange(127 - 12, 127 + 9, dtype=np.uint32)
    high = np.arange(1 << 14, dtype=np.uint32) << 9
    low = np.array([0, 1, 0x1FF], dtype=np.uint32)
    bits = (exponents[:, None, None] << 23) | high[None, :, None] | low[None, None, :]
    ends = np.array(
        [0.0, 2.0**-149, 2.0**-127, 2.0**-126, 448.0, 449.0, 463.9, 464.0, 464.1, 479.9, 480.0, 1e6, 3.4e38, np.inf],
        dtype=np.float32,
    )
    ends = np.concatenate([ends, np.nextafter(np.float32(448), np.float32(np.inf), dtype=np.float32)[None]])
    grid = np.concatenate([bits.ravel().view(np.float32), ends])
    return np.concatenate([grid, -grid])


def test_quantize_matches_ml_dtypes_nearest_even_cast_on_a_dense_grid():
    # Each e4m3 binade, its subnormals and every tie: ml_dtypes' cast rounds
    # to nearest even, so any other tie rule or a lost carry shows here.
    # ml_dtypes turns values past 448 into NaN, hence the clamp on its side.
    x = dense_grid()
    want = np.clip(x, -448, 448).astype(E4M3).view(np.uint8)
    got = ep.quantize_e4m3fn(x)
    assert np.array_equal(got, want), where_bytes_differ(got, want, x)


def test_halfway_points_go_to_the_even_code():
    # A plain model that does not use ml_dtypes: the midpoint of two
    # neighbouring e4m3 values (exact in float32) takes the code whose
    # last bit is 0. Covers subnormal, subnormal-to-normal and carry ties.
    low, high = E4M3_VALUES[:-1], E4M3_VALUES[1:]
    mid = ((low + high) / 2).astype(np.float32)
    assert np.array_equal(mid.astype(np.float64), (low + high) / 2)  # exact
    even = np.where(E4M3_CODES[:-1] % 2 == 0, E4M3_CODES[:-1], E4M3_CODES[1:])
    got = ep.quantize_e4m3fn(mid)
    assert np.array_equal(got, even), where_bytes_differ(got, even, mid)
    assert np.array_equal(ep.quantize_e4m3fn(-mid), even | 0x80)


def test_quantize_signed_zero_saturation_and_nan():
    # -0.0 and negatives that round to zero keep their sign (0x80); values
    # past 448 and infinities clamp to ±448 (0x7e, 0xfe); NaN of either sign
    # gives 0x7f (the module's docstring says why the sign is dropped).
    x = np.array([-0.0, -(2.0**-10), -(2.0**-149), 449, 1e30, np.inf, -np.inf, np.nan, -np.nan], dtype=np.float32)
    want = np.array([0x80, 0x80, 0x80, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0x7F], dtype=np.uint8)
    got = ep.quantize_e4m3fn(x)
    assert np.array_equal(got, want), where_bytes_differ(got, want, x)


def is_normal_power_of_two(s: np.ndarray) -> np.ndarray:
    bits = s.view(np.uint32)
    exponent = (bits >> 23) & 0xFF
    return ((bits & 0x807FFFFF) == 0) & (exponent >= 1) & (exponent <= 254)


def scale_edges() -> np.ndarray:
    powers = np.ldexp(np.float32(1), np.arange(-126, 127)).astype(np.float32)
    up = np.nextafter(powers, np.float32(np.inf))
    down = np.nextafter(powers, np.float32(0))[1:]  # below 2^-126 is subnormal: its own test
    special = np.array([FLOOR_V, 1e-4 / 448, 0.75, 1.5, np.finfo(np.float32).max / 448], dtype=np.float32)
    return np.concatenate([powers, up, down, special])


def test_ue8m0_scale_is_the_smallest_power_of_two_at_or_above_v():
    # Powers of two (kept as they are), their float32 neighbours on both
    # sides (where a rounded log2 goes wrong), the all-zero row's v and
    # random v over the whole normal range: s is a power of two, s >= v,
    # s < 2v, checked in float64, where all three are exact.
    rng = np.random.default_rng(12)
    exponent = rng.integers(1, 254, 100_000, dtype=np.uint32)  # v <= 2^127: s stays finite
    mantissa = rng.integers(0, 1 << 23, 100_000, dtype=np.uint32)
    v = np.concatenate([scale_edges(), ((exponent << 23) | mantissa).view(np.float32)])
    s = ep.ue8m0_scale(v)
    v64, s64 = v.astype(np.float64), s.astype(np.float64)
    bad = ~(is_normal_power_of_two(s) & (s64 >= v64) & (s64 < 2 * v64))
    assert not bad.any(), [(float(a), float(b)) for a, b in zip(v[bad][:8], s[bad][:8], strict=True)]
    powers = v[is_normal_power_of_two(v)]
    assert np.array_equal(ep.ue8m0_scale(powers), powers)


def test_ue8m0_scale_edges():
    # The docstring's edges: zero and subnormals (flushed, so read as zero)
    # give the smallest normal power of two; 2^127 stays; above it there is
    # no float32 power of two and the scale is +inf; NaN stays NaN.
    tiny, big = np.float32(2.0**-126), np.float32(2.0**127)
    v = np.array([0.0, -0.0, 2.0**-149, 2.0**-127, np.nextafter(tiny, 0), tiny, big], dtype=np.float32)
    want = np.array([tiny, tiny, tiny, tiny, tiny, tiny, big], dtype=np.float32)
    assert np.array_equal(ep.ue8m0_scale(v).view(np.uint32), want.view(np.uint32))
    over = np.array([np.nextafter(big, np.float32(np.inf)), np.finfo(np.float32).max, np.inf], dtype=np.float32)
    assert np.all(ep.ue8m0_scale(over) == np.inf)
    assert np.isnan(ep.ue8m0_scale(np.array([np.nan], dtype=np.float32))).all()
    with pytest.raises(ValueError, match="v"):
        ep.ue8m0_scale(np.array([-1.0], dtype=np.float32))


def test_inverse_sqrt_is_the_nearest_float32():
    # The one multiply of the rotation: no float32 is closer to 1/sqrt(D)
    # (compared at 60 digits, so the float64 route's rounding is checked too).
    with decimal.localcontext() as context:
        context.prec = 60
        for log_d in range(17):
            d = 1 << log_d
            c = ep.inverse_sqrt(d)
            exact = 1 / decimal.Decimal(d).sqrt()
            neighbours = [np.nextafter(c, np.float32(0)), np.nextafter(c, np.float32(np.inf))]
            distance = abs(decimal.Decimal(float(c)) - exact)
            assert all(distance < abs(decimal.Decimal(float(n)) - exact) for n in neighbours), (d, c)


def sylvester(d: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_hadamard_is_sylvester_and_twice_is_head_dim_times_the_input(head_dim):
    # Small integers keep every sum exact in float32 (|sum| <= 8 * 256 * 256
    # < 2^24), so the butterflies must equal Sylvester's matrix in float64
    # and applying them twice must give D * x bit for bit.
    x = np.random.default_rng(head_dim).integers(-8, 9, (5, head_dim)).astype(np.float32)
    once = ep.hadamard(x)
    assert np.array_equal(once.astype(np.float64), x.astype(np.float64) @ sylvester(head_dim))
    assert np.array_equal(ep.hadamard(once), x * np.float32(head_dim))


def butterflies_by_hand(row: np.ndarray, strides) -> np.ndarray:
    """The butterflies one pair at a time, float32 scalar adds, in the order given."""
    x = [np.float32(value) for value in row]
    for h in strides:
        for i in range(len(x)):
            if not i & h:
                x[i], x[i + h] = x[i] + x[i + h], x[i] - x[i + h]
    return np.array(x, dtype=np.float32)


@pytest.mark.parametrize("head_dim", (8, 16, 64))
def test_hadamard_adds_at_strides_1_2_4_in_that_order(head_dim):
    # Magnitudes spread over 2^±12 make the adds round, so the order of the
    # strides shows in the bits. The test proves it can tell: the reverse
    # order gives other bits on the same rows.
    rng = np.random.default_rng(head_dim)
    x = (rng.standard_normal((6, head_dim)) * np.exp2(rng.integers(-12, 13, (6, head_dim)))).astype(np.float32)
    strides = [1 << i for i in range(head_dim.bit_length() - 1)]
    want = np.stack([butterflies_by_hand(row, strides) for row in x])
    got = ep.hadamard(x)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), np.argwhere(got != want)[:8]
    reversed_order = np.stack([butterflies_by_hand(row, strides[::-1]) for row in x])
    assert not np.array_equal(reversed_order, want)


def test_subnormals_are_flushed_except_float16_ones():
    # Policy (README, "Subnormals follow the GPU"): a subnormal float32 input
    # reads as zero, and a butterfly whose result is subnormal writes zero.
    # float16's subnormals are normal float32 values and stay.
    tiny = np.float32(2.0**-126)
    assert np.array_equal(ep.hadamard(np.array([[2.0**-130, 0.0]], np.float32)), [[0.0, 0.0]])
    got = ep.hadamard(np.array([[1.5 * tiny, tiny]], np.float32))
    assert np.array_equal(got, np.array([[2.5 * tiny, 0.0]], np.float32))  # 0.5 * tiny is subnormal
    # The floor's scale 2^-22 makes a 2^-24 query visible in e4m3, so a
    # float16 subnormal gives non-zero bytes. (A float32 or bf16 subnormal
    # would give zero bytes flushed or not: the floor hides it there.)
    half = np.array([[2.0**-24, 0, 0, 0, 0, 0, 0, 0]], np.float16)  # float16's smallest subnormal
    assert np.all(ep.hadamard_quant(half)[0] & 0x7F != 0)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_rotating_twice_returns_the_input_to_bf16_rounding(head_dim):
    # Each rotation is orthonormal and ends in one bf16 rounding, which moves
    # a row by at most 2^-8 of its norm (half a bf16 ulp, relative); two give
    # 2^-7. The 1.01 covers the float32 adds and fl32(1/sqrt(D))^2 * D != 1.
    x = np.random.default_rng(head_dim).standard_normal((16, head_dim)).astype(BF16).astype(np.float32)
    back = ep.rotate(ep.rotate(x, BF16).astype(np.float32), BF16).astype(np.float64)
    error = np.linalg.norm(back - x, axis=1)
    bound = 2.0**-7 * np.linalg.norm(x.astype(np.float64), axis=1) * 1.01
    assert np.all(error <= bound), (error / bound).max()


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_a_one_hot_row_rotates_to_constant_magnitude(head_dim):
    # Row j of the rotation of a * e_j is a * H[j] / sqrt(D): one magnitude,
    # Sylvester's signs, exactly (every butterfly adds a zero).
    a = np.float32(3.25)
    x = np.eye(head_dim, dtype=np.float32) * a
    y = ep.rotate(x, BF16).astype(np.float32)
    magnitude = np.float32(a * ep.inverse_sqrt(head_dim)).astype(BF16).astype(np.float32)
    assert np.array_equal(y, magnitude * sylvester(head_dim).astype(np.float32))
    q, _ = ep.epilogue(x)
    assert np.all((q & 0x7F) == q[0, 0] & 0x7F)


def test_the_rotation_rounds_to_float32_before_bf16():
    # y = bf16(fl32(B(x) * c)): two roundings. Where the float32 product
    # lands on a bf16 tie that the exact product does not, skipping the
    # float32 step (a float64 multiply rounded once to bf16) gives another y.
    # Rows [a, 0] at D = 2 have B(x) = [a, a]; the search finds such a.
    c = ep.inverse_sqrt(2)
    a = np.random.default_rng(2).integers(0x3F800000, 0x40000000, 1 << 20, dtype=np.uint32).view(np.float32)
    once = (a.astype(np.float64) * (1 / math.sqrt(2))).astype(BF16)
    a = a[(a * c).astype(BF16) != once]
    assert a.size, "no case where the float32 step matters: the test would prove nothing"
    x = np.stack([a, np.zeros_like(a)], axis=1)
    want = np.array([BF16(value * c) for value in a], dtype=BF16)
    got = ep.rotate(x, BF16)
    assert np.array_equal(got[:, 0], want) and np.array_equal(got[:, 1], want), a[got[:, 0] != want]


def test_without_round_scale_y_is_divided_by_s():
    # q = e4m3(fl32(y / s)), an IEEE division. With s = v (not a power of
    # two) multiplying by fl32(1 / s) rounds differently, and sometimes onto
    # the other side of an e4m3 tie. Those y sit within a float32 ulp of
    # tie * v (float32 values: bf16 ones seldom land there); the search
    # keeps the ones where the two roundings give different bytes.
    amax = np.float32(100)
    v = amax * np.float32(1 / 448)
    ties = (E4M3_VALUES[:-1] + E4M3_VALUES[1:]) / 2
    near = (ties * np.float64(v)).astype(np.float32)
    y = np.concatenate([near, np.nextafter(near, np.float32(0)), np.nextafter(near, np.float32(np.inf))])
    by_reciprocal = (y * (np.float32(1) / v)).astype(E4M3)
    y = y[(y / v).astype(E4M3) != by_reciprocal]
    assert y.size, "no y where the two differ: the test would prove nothing"
    rows = np.stack([np.full_like(y, amax), y], axis=1)
    q, s = ep.scale_and_quantize(rows, round_scale=False)
    assert np.all(s == v)
    want = np.array([nearest_even_code(value / v) for value in y], dtype=np.uint8)
    assert np.array_equal(q[:, 1], want), where_bytes_differ(q[:, 1], want, y)


@pytest.mark.parametrize("m", (-16, -7, -1, 0, 3, 20))
def test_an_amax_of_7_times_a_power_of_two_reaches_exactly_448(m):
    # fl32(1/448) is above 1/448, but 7 * 2^m * fl32(1/448) rounds back to
    # 2^(m-6): v is a power of two, s = v, and amax / s = 448 (code 0x7e).
    # m >= -16 keeps 7 * 2^m above the 1e-4 floor.
    amax = np.float32(7 * 2.0**m)
    y = np.array([[amax, -amax / 2, 1.0 * 2.0**m], [-amax, 0.0, amax / 4]], np.float32)
    q, s = ep.scale_and_quantize(y)
    assert np.array_equal(s, np.full(2, 2.0 ** (m - 6), np.float32))
    assert q[0, 0] == 0x7E and q[1, 0] == 0xFE, q
    # Through the key side: at D = 64, 1/sqrt(D) = 1/8 exactly, so a one-hot
    # bf16 row of 8 * amax rotates to ±amax.
    q, s = ep.epilogue(np.eye(64, dtype=np.float32)[:1] * np.float32(8 * amax))
    assert np.all((q == 0x7E) | (q == 0xFE)) and s[0] == np.float32(2.0 ** (m - 6)), (q, s)
    # Through the query side at D = 128: a float32 input (not rounded to
    # bf16) whose rotation rounds to amax.
    x = np.eye(128, dtype=np.float32)[:1] * np.float32(float(amax) * math.sqrt(128))
    assert ep.rotate(x, BF16).astype(np.float32)[0, 0] == amax  # the case is what it says
    q, s = ep.hadamard_quant(x)
    assert np.all((q == 0x7E) | (q == 0xFE)) and s[0] == np.float32(2.0 ** (m - 6)), (q, s)


@pytest.mark.parametrize("side", ("key", "query"))
def test_an_all_zero_row_gets_the_floor_scale_and_zero_bytes(side):
    # The 1e-4 floor: v = fl32(1e-4) * fl32(1/448) as a float32 product,
    # 2^-22 once rounded up to a power of two; y / s = 0 gives code 0x00.
    zeros = np.zeros((3, 128), np.float32)
    run = ep.epilogue if side == "key" else ep.hadamard_quant
    q, s = run(zeros)
    assert not q.any() and np.array_equal(s, np.full(3, 2.0**-22, np.float32))
    assert ep.ue8m0_scale(FLOOR_V) == np.float32(2.0**-22)
    q, s = run(zeros, round_scale=False)
    assert not q.any() and np.array_equal(s.view(np.uint32), np.full(3, FLOOR_V, np.float32).view(np.uint32))


def test_a_nan_row_gets_the_floor_scale_and_nan_bytes():
    # One NaN spreads to the whole row through the butterflies; the maximum
    # skips NaN like fmaxf, so the scale is the floor's and every byte NaN.
    # The other row is untouched.
    x = np.ones((2, 16), np.float32)
    x[0, 5] = np.nan
    q, s = ep.epilogue(x)
    assert np.all(q[0] == 0x7F) and s[0] == np.float32(2.0**-22)
    assert np.array_equal(q[1], ep.epilogue(x[1:])[0][0]) and np.all(q[1] != 0x7F)


@pytest.mark.parametrize("round_scale", (True, False))
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_round_trip_is_within_half_an_e4m3_ulp(head_dim, round_scale):
    # |q * s - y| <= half an e4m3 ulp of y / s, times s. With a power-of-two
    # s the division is exact and that is the whole bound; with s = v it
    # rounds once more, adding 2^-24 |y / s| (which also covers the small
    # overshoot past 448 when v rounds below amax / 448: the saturation).
    rng = np.random.default_rng(head_dim)
    magnitude = np.exp2(rng.uniform(-20, 20, (64, 1)))
    pooled = (rng.standard_normal((64, head_dim)) * magnitude).astype(np.float32)
    q, s = ep.epilogue(pooled, round_scale=round_scale)
    assert q.dtype == np.uint8 and s.dtype == np.float32 and q.shape == pooled.shape and s.shape == (64,)
    assert not np.any((q & 0x7F) == 0x7F), "finite rows give no NaN byte"
    y = ep.rotate(pooled.astype(BF16).astype(np.float32), BF16).astype(np.float64)
    ratio = np.abs(y) / s[:, None]
    error = np.abs(q.view(E4M3).astype(np.float64) * s[:, None] - y) / s[:, None]
    bound = e4m3_ulp(ratio) / 2 + (0 if round_scale else ratio * 2.0**-24)
    assert np.all(error <= bound), np.argwhere(error > bound)[:8]


def nearest_even_code(t: np.float32) -> int:
    """e4m3fn code of t the plain way: clamp, nearest table value, ties to the even code."""
    if t != t:
        return 0x7F
    sign = 0x80 if math.copysign(1.0, t) < 0 else 0
    a = min(abs(float(t)), 448.0)
    i = bisect.bisect_left(E4M3_VALUES.tolist(), a)
    if E4M3_VALUES[i] == a:
        return i | sign
    below, above = a - E4M3_VALUES[i - 1], E4M3_VALUES[i] - a
    code = i - 1 if below < above or (below == above and (i - 1) % 2 == 0) else i
    return code | sign


def epilogue_by_hand(row: np.ndarray, round_scale: bool, key_side: bool) -> tuple[list[int], np.float32]:
    """One row as the issue writes it: float32 scalars, frexp for the scale, the table for e4m3."""
    d = len(row)
    x = row.astype(BF16).astype(np.float32) if key_side else row.astype(np.float32)
    b = butterflies_by_hand(x, [1 << i for i in range(d.bit_length() - 1)])
    c = np.float32(1 / math.sqrt(d))
    y = [np.float32(BF16(value * c)) for value in b]
    amax = max([abs(value) for value in y if value == value] + [np.float32(1e-4)])
    v = np.float32(amax) * np.float32(1 / 448)
    mantissa, exponent = math.frexp(float(v))  # v = mantissa * 2^exponent, mantissa in [0.5, 1)
    s = np.float32(v if not round_scale or mantissa == 0.5 else math.ldexp(1.0, exponent))
    return [nearest_even_code(value / s) for value in y], s


@pytest.mark.parametrize("round_scale", (True, False))
@pytest.mark.parametrize("head_dim", (2, 8, 32))
@pytest.mark.parametrize("side", ("key", "query"))
def test_the_epilogue_matches_a_plain_model(side, head_dim, round_scale):
    # Bit for bit: every rounding point in order. Magnitudes spread over
    # 2^±8 within a row so values land in e4m3's subnormals and on its
    # ties; no sum comes near float32's subnormals, so no flushing is modelled.
    rng = np.random.default_rng(head_dim)
    x = (rng.standard_normal((12, head_dim)) * np.exp2(rng.integers(-8, 9, (12, head_dim)))).astype(np.float32)
    if side == "key":
        q, s = ep.epilogue(x, round_scale=round_scale)
    else:
        q, s = ep.hadamard_quant(x, round_scale=round_scale)
    for r, row in enumerate(x):
        want_q, want_s = epilogue_by_hand(row, round_scale, side == "key")
        assert s[r] == want_s, (r, s[r], want_s)
        assert q[r].tolist() == want_q, (r, q[r].tolist(), want_q)


def test_the_query_side_skips_the_bf16_rounding_of_x():
    # A bf16 query equals the key side on the same values; a float32 query
    # is rotated from its own bits, so some row differs from the key side.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    as_bf16 = x.astype(BF16)
    for got, want in zip(ep.hadamard_quant(as_bf16), ep.epilogue(as_bf16.astype(np.float32)), strict=True):
        assert np.array_equal(got, want)
    assert not np.array_equal(ep.hadamard_quant(x)[0], ep.epilogue(x)[0])


@pytest.mark.parametrize("head_dim", (0, 3, 6, 17, 96, 989))
def test_a_head_dim_that_is_not_a_power_of_two_is_refused(head_dim):
    x = np.ones((2, head_dim), np.float32)
    for call in (ep.hadamard, lambda a: ep.rotate(a, BF16), ep.epilogue, ep.hadamard_quant):
        with pytest.raises(ValueError, match=f"head_dim.*got {head_dim}"):
            call(x)


def test_dtypes_and_ranks_are_checked():
    with pytest.raises(TypeError, match="float32"):
        ep.hadamard(np.ones((1, 8), np.float64))
    with pytest.raises(TypeError, match="float32"):
        ep.epilogue(np.ones((1, 8), BF16))
    with pytest.raises(TypeError, match="bfloat16, float16 or float32"):
        ep.hadamard_quant(np.ones((1, 8), np.int32))
    with pytest.raises(TypeError, match="float32"):
        ep.quantize_e4m3fn(np.ones(3, np.float64))
    with pytest.raises(ValueError, match="rows, head_dim"):
        ep.epilogue(np.ones(8, np.float32))
