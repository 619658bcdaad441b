"""kpool_tail_update_fp8: the decode step's pools through the FP8 epilogue."""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16
from test_fp8_lifecycle import HEAD_DIM, KPOOL

from kpool_cupy import emulate, reference
from kpool_cupy.backends import reference_epilogue as epilogue


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_tail_update_rows_are_the_epilogue_of_tail_update(module):
    rng = np.random.default_rng(6)
    tail = rng.standard_normal((3, 2, KPOOL + 2, HEAD_DIM)).astype(BF16)
    k = rng.standard_normal((3, 6, HEAD_DIM)).astype(BF16)
    gate = (3 * rng.standard_normal((3, 6, HEAD_DIM))).astype(BF16)
    ape = rng.standard_normal((KPOOL, HEAD_DIM)).astype(np.float32)
    positions = np.array([[2, 3, 4, 5, 6, 7], [8, 9, 10, -1, -1, -1], [0, 1, 2, 3, 4, 5]], np.int32)
    slots = np.array([2, 0, 1], np.int32)
    plain_tail = tail.copy()
    pooled, closed = module.kpool_tail_update(plain_tail, k, gate, ape, positions, slots, out_dtype="float32")
    values, scales, closed_fp8 = module.kpool_tail_update_fp8(tail, k, gate, ape, positions, slots)
    assert np.array_equal(tail, plain_tail)  # the same ring writes
    assert np.array_equal(closed, closed_fp8) and (closed >= 0).sum() == 3  # pools 0, 1 of request 0; 0 of 2
    want_values, want_scales = epilogue.epilogue(pooled.reshape(-1, HEAD_DIM), True)
    shut = (closed >= 0).reshape(-1)
    assert np.array_equal(values.reshape(-1, HEAD_DIM)[shut], want_values[shut])
    assert scales.reshape(-1)[shut].tobytes() == want_scales[shut].tobytes()
    assert not values.reshape(-1, HEAD_DIM)[~shut].any()
