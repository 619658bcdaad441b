"""The pool-to-request mapping."""

from __future__ import annotations

import numpy as np
import pytest

from kpool_cupy import pool_row_offsets, reference


def brute_force(offsets, cache, kpool):
    counts = []
    for b in range(len(cache)):
        n = offsets[b + 1] - offsets[b]
        positions = range(cache[b], cache[b] + n)
        # A pool counts when all its kpool positions arrive in this call.
        pools = {p // kpool for p in positions}
        counts.append(sum(1 for q in pools if all(q * kpool + m in positions for m in range(kpool))))
    return np.concatenate([[0], np.cumsum(counts)])


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int64])
@pytest.mark.parametrize("kpool", [1, 3, 4, 16])
def test_matches_brute_force(dtype, kpool):
    rng = np.random.default_rng(kpool)
    lengths = rng.integers(0, 5 * kpool, 40)
    cache = rng.integers(0, 6 * kpool, 40)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(dtype)
    got = pool_row_offsets(offsets, cache.astype(dtype), kpool)
    assert isinstance(got, np.ndarray) and got.dtype == np.int64
    np.testing.assert_array_equal(got, brute_force(offsets.tolist(), cache.tolist(), kpool))


def test_upstream_case_every_phase():
    # Lengths 9,9,9,9 with cache lengths 0,1,2,3 and kpool 4: positions 0..8
    # complete pools 0 and 1; 1..9 only pool 1; 2..10 only pool 1; 3..11
    # pools 1 and 2.
    got = pool_row_offsets(np.array([0, 9, 18, 27, 36], np.int32), np.array([0, 1, 2, 3], np.int32), 4)
    np.testing.assert_array_equal(got, [0, 2, 3, 4, 6])


@pytest.mark.parametrize(("kpool", "error"), [(0, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError)])
def test_bad_kpool(kpool, error):
    with pytest.raises(error, match=r"^Invalid kpool"):
        pool_row_offsets(np.array([0, 4], np.int32), np.array([0], np.int32), kpool)


def test_index_dtypes_are_the_kernels():
    # int16 and uint64 offsets are refused here as everywhere else.
    with pytest.raises(TypeError, match=r"^Invalid input_row_offsets"):
        pool_row_offsets(np.array([0, 4], np.int16), np.array([0], np.int32), 4)
    with pytest.raises(TypeError, match=r"^Invalid cache_lengths"):
        pool_row_offsets(np.array([0, 4], np.int32), np.array([0], np.uint64), 4)


def test_length_mismatch_names_cache_lengths():
    with pytest.raises(ValueError, match="cache_lengths"):
        pool_row_offsets(np.array([0, 4, 8], np.int32), np.array([0], np.int32), 4)


def test_empty_offsets_name_input_row_offsets_as_every_op_does():
    # It said "Invalid cache_lengths: expected length -1 (len(input_row_offsets) - 1), got length 0".
    wanted = r"^Invalid input_row_offsets: expected length batch \+ 1 >= 1, got length 0$"
    with pytest.raises(ValueError, match=wanted):
        pool_row_offsets(np.zeros(0, np.int32), np.zeros(0, np.int32), 4)
    with pytest.raises(ValueError, match=wanted):  # an op's own words
        keys, none = np.zeros((0, 8), np.float32), np.zeros(0, np.int32)
        reference.kpool_compress(keys, keys, np.zeros((4, 8), np.float32), none, none)
