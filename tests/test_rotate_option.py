"""``rotate=True`` on kpool_compress, kpool_ring_close and kpool_tail_update (issue 12): the pools' rotation.

The output is y = bf16(B(bf16(pooled)) * fl32(1/sqrt(D))) rounded to the
output dtype, bit for bit the reference rotation (backends/
reference_epilogue.py) of the op's own float32 pool, on each backend.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from model import BF16, F16, F32, make_batch, standard_lengths

from kpool_cupy import emulate, reference
from kpool_cupy.backends import reference_epilogue as epilogue
from kpool_cupy.emulator.launch import recording

MODULES = [emulate, reference]


def _rotated(pooled: np.ndarray, dtype) -> np.ndarray:
    x = pooled.reshape(-1, pooled.shape[-1]).astype(ml_dtypes.bfloat16).astype(np.float32)
    return epilogue.rotate(x, ml_dtypes.bfloat16).astype(dtype).reshape(pooled.shape)


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("out_dtype", [BF16, F16, F32], ids=["bf16", "f16", "f32"])
@pytest.mark.parametrize("module", MODULES, ids=["emulate", "reference"])
def test_compress_rotates_its_own_pools(module, out_dtype):
    batch = make_batch(*standard_lengths(4), head_dim=128, kpool=4, seed=1)
    pooled = module.kpool_compress(*batch.args(), out_dtype="float32")
    _same_bits(module.kpool_compress(*batch.args(), rotate=True, out_dtype=out_dtype), _rotated(pooled, out_dtype))


@pytest.mark.parametrize("module", MODULES, ids=["emulate", "reference"])
def test_ring_close_and_tail_update_rotate_their_pools(module):
    rng = np.random.default_rng(2)
    head_dim, kpool = 64, 4
    k = rng.standard_normal((20, head_dim)).astype(BF16)
    ape = rng.standard_normal((kpool, head_dim)).astype(np.float32)
    tail = rng.standard_normal((3, 2, kpool + 1, head_dim)).astype(BF16)
    offsets, cached, slots = np.array([0, 7, 9, 20], np.int32), np.array([1, 0, 6], np.int32), np.arange(3)
    args = (tail, k, k, ape, offsets, cached, slots.astype(np.int32))
    pooled, closed = module.kpool_ring_close(*args, out_dtype="float32")
    rotated, closed_rotated = module.kpool_ring_close(*args, rotate=True)
    assert np.array_equal(closed, closed_rotated)
    shut = closed >= 0
    _same_bits(rotated[shut], _rotated(pooled[shut], BF16))

    step = rng.standard_normal((3, 5, head_dim)).astype(BF16)
    positions = np.array([[1, 2, 3, 4, 5], [4, 5, 6, 7, -1], [9, 10, 11, 12, 13]], np.int32)
    plain_ring, rotating_ring = tail.copy(), tail.copy()
    pooled, closed = module.kpool_tail_update(plain_ring, step, step, ape, positions, slots, out_dtype="float32")
    rotated, closed_rotated = module.kpool_tail_update(rotating_ring, step, step, ape, positions, slots, rotate=True)
    assert np.array_equal(closed, closed_rotated) and (closed >= 0).sum() == 3
    assert np.array_equal(plain_ring, rotating_ring)  # the ring keeps raw values either way
    shut = closed >= 0
    _same_bits(rotated[shut], _rotated(pooled[shut], BF16))


@pytest.mark.parametrize("module", MODULES, ids=["emulate", "reference"])
def test_rotating_twice_gives_the_keys_back_to_bf16_rounding(module):
    # kpool 1 and a zero ape weigh each member 1: the pool is the key itself.
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((9, 32)).astype(BF16)
    args = (np.zeros((1, 32), np.float32), np.array([0, 9], np.int32), np.zeros(1, np.int32))
    once = module.kpool_compress(keys, keys, *args, rotate=True)
    twice = module.kpool_compress(once, once, *args, rotate=True, out_dtype="float32")
    # Two bf16 roundings of each y (relative error 2^-9 each) carried through
    # an orthonormal rotation: the error's norm stays within 2 * 2^-9 of the
    # row's norm, and float32's own roundings are far below that.
    error = np.linalg.norm(twice - keys.astype(np.float32), axis=1)
    assert (error <= 2 * 2.0**-9 * np.linalg.norm(keys.astype(np.float32), axis=1)).all(), error
    assert not np.array_equal(once.astype(np.float32), keys.astype(np.float32))  # the first rotation changed them
    # kpool 1 pools exactly on both backends: the same bits.
    other = reference if module is emulate else emulate
    once_other = other.kpool_compress(keys, keys, *args, rotate=True)
    twice_other = other.kpool_compress(once_other, once_other, *args, rotate=True, out_dtype="float32")
    assert twice.tobytes() == twice_other.tobytes()


@pytest.mark.parametrize("module", MODULES, ids=["emulate", "reference"])
def test_rotate_needs_a_power_of_two_head_dim(module):
    batch = make_batch([9], [0], head_dim=24, kpool=4)
    module.kpool_compress(*batch.args())  # the plain op takes 24
    with pytest.raises(ValueError, match=r"^Invalid k: expected head_dim a power of two from 8 to 256"):
        module.kpool_compress(*batch.args(), rotate=True)


def test_only_rotating_launches_run_as_cooperating_threads():
    # The plain kernels keep the emulator's one-thread-after-another loop.
    batch = make_batch([9, 6], [0, 3], head_dim=64, kpool=4)
    with recording() as launches:
        emulate.kpool_compress(*batch.args())
        emulate.kpool_compress(*batch.args(), rotate=True)
    assert [launch.cooperative for launch in launches] == [False, True]
