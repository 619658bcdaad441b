"""hadamard_quant_fp8, the query side: rows rotated and quantized by the FP8 epilogue the cache writers share."""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16, F16, F32

from kpool_cupy import emulate, reference
from kpool_cupy.backends import reference_epilogue as epilogue

QUERY_DTYPES = [BF16, F16, F32]


@pytest.mark.parametrize("dtype", QUERY_DTYPES, ids=["bf16", "f16", "f32"])
@pytest.mark.parametrize("head_dim", [8, 32, 128, 256])
def test_the_query_side_equals_the_reference_bit_for_bit(dtype, head_dim):
    rng = np.random.default_rng(head_dim)
    x = rng.standard_normal((37, head_dim)).astype(np.float32)
    x[1] *= np.float32(2.0) ** rng.integers(-12, 12, head_dim).astype(np.float32)  # inside float16's range
    x[2] = 0.0
    x = x.astype(dtype)
    for round_scale in (True, False):
        got = emulate.hadamard_quant_fp8(x, round_scale=round_scale)
        want = reference.hadamard_quant_fp8(x, round_scale=round_scale)
        direct = epilogue.hadamard_quant(x, round_scale)
        assert np.array_equal(got[0], want[0]) and np.array_equal(want[0], direct[0])
        assert got[1].tobytes() == want[1].tobytes() == direct[1].tobytes()


def test_the_query_side_keeps_subnormal_float16_and_flushes_subnormal_float32():
    x = np.zeros((2, 16), np.float32)
    x[0, :] = np.float32(2.0**-20)  # float16 subnormal: a normal float32, kept
    x[1, :] = np.float32(2.0**-130)  # float32 subnormal: flushed, the row is zero
    half = emulate.hadamard_quant_fp8(x.astype(F16))
    assert half[0][0].any() and np.array_equal(half[0], reference.hadamard_quant_fp8(x.astype(F16))[0])
    single = emulate.hadamard_quant_fp8(x)
    assert not single[0][1].any() and single[1][1] == np.float32(2.0**-22)
    assert np.array_equal(single[0], reference.hadamard_quant_fp8(x)[0])


def test_the_query_side_into_given_outputs_at_any_row_stride():
    x = np.random.default_rng(1).standard_normal((5, 64)).astype(BF16)
    want = reference.hadamard_quant_fp8(x)
    for module in (emulate, reference):
        wide = np.zeros((5, 80), np.uint8)
        scales = np.zeros(5, np.float32)
        result = module.hadamard_quant_fp8(x[:, :], out=wide[:, 3:67], out_scale=scales)
        assert np.array_equal(wide[:, 3:67], want[0]) and not wide[:, :3].any() and not wide[:, 67:].any()
        assert result[0].base is not None and scales.tobytes() == want[1].tobytes()


@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "f32"])
def test_infinite_and_nan_rows_and_the_largest_scales_convert_as_the_reference_does(dtype):
    # An infinite amax makes the scale infinite (y / inf: zeros and NaN
    # bytes); 3e38 everywhere overflows in the butterflies; 1e-30 meets the
    # 1e-4 floor. The kernel multiplies by 1/s where the reference divides.
    x = np.random.default_rng(0).standard_normal((7, 64)).astype(np.float32)
    x[0, 3] = np.inf
    x[1, 5] = np.nan
    x[2] = 3.0e38
    x[3, :2] = (-np.inf, np.inf)
    x[4] = 1e-30
    x[5] = np.float32(2.0**-126)
    x[6] *= np.float32(2.0**100)  # a scale near 2^100: its reciprocal is still a normal float32
    got = emulate.hadamard_quant_fp8(x.astype(dtype))
    want = reference.hadamard_quant_fp8(x.astype(dtype))
    assert np.isinf(want[1][[0, 2, 3]]).all() and want[1][6] > 2.0**90  # the rows reach what they are for
    assert np.array_equal(got[0], want[0]) and got[1].tobytes() == want[1].tobytes()
