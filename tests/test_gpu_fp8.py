"""The FP8 ops on the GPU path (issue 12); skipped without a CUDA device, run on the CuPy double on the CPU.

On a GPU the pooling's exp2 and reciprocal are approximations, so the
fused ops are compared with the epilogue applied to the GPU's own float32
kpool_compress (bit for bit, as on the CPU backends), and a decode schedule
with the GPU's own one-call cache. The query side has no approximation in
it: it must equal the reference bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16, F16, F32, make_batch, standard_lengths
from test_compress_fp8 import _scatter, _table_slots

from kpool_cupy import reference
from kpool_cupy.backends import reference_epilogue as epilogue

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("head_dim", "kpool"), [(128, 4), (64, 5), (256, 8)])
def test_gpu_fused_compress_is_the_epilogue_of_its_own_compress(head_dim, kpool):
    import cupy

    import kpool_cupy

    batch = make_batch(*standard_lengths(kpool), head_dim=head_dim, kpool=kpool, seed=kpool)
    args = tuple(cupy.asarray(a) for a in batch.args())
    values, scales = kpool_cupy.kpool_compress_fp8(*args)
    pooled = cupy.asnumpy(kpool_cupy.kpool_compress(*args, out_dtype="float32"))
    want_values, want_scales = epilogue.epilogue(pooled, True)
    assert np.array_equal(cupy.asnumpy(values), want_values)
    assert cupy.asnumpy(scales).tobytes() == want_scales.tobytes()
    # Into a paged cache through a block table: the same rows, at the table's slots.
    table = np.arange(len(standard_lengths(kpool)[0]) * 4, dtype=np.int32)[::-1].reshape(-1, 4).copy()
    cache = cupy.zeros((table.size, 4, head_dim + 4), np.uint8)
    kpool_cupy.kpool_compress_fp8(*args, cache=cache, block_table=cupy.asarray(table))
    slots = _table_slots(batch, kpool, table, 4)
    want_cache = _scatter(want_values, want_scales, np.zeros(cache.shape, np.uint8), slots)
    assert want_cache.any() and np.array_equal(cupy.asnumpy(cache), want_cache)


@pytest.mark.parametrize("dtype", [BF16, F16, F32], ids=["bf16", "f16", "f32"])
def test_gpu_query_side_equals_the_reference_bit_for_bit(dtype):
    import cupy

    import kpool_cupy

    x = np.random.default_rng(1).standard_normal((4 * 32, 128)).astype(dtype)  # 4 tokens x 32 heads
    values, scales = kpool_cupy.hadamard_quant_fp8(cupy.asarray(x))
    want_values, want_scales = reference.hadamard_quant_fp8(x)
    assert np.array_equal(cupy.asnumpy(values), want_values)
    assert cupy.asnumpy(scales).tobytes() == want_scales.tobytes()


def test_gpu_conversion_to_e4m3fn_equals_the_reference_on_every_rounding_edge():
    # The epilogue's conversion as the GPU runs it (kp::e4m3x4_bits: cvt.rn.satfinite.e4m3x2.f32 on sm_89 and
    # newer, e4m3fn_bits before): every rounding midpoint and its neighbours, e4m3's subnormals, 448 and past it,
    # infinities and NaN of both signs (0x7f), against the reference's rule.
    import cupy
    from test_fp8_epilogue import conversion_inputs, conversion_mismatches, e4m3_code

    from kpool_cupy.kernel.sources import NVRTC_OPTIONS

    x = conversion_inputs()
    out = cupy.full(x.size, 0xAA, cupy.uint8)
    kernel = cupy.RawModule(code=e4m3_code(), options=NVRTC_OPTIONS).get_function("e4m3x4_bits_of")
    kernel((-(-x.size // 1024),), (256,), (cupy.asarray(x), np.int64(x.size), out))
    assert conversion_mismatches(x, cupy.asnumpy(out)) == []


@pytest.mark.parametrize("round_scale", [True, False], ids=["ue8m0", "exact-scale"])
def test_gpu_query_side_spread_over_e4m3s_codes_equals_the_reference(round_scale):
    # Rows over 2^-20 .. 2^20, zero and one-hot rows, NaN and infinities: the rotation, the scale and the
    # hardware conversion together, bit for bit.
    import cupy

    import kpool_cupy

    # bfloat16 rows of 128: the variants the GPU run precompiles (scripts/gpu_variants.json).
    rng = np.random.default_rng(11)
    x = rng.standard_normal((128, 128)).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-20, 20, x.shape).astype(np.float32)
    x[3], x[4] = 0.0, 0.0
    x[4, 3] = 5.0
    x[5, 7], x[6, 9], x[7, 1] = np.nan, np.inf, -np.inf
    x = x.astype(BF16)
    values, scales = kpool_cupy.hadamard_quant_fp8(cupy.asarray(x), round_scale=round_scale)
    want_values, want_scales = reference.hadamard_quant_fp8(x, round_scale=round_scale)
    assert np.array_equal(cupy.asnumpy(values), want_values)
    assert cupy.asnumpy(scales).tobytes() == want_scales.tobytes()
    assert len(np.unique(want_values)) > 150  # the comparison covered many codes


def test_gpu_decode_steps_fill_the_cache_with_one_compress_bytes_and_replay_a_plan(monkeypatch):
    import cupy

    import kpool_cupy
    from kpool_cupy.backends import cupy_plans

    rng = np.random.default_rng(2)
    head_dim, kpool, requests, steps = 64, 4, 3, 6
    keys = rng.standard_normal((requests, steps * 2, head_dim)).astype(BF16)
    gates = (3 * rng.standard_normal((requests, steps * 2, head_dim))).astype(BF16)
    ape = cupy.asarray(rng.standard_normal((kpool, head_dim)).astype(np.float32))
    table = cupy.asarray(np.array([[4, 1], [0, 5], [2, 3]], np.int32))
    cache = cupy.zeros((6, 2, head_dim + 4), np.uint8)
    tail = cupy.zeros((requests, 2, kpool + 1, head_dim), BF16)
    slots = cupy.asarray(np.array([2, 0, 1], np.int32))
    closed = cupy.zeros((requests, 1), np.int32)
    cupy_plans.forget_all()
    replayed = []
    replay = cupy_plans.replay

    def counting_replay(*args):
        result = replay(*args)
        replayed.append(result is not cupy_plans.MISS)
        return result

    monkeypatch.setattr(cupy_plans, "replay", counting_replay)
    for step in range(steps):  # two tokens a request a step, every call validate=False with closed given
        positions = cupy.asarray(np.tile(np.arange(2 * step, 2 * step + 2, dtype=np.int32), (requests, 1)))
        k = cupy.asarray(keys[:, 2 * step : 2 * step + 2])
        gate = cupy.asarray(gates[:, 2 * step : 2 * step + 2])
        kpool_cupy.kpool_tail_update_fp8(
            tail, k, gate, ape, positions, slots, cache=cache, block_table=table, closed=closed, validate=False
        )
    assert len(cupy_plans._plans) == 1  # one signature, planned after its first call
    assert replayed == [False] + [True] * (steps - 1)  # and every later call went straight to its launch
    whole = cupy.zeros(cache.shape, np.uint8)
    offsets = cupy.asarray(np.arange(0, requests * steps * 2 + 1, steps * 2, dtype=np.int32))
    kpool_cupy.kpool_compress_fp8(
        cupy.asarray(keys.reshape(-1, head_dim)), cupy.asarray(gates.reshape(-1, head_dim)), ape, offsets,
        cupy.zeros(requests, np.int32), cache=whole, block_table=table,
    )  # fmt: skip
    assert cupy.asnumpy(whole).any()
    assert cupy.asnumpy(cache).tobytes() == cupy.asnumpy(whole).tobytes()


def test_gpu_scorer_takes_every_e4m3_byte_as_its_value():
    # The scorer's conversions as the device runs them (sm_90: cvt.rn.f16x2.e4m3x2, a key tile's once and a query
    # row's once a head tile; sm_89 and newer: e4m3 mma.sync; sm_80: from the bits): each logit one product with
    # 1.0, so exact on every path, for each of the 256 bytes at positions all over a lane's words, as a key and
    # as a query (NaN where the byte is one).
    import cupy
    from test_index_logits_fp8 import _every_byte_case

    import kpool_cupy

    for keys_vary in (True, False):
        case = _every_byte_case(128, keys_vary)
        want = reference.kpool_index_logits_fp8(*case.args, kpool=1)
        got = kpool_cupy.kpool_index_logits_fp8(*(cupy.asarray(a) for a in case.args), kpool=1)
        assert np.array_equal(cupy.asnumpy(got), want, equal_nan=True), keys_vary
