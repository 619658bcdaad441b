"""The device FP8 epilogue (kernels/kpool_fp8.cuh), run by the emulator, against the NumPy reference's bytes.

tests/kernels/fp8_epilogue.cu drives ``kp::fp8_epilogue`` over rows, one
group of D / 8 cooperating lanes per row (butterflies and the row maximum
across lanes through warp shuffles). Values and scales must equal
kpool_cupy/backends/reference_epilogue.py bit for bit: both round at the same
points, flush subnormals alike and convert to e4m3fn by the same rule.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kpool_cupy.backends import reference_epilogue as ref
from kpool_cupy.emulator.launch import launch_code, recording
from kpool_cupy.kernel.geometry import group_geometry
from kpool_cupy.kernel.nvrtc import code_ptx, code_ptxas_report
from kpool_cupy.kernel.sources import kernel_source

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "tests/kernels/fp8_epilogue.cu"


def _code() -> str:
    return kernel_source("kpool_fp8.cuh") + f'#line 1 "{SOURCE}"\n' + (ROOT / SOURCE).read_text()


def _run(x: np.ndarray, *, round_scale: bool, key: bool) -> tuple[np.ndarray, np.ndarray]:
    rows, head_dim = x.shape
    values = np.full((rows, head_dim), 0xAA, np.uint8)  # a byte the kernel must overwrite
    scales = np.full(rows, np.nan, np.float32)
    geometry = group_geometry(head_dim, rows)
    name = f"fp8_epilogue_rows<{head_dim}, {str(round_scale).lower()}, {str(key).lower()}>"
    with recording() as launches:
        launch_code(_code(), name, geometry.grid, geometry.block, (x, np.int64(rows), values, scales))
    assert [launch.cooperative for launch in launches] == [True]
    return values, scales


def _rows(rng: np.random.Generator, rows: int, head_dim: int) -> np.ndarray:
    """Rows of every kind the epilogue meets: plain, wide-ranged, tiny (the 1e-4 floor), zero, one-hot,
    an amax of 7 * 2^m, and values that round onto e4m3 ties."""
    x = rng.standard_normal((rows, head_dim)).astype(np.float32)
    x[1] *= np.float32(2.0) ** rng.integers(-20, 20, head_dim).astype(np.float32)
    x[2] *= np.float32(1e-7)
    x[3] = 0.0
    x[4] = 0.0
    x[4, 3] = 5.0
    x[5] = np.float32(7 * 2.0**-3) * np.sign(rng.standard_normal(head_dim)).astype(np.float32)
    return x


@pytest.mark.parametrize("head_dim", [8, 16, 32, 64, 128, 256])
@pytest.mark.parametrize("round_scale", [True, False], ids=["ue8m0", "exact-scale"])
def test_the_key_side_equals_the_reference_bit_for_bit(head_dim, round_scale):
    x = _rows(np.random.default_rng(head_dim), 37, head_dim)  # 37 rows: the last block has surplus groups
    values, scales = _run(x, round_scale=round_scale, key=True)
    want_values, want_scales = ref.epilogue(x, round_scale=round_scale)
    assert scales.tobytes() == want_scales.astype(np.float32).tobytes()
    assert np.array_equal(values, want_values)


@pytest.mark.parametrize("head_dim", [16, 128])
@pytest.mark.parametrize("round_scale", [True, False], ids=["ue8m0", "exact-scale"])
def test_the_query_side_equals_the_reference_bit_for_bit(head_dim, round_scale):
    # The query side takes x as it is: no bfloat16 rounding before the butterflies.
    x = _rows(np.random.default_rng(7 + head_dim), 20, head_dim)
    values, scales = _run(x, round_scale=round_scale, key=False)
    want_values, want_scales = ref.hadamard_quant(x, round_scale=round_scale)
    assert scales.tobytes() == want_scales.astype(np.float32).tobytes()
    assert np.array_equal(values, want_values)
    # Control: the key side's rounding of x changes some bytes of the same rows.
    key_values, _ = _run(x, round_scale=round_scale, key=True)
    assert not np.array_equal(key_values, values)


@pytest.mark.parametrize("round_scale", [True, False], ids=["ue8m0", "exact-scale"])
def test_rows_spread_over_most_e4m3_codes_convert_as_the_reference_does(round_scale):
    # Values spread over 2^-20 .. 2^20 before the rotation leave y / s all
    # over e4m3's range after it, so the kernel's conversion is checked on
    # most of the 254 finite codes (178 and 185 at this seed), against
    # the reference's rule (itself checked against ml_dtypes in
    # tests/test_reference_epilogue.py).
    rng = np.random.default_rng(11)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-20, 20, x.shape).astype(np.float32)
    values, scales = _run(x, round_scale=round_scale, key=False)
    want_values, want_scales = ref.hadamard_quant(x, round_scale=round_scale)
    assert np.array_equal(values, want_values) and scales.tobytes() == want_scales.tobytes()
    assert len(np.unique(values)) > 150, len(np.unique(values))  # the comparison covered many codes


def conversion_inputs() -> np.ndarray:
    """float32 values around every place the e4m3fn conversion can go wrong, both signs.

    Every exponent from 2^-30 to 2^12 at 64 mantissas each; each normal
    code's rounding midpoint (low 20 mantissa bits 0x80000) and its two
    neighbours, at every exponent; each subnormal code's midpoint (k + 1/2)
    * 2^-9 and its neighbours; 2^-6 and 448 with their neighbours; zero,
    infinities, NaN, and float32 subnormals (which the build flushes).
    """
    exponents = np.arange(127 - 30, 127 + 13, dtype=np.uint32)[:, None] << 23
    spread = (exponents | (np.arange(64, dtype=np.uint32) << 17)[None, :]).ravel()
    kept = (np.arange(8, dtype=np.uint32) << 20)[None, :]
    midpoints = (exponents | kept | 0x80000).ravel()
    around = np.concatenate([midpoints - 1, midpoints, midpoints + 1]).view(np.float32)
    small = (np.arange(8, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0**-9)
    edges = np.array([2.0**-6, 448.0, 464.0, 480.0], np.float32)
    near = np.concatenate([small, edges])
    near = np.concatenate([near, np.nextafter(near, np.float32(0)), np.nextafter(near, np.float32(np.inf))])
    special = np.array([0.0, np.inf, np.nan, 1e-40, 2.0**-126], np.float32)
    values = np.concatenate([spread.view(np.float32), around, near, special])
    values = np.concatenate([values, -values])
    return np.concatenate([values, np.zeros(-values.size % 4, np.float32)])  # whole words of four


def e4m3_code() -> str:
    """tests/kernels/e4m3_bits.cu after the FP8 header: e4m3_bits_of and e4m3x4_bits_of."""
    code = kernel_source("kpool_fp8.cuh") + '#line 1 "tests/kernels/e4m3_bits.cu"\n'
    return code + (ROOT / "tests" / "kernels" / "e4m3_bits.cu").read_text()


def conversion_mismatches(x: np.ndarray, out: np.ndarray) -> list[tuple]:
    """The values (with their bits) whose byte differs from the reference's rule on the flushed value; [] when
    none does, after checking the comparison met all 254 finite codes and the NaN byte."""
    want = ref.quantize_e4m3fn(np.where(np.abs(x) < np.float32(2.0**-126), np.copysign(np.float32(0), x), x))
    wrong = np.flatnonzero(out != want)
    assert len(np.unique(want)) == 255
    return [(float(x[i]), hex(int(x[i : i + 1].view(np.uint32)[0])), out[i], want[i]) for i in wrong[:5]]


@pytest.mark.parametrize("kernel", ["e4m3_bits_of", "e4m3x4_bits_of"])
def test_the_conversion_to_e4m3fn_equals_the_reference_on_every_rounding_edge(kernel):
    # e4m3x4_bits packs four bytes a word, low byte first: on the emulator its bytes are e4m3fn_bits's, so this
    # holds its packing; tests/test_gpu_fp8.py holds the hardware conversion it takes on sm_89 and newer.
    x = conversion_inputs()
    out = np.full(x.size, 0xAA, np.uint8)
    per_thread = 4 if kernel == "e4m3x4_bits_of" else 1
    launch_code(e4m3_code(), kernel, -(-x.size // (256 * per_thread)), 256, (x, np.int64(x.size), out))
    assert conversion_mismatches(x, out) == []


def test_the_epilogue_compiles_for_the_gpu_with_its_shuffles_and_no_spills():
    # NVRTC's PTX through ptxas for sm_90: the test kernel at D = 128 keeps
    # everything in registers, and the cross-lane steps are shuffles.
    name = "fp8_epilogue_rows<128, true, true>"
    ptx = code_ptx(_code(), name)
    assert ptx.count("shfl.sync.bfly") >= 8 * 4 + 4  # 8 values x 4 cross-lane strides, 4 for the maximum
    report = code_ptxas_report(_code(), name)
    assert report.spill_stores == report.spill_loads == 0, report


@pytest.mark.parametrize(("arch", "e4m3", "bf16"), [("sm_80", 0, 4), ("sm_89", 4, 4), ("sm_90", 4, 4)])
def test_the_gpu_converts_with_the_hardwares_instructions_where_it_has_them(arch, e4m3, bf16):
    # A thread's 8 values: 4 bfloat16 pair roundings (sm_80 and newer) and 4 e4m3 pair conversions (sm_89 and
    # newer; e4m3fn_bits before). The emulator runs the rules these instructions follow (e4m3fn_bits,
    # from_float<bf16>); tests/test_gpu_fp8.py holds the instructions to them on a GPU.
    ptx = code_ptx(_code(), "fp8_epilogue_rows<128, true, false>", arch)
    assert ptx.count("cvt.rn.satfinite.e4m3x2.f32") == e4m3
    assert ptx.count("cvt.rn.bf16x2.f32") == bf16
