"""kp::store8 of bfloat16 (kernels/kpool_common.cuh's pack_bf16x8): from_float<bf16>'s bits everywhere.

The emulator runs from_float<bf16> (round to nearest even; a NaN keeps its payload, made quiet). A GPU of sm_80
or newer rounds a group of eight with no NaN by the hardware's cvt.rn.bf16x2.f32, two values an instruction, and
a group holding a NaN by from_float (the hardware's NaN is the canonical one). The values cover every rounding
edge: ties to even either way, the largest finite values and the ones that round past them to infinity,
infinities, zeros of both signs, subnormals and NaNs with payloads, each NaN in a group of its own beside
finite edges (at lanes 0, 2, 4, 6 and 0), and random bit patterns. On the CPU only the emulator's path runs: the
hardware's (its operand order, the NaN test) is held by the GPU test alone.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_text import kernel_code

from kpool_cupy.emulator.launch import launch_code
from kpool_cupy.kernel.nvrtc import code_ptx

KERNELS = ("bf16_store8_of<true>", "bf16_store8_of<false>")  # 16-byte words, elements
_NANS = (0x7F800001, 0x7FC12345, 0xFFA00001, 0x7FFFFFFF, 0xFF800001)


def bf16_code() -> str:
    """tests/kernels/bf16_store.cu after the common header."""
    return kernel_code("tests/kernels/bf16_store.cu", "kpool_portability.h", "kpool_common.cuh")


def _groups_of_eight(bits: np.ndarray) -> np.ndarray:
    return np.concatenate([bits, np.zeros(-bits.size % 8, np.uint32)])


def conversion_inputs(seed: int = 0) -> np.ndarray:
    """float32 values in groups of eight: first every finite and infinite edge (no NaN, the hardware's path on a
    GPU), then one group per NaN with finite edges beside it (from_float's path)."""
    halves = np.array([0x3F80, 0x3F81, 0x7F7F, 0x7F7E, 0x0000, 0x0001, 0x007F, 0x0080, 0x4B00], np.uint32) << 16
    low = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)  # below, at and above the tie
    edges = (halves[:, None] | low[None, :]).ravel()
    special = np.array([0x7F800000, 0x00000000, 0x7F7FFFFF, 0x00800000, 0x007FFFFF, 0x00000001], np.uint32)
    finite = np.concatenate([edges, special])
    finite = np.concatenate([finite, finite | 0x80000000])  # both signs
    spread = np.random.default_rng(seed).integers(0, 2**32, 8192, dtype=np.uint64).astype(np.uint32)
    spread = spread[(spread & 0x7FFFFFFF) <= 0x7F800000]  # no NaN: these groups take the hardware's path
    # NaN number k at lane 2k mod 8 of its group, so a test of fewer lanes than eight misses one.
    with_nan = np.concatenate([np.insert(finite[:7], 2 * k % 8, nan) for k, nan in enumerate(_NANS)]).astype(np.uint32)
    bits = np.concatenate([_groups_of_eight(finite), _groups_of_eight(spread), with_nan])
    return bits.view(np.float32)


def want_bits(x: np.ndarray) -> np.ndarray:
    """from_float<bf16>'s rule on each value: round to nearest even; a NaN's top half with the quiet bit."""
    bits = x.view(np.uint32).astype(np.uint64)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)


def mismatches(x: np.ndarray, got: np.ndarray) -> list[tuple[str, str, str]]:
    """The first few values (bits) whose stored bfloat16 differs from want_bits', as hex; [] when none does."""
    want = want_bits(x)
    wrong = np.flatnonzero(got != want)
    return [(hex(int(x[i : i + 1].view(np.uint32)[0])), hex(int(got[i])), hex(int(want[i]))) for i in wrong[:5]]


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_emulator_stores_from_floats_bits_on_every_rounding_edge(kernel):
    x = conversion_inputs()
    out = np.full(x.size, 0xAAAA, np.uint16)
    launch_code(bf16_code(), kernel, -(-x.size // (8 * 128)), 128, (x, np.int64(x.size), out))
    assert mismatches(x, out) == []


def test_the_rule_the_tests_hold_is_the_ones_they_say():
    # want_bits against ml_dtypes' rounding (round to nearest even) on every value but NaN, whose payload
    # ml_dtypes does not keep.
    import ml_dtypes

    x = conversion_inputs()
    finite = ~np.isnan(x)
    with np.errstate(over="ignore"):
        rounded = x[finite].astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(want_bits(x)[finite], rounded)
    assert all(want_bits(np.array([n], np.uint32).view(np.float32))[0] & 0x7FC0 == 0x7FC0 for n in _NANS)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_120"])
def test_the_gpu_build_rounds_by_the_hardware_two_values_an_instruction(arch):
    # Eight values a thread: 4 bfloat16 pair roundings on the path without a NaN, in both stores.
    for kernel in KERNELS:
        assert code_ptx(bf16_code(), kernel, arch).count("cvt.rn.bf16x2.f32") == 4, kernel


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
def test_gpu_stores_from_floats_bits_on_every_rounding_edge(kernel):
    # Skipped without a CUDA device (run on the CuPy double too, where the emulator runs it).
    import cupy

    from kpool_cupy.kernel.sources import NVRTC_OPTIONS

    x = conversion_inputs()
    out = cupy.full(x.size, 0xAAAA, np.uint16)
    module = cupy.RawModule(code=bf16_code(), options=NVRTC_OPTIONS, name_expressions=(kernel,))
    function = module.get_function(kernel)
    function((-(-x.size // (8 * 128)),), (128,), (cupy.asarray(x), np.int64(x.size), out))
    assert mismatches(x, cupy.asnumpy(out)) == []


def test_the_models_cut_of_the_nan_path_finds_it_once():
    # scripts/bench_model.py counts the path finite values take (tools/value_paths): the cut must find
    # pack_bf16x8's test in every kernel's text, and refuse a text without it rather than count the wrong path.
    from kpool_cupy.kernel.sources import kernel_source
    from kpool_cupy.tools.value_paths import NAN_GROUP, finite_values_code

    code = kernel_source("kpool_compress.cu")
    cut = finite_values_code(code)
    assert NAN_GROUP not in cut and cut.count("if (true) {") == code.count("if (true) {") + 1
    with pytest.raises(ValueError, match="holds 0"):
        finite_values_code(code.replace(NAN_GROUP, "if (!any) {"))
