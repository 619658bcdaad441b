"""kp_relu_nan, the sm_90a head sum's relu, on the emulator and on a GPU: a NaN where x is one, x where it is
above zero (a subnormal reading as zero), +0 everywhere else, -0 included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kpool_cupy.emulator.launch import launch_code
from kpool_cupy.kernel.sources import kernel_source

ROOT = Path(__file__).resolve().parent.parent


def relu_code() -> str:
    """tests/kernels/relu_nan.cu after the portability header."""
    code = kernel_source("kpool_portability.h") + '#line 1 "tests/kernels/relu_nan.cu"\n'
    return code + (ROOT / "tests" / "kernels" / "relu_nan.cu").read_text()


def relu_inputs() -> np.ndarray:
    """Zeros, subnormals, the least normals, ordinary values, the largest, infinities and NaNs of both signs."""
    bits = [0x0, 0x1, 0x7FFFFF, 0x800000, 0x3F800000, 0x3E99999A, 0x7F7FFFFF, 0x7F800000, 0x7FC00000, 0x7F800001]
    positive = np.array(bits, np.uint32)
    return np.concatenate([positive, positive | np.uint32(0x80000000)]).view(np.float32)


def relu_mismatches(x: np.ndarray, out: np.ndarray) -> list[tuple[str, str]]:
    """(input bits, output bits) of every result off the rule; NaNs compared by place, not payload."""
    want = np.where(x >= np.finfo(np.float32).tiny, x, np.float32(0.0))  # NaN >= tiny is False: +0, not compared
    same = np.where(np.isnan(x), np.isnan(out), want.view(np.uint32) == out.view(np.uint32))
    pairs = zip(x.view(np.uint32)[~same], out.view(np.uint32)[~same], strict=True)
    return [(hex(int(i)), hex(int(o))) for i, o in pairs]


def test_the_emulated_relu_keeps_nan_and_gives_plus_zero_for_every_other_non_positive():
    x = relu_inputs()
    out = np.full(x.size, np.float32(7.0))
    launch_code(relu_code(), "relu_nan_of", 1, 32, (x, np.int64(x.size), out))
    assert relu_mismatches(x, out) == []


@pytest.mark.gpu
def test_gpu_relu_keeps_nan_and_gives_plus_zero_for_every_other_non_positive():
    # What the emulator assumes of max.ftz.NaN.f32, which the PTX ISA does not say for -0: +0.
    import cupy

    from kpool_cupy.kernel.sources import NVRTC_OPTIONS

    x = relu_inputs()
    out = cupy.full(x.size, 7.0, cupy.float32)
    kernel = cupy.RawModule(code=relu_code(), options=NVRTC_OPTIONS).get_function("relu_nan_of")
    kernel((1,), (32,), (cupy.asarray(x), np.int64(x.size), out))
    assert relu_mismatches(x, cupy.asnumpy(out)) == []
