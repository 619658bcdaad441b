"""out_dtype and out= of any float dtype: one rounding from the float32 result, whatever k's dtype.

Megatron rounds pooled keys to bfloat16 even from float32 inputs; an engine
may keep float16 keys beside bfloat16 ones. Every pairing of k's dtype and
the output's must give exactly the float32 result rounded once.
"""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16, F16, F32, make_batch, standard_lengths

from kpool_cupy import emulate, reference

DTYPES = [BF16, F16, F32]
IDS = ["bf16", "f16", "f32"]


def _rounded_once(values: np.ndarray, dtype: np.dtype) -> bytes:
    return values.astype(np.float32).astype(dtype).tobytes()


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
@pytest.mark.parametrize("out_dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("k_dtype", DTYPES, ids=IDS)
def test_compress_rounds_once_to_any_output_dtype(module, k_dtype, out_dtype):
    batch = make_batch(*standard_lengths(4), dtype=k_dtype, seed=21)
    exact = module.kpool_compress(*batch.args(), out_dtype="float32")
    got = module.kpool_compress(*batch.args(), out_dtype=out_dtype)
    assert got.dtype == out_dtype and got.tobytes() == _rounded_once(exact, out_dtype)
    # The same through out= of that dtype, with out_dtype left out or given.
    out = np.zeros_like(got)
    module.kpool_compress(*batch.args(), out=out)
    assert out.tobytes() == got.tobytes()
    again = np.zeros_like(got)
    module.kpool_compress(*batch.args(), out=again, out_dtype=np.dtype(out_dtype))
    assert again.tobytes() == got.tobytes()


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
@pytest.mark.parametrize("out_dtype", DTYPES, ids=IDS)
def test_ring_close_and_tail_update_round_once_to_any_output_dtype(module, out_dtype):
    rng = np.random.default_rng(3)
    kpool, head_dim = 4, 16
    k = rng.standard_normal((6, head_dim)).astype(F32)
    gate = rng.standard_normal((6, head_dim)).astype(F32)
    ape = rng.standard_normal((kpool, head_dim)).astype(np.float32)
    tail = rng.standard_normal((2, 2, kpool, head_dim)).astype(F32)
    offsets, cache, slots = np.array([0, 3, 6], np.int32), np.array([2, 5], np.int32), np.array([0, 1], np.int32)
    exact, closed = module.kpool_ring_close(tail, k, gate, ape, offsets, cache, slots, out_dtype="float32")
    got, closed_again = module.kpool_ring_close(tail, k, gate, ape, offsets, cache, slots, out_dtype=out_dtype)
    assert (closed >= 0).all() and np.array_equal(closed, closed_again)
    assert got.dtype == out_dtype and got.tobytes() == _rounded_once(exact, out_dtype)

    step_k = rng.standard_normal((2, 4, head_dim)).astype(F32)
    step_gate = rng.standard_normal((2, 4, head_dim)).astype(F32)
    positions = np.array([[4, 5, 6, 7], [8, 9, 10, 11]], np.int32)
    ring = tail.copy()
    exact, closed = module.kpool_tail_update(ring, step_k, step_gate, ape, positions, slots, out_dtype="float32")
    ring = tail.copy()
    got, _ = module.kpool_tail_update(ring, step_k, step_gate, ape, positions, slots, out_dtype=out_dtype)
    assert (closed >= 0).all()
    assert got.dtype == out_dtype and got.tobytes() == _rounded_once(exact, out_dtype)


def test_out_dtype_and_a_different_out_are_refused_naming_both():
    batch = make_batch(*standard_lengths(4), seed=2)
    pools = emulate.kpool_compress(*batch.args()).shape[0]
    with pytest.raises(TypeError, match=r"Invalid out: expected dtype float16 \(out_dtype\), got float32"):
        emulate.kpool_compress(*batch.args(), out=np.zeros((pools, 128), F32), out_dtype="float16")
    with pytest.raises(TypeError, match="Invalid out_dtype: expected one of bfloat16, float16, float32"):
        reference.kpool_compress(*batch.args(), out_dtype="int8")


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_a_scalar_is_not_a_dtype(module):
    batch = make_batch(*standard_lengths(4), seed=2)
    with pytest.raises(TypeError, match="Invalid out_dtype"):
        module.kpool_compress(*batch.args(), out_dtype=np.float16(1.0))


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_a_refused_dtype_reads_the_same_however_numpy_spells_it(module):
    # helper-58's nit: np.int8 read "<class 'numpy.int8'>", np.dtype("int8") "dtype('int8')"; both read int8 now,
    # for compress's out_dtype and the query quantizer's.
    batch = make_batch(*standard_lengths(4), seed=2)
    for spelling in (np.int8, np.dtype("int8")):
        with pytest.raises(TypeError, match=r"^Invalid out_dtype: expected one of .*float32, got int8$"):
            module.kpool_compress(*batch.args(), out_dtype=spelling)
        with pytest.raises(TypeError, match=r"^Invalid out_dtype: expected uint8 or float8_e4m3fn .*, got int8$"):
            module.hadamard_quant_fp8(np.zeros((2, 128), F32), out_dtype=spelling)
