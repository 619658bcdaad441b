"""Emulated kernel and NumPy reference against the independent float64 model."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from model import BF16, F16, F32, assert_close_to_model, make_batch, standard_lengths

from kpool_cupy import emulate, reference

BACKENDS = {"emulate": emulate.kpool_compress, "reference": reference.kpool_compress}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("dtype", [BF16, F16, F32], ids=["bf16", "f16", "f32"])
@pytest.mark.parametrize("kpool", [1, 2, 4, 8, 16, 64])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_matches_float64_model(backend, dtype, kpool, head_dim):
    # The grid of sizes the kernel is instantiated for: every path through
    # the unroll choices (kpool <= 8 fully unrolled, above streamed) and
    # several threads-per-pool counts.
    lengths, cache = standard_lengths(kpool)
    batch = make_batch(lengths, cache, head_dim=head_dim, kpool=kpool, dtype=dtype, seed=kpool + head_dim)
    got = BACKENDS[backend](*batch.args())
    assert got.dtype == dtype
    assert_close_to_model(got, batch.model(), dtype)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize(("dtype", "gate_dtype"), [(BF16, F32), (F16, BF16), (F32, F16)])
def test_mixed_gate_dtype(backend, dtype, gate_dtype):
    # k and gate may come from different projections with different dtypes.
    batch = make_batch(*standard_lengths(4), dtype=dtype, gate_dtype=gate_dtype, seed=11)
    got = BACKENDS[backend](*batch.args())
    assert got.dtype == dtype
    assert_close_to_model(got, batch.model(), dtype)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("dtype", [BF16, F16, F32], ids=["bf16", "f16", "f32"])
def test_kpool_one_is_identity_bit_for_bit(backend, dtype):
    # One member weighs exactly 1 whatever its logit, so the key comes back
    # unchanged; gate and ape are scaled large so a wrong weight would show.
    batch = make_batch([5, 0, 9], [0, 4, 7], kpool=1, dtype=dtype, gate_scale=1e4)
    batch.ape *= 1e3
    got = BACKENDS[backend](*batch.args())
    np.testing.assert_array_equal(got.view(np.uint8), batch.k.view(np.uint8))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("kpool", [2, 4, 8])
def test_every_phase_of_the_cache(backend, kpool):
    # A request whose cached prefix ends mid-pool skips the tokens that finish
    # that pool; every phase mod kpool must place the members right.
    cache = list(range(kpool)) + [kpool * 5 + p for p in range(kpool)]
    batch = make_batch([2 * kpool + 1] * len(cache), cache, kpool=kpool, seed=kpool)
    assert_close_to_model(BACKENDS[backend](*batch.args()), batch.model(), BF16)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_lengths_not_divisible_and_empty_requests(backend):
    # Trailing tokens of an unfinished pool contribute nothing; empty
    # requests own no rows (the upstream suite's 7, 5, 3, 1).
    batch = make_batch([7, 0, 5, 3, 0, 1, 0], [0, 2, 0, 0, 9, 0, 3])
    got = BACKENDS[backend](*batch.args())
    assert got.shape == (1 + 1, 128)
    assert_close_to_model(got, batch.model(), BF16)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize(
    ("cache", "cache_dtype"),
    [([2**32 - 7, 2**32 - 2], np.uint32), ([2**33 + 3, 2**40 + 1], np.int64), ([2**31 - 1, 2**31 - 6], np.int32)],
)
def test_very_large_cache_lengths(backend, cache, cache_dtype):
    # Absolute positions past 2^31 and 2^32: the phase arithmetic is 64-bit.
    batch = make_batch([13, 10], cache, cache_dtype=cache_dtype, seed=5)
    assert_close_to_model(BACKENDS[backend](*batch.args()), batch.model(), BF16)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_oversized_out_keeps_its_surplus_rows(backend):
    # Rows past total_pools belong to the caller: the kernel never writes them.
    batch = make_batch(*standard_lengths(4), seed=3)
    want = batch.model()
    sentinel = ml_dtypes.bfloat16(-7.0)
    out = np.full((want.shape[0] + 6, 128), sentinel, dtype=BF16)
    result = BACKENDS[backend](*batch.args(), out=out)
    assert result is out
    assert_close_to_model(out[: want.shape[0]], want, BF16)
    assert np.all(out[want.shape[0] :] == sentinel)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_strided_rows_without_copy(backend):
    # k and gate as column slices of one fused projection output, and every
    # other row of a larger buffer: rows at any stride, last dim contiguous.
    rng = np.random.default_rng(8)
    lengths, cache = standard_lengths(4)
    total = sum(lengths)
    fused = rng.standard_normal((total, 3 * 128)).astype(np.float32)
    fused[:, 128:256] *= 3.0
    fused = fused.astype(BF16)
    batch = make_batch(lengths, cache, seed=8)
    spaced = np.zeros((2 * total, 128), dtype=BF16)
    spaced[::2] = batch.gate
    batch.k, batch.gate = fused[:, :128], spaced[::2]
    assert not batch.k.flags.c_contiguous and not batch.gate.flags.c_contiguous
    assert_close_to_model(BACKENDS[backend](*batch.args()), batch.model(), BF16)


def _misaligned(array: np.ndarray) -> np.ndarray:
    """The same values at an address 8 bytes off 16-byte alignment (forces the scalar path)."""
    pad = 8 // array.itemsize
    holder = np.zeros((array.shape[0], array.shape[1] + pad), dtype=array.dtype)
    holder[:, pad:] = array
    view = holder[:, pad:]
    assert view.ctypes.data % 16 != 0
    return view


@pytest.mark.parametrize("operand", ["k", "gate", "ape", "out"])
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "f32"])
def test_scalar_and_vector_paths_agree_bit_for_bit(operand, dtype):
    # The scalar fallback of each operand runs the same arithmetic as its
    # 16-byte path, so the bits must match.
    batch = make_batch(*standard_lengths(4), dtype=dtype, seed=21)
    vector = emulate.kpool_compress(*batch.args())
    out = None
    if operand == "out":
        out = _misaligned(np.zeros_like(vector))
    else:
        setattr(batch, operand, _misaligned(getattr(batch, operand)))
    scalar = emulate.kpool_compress(*batch.args(), out=out)
    np.testing.assert_array_equal(scalar.view(np.uint8), vector.view(np.uint8))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("index_dtype", [np.int32, np.uint32, np.int64])
def test_explicit_pool_row_offsets_of_each_integer_type(backend, index_dtype):
    batch = make_batch(*standard_lengths(4), index_dtype=index_dtype, seed=4)
    from kpool_cupy import pool_row_offsets

    pools = pool_row_offsets(batch.input_row_offsets, batch.cache_lengths, 4).astype(index_dtype)
    got = BACKENDS[backend](*batch.args(), pool_row_offsets=pools)
    assert_close_to_model(got, batch.model(), BF16)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
def test_float32_out(backend, dtype):
    # A float32 out skips the final narrowing: the float32 tolerance applies.
    batch = make_batch(*standard_lengths(8), kpool=8, dtype=dtype, seed=6)
    want = batch.model()
    out = np.empty(want.shape, dtype=np.float32)
    BACKENDS[backend](*batch.args(), out=out)
    assert_close_to_model(out, want, F32)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_no_pools_returns_empty_without_launch(backend, monkeypatch):
    from kpool_cupy.backends.emulate import EmulateBackend
    from kpool_cupy.backends.reference import ReferenceBackend

    def no_launch(*args, **kwargs):
        raise AssertionError("launched a kernel for zero pools")

    monkeypatch.setattr(EmulateBackend, "launch", no_launch)
    monkeypatch.setattr(ReferenceBackend, "launch", no_launch)
    batch = make_batch([3, 2], [0, 1], kpool=4)
    got = BACKENDS[backend](*batch.args())
    assert got.shape == (0, 128) and got.dtype == BF16


def test_reference_float64_accumulation_is_closer():
    # accumulate="float64" is the model's arithmetic up to summation order.
    batch = make_batch(*standard_lengths(16), kpool=16, dtype=F32, seed=2)
    want = batch.model()
    got64 = reference.kpool_compress(*batch.args(), accumulate="float64")
    np.testing.assert_allclose(got64, want, rtol=2.0**-23, atol=1e-12)  # one float32 rounding of a float64 result


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "kpool"), [("bfloat16", 4), ("float32", 1), ("float32", 4), ("float32", 64)])
def test_the_bound_holds_when_exp2_and_the_reciprocal_err_as_much_as_the_gpus(monkeypatch, dtype, kpool):
    # The GPU's ex2.approx errs by up to 2 ulp and rcp.approx by 1 where the
    # emulator's are correctly rounded. Built with KP_APPROX_WORST_ULPS=2 the
    # emulator errs that much on purpose, and `kpool-cupy check`'s bound
    # (tools/accuracy.py) must still hold on every case; at 2^12 ulps it must
    # not, or the check could not see an approximation too coarse.
    from kpool_cupy.tools.self_check import run_check

    monkeypatch.setenv(emulate.FLAGS_VARIABLE, "-DKP_APPROX_WORST_ULPS=2")
    results = run_check("emulate", np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else F32, 128, kpool, 5)
    assert results and all(r.ok for r in results), [(r.name, r.worst_error_over_bound) for r in results]
    if kpool > 1:  # at kpool 1 every weight is exactly 1: exp2 is never used
        monkeypatch.setenv(emulate.FLAGS_VARIABLE, "-DKP_APPROX_WORST_ULPS=4096")
        coarse = run_check("emulate", F32, 128, kpool, 5)
        assert not all(r.ok for r in coarse), [(r.name, r.worst_error_over_bound) for r in coarse]
