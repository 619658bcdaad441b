"""kpool_ring_close_fp8: ring close's pools through the FP8 epilogue, into rows or a cache through slots."""

from __future__ import annotations

import numpy as np
import pytest
from test_compress_fp8 import _scatter
from test_fp8_lifecycle import BLOCK_SIZE, HEAD_DIM, _ring_call

from kpool_cupy import emulate, reference
from kpool_cupy.backends import reference_epilogue as epilogue


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_ring_close_rows_and_slots_are_the_epilogue_of_ring_close(module):
    args = _ring_call(np.random.default_rng(4))
    pooled, closed = module.kpool_ring_close(*args, out_dtype="float32")
    values, scales, closed_fp8 = module.kpool_ring_close_fp8(*args)
    assert np.array_equal(closed, closed_fp8) and (closed >= 0).sum() == 3  # request 1 closes nothing
    want_values, want_scales = epilogue.epilogue(pooled, True)
    shut = closed >= 0
    assert np.array_equal(values[shut], want_values[shut]) and scales[shut].tobytes() == want_scales[shut].tobytes()
    assert not values[~shut].any() and not scales[~shut].any()  # rows of requests that close nothing: left zero
    # Into a cache through slots, -1 skipping one request: its entry stays as it was.
    cache = np.random.default_rng(1).integers(0, 256, (3, BLOCK_SIZE, HEAD_DIM + 4), dtype=np.uint8)
    written = cache.copy()
    slots = np.array([7, 0, -1, 2], np.int64)
    got = module.kpool_ring_close_fp8(*args, cache=written, slots=slots)
    assert np.array_equal(got, closed)
    # The whole cache: each closing request's entry at its slot, every other byte as it was.
    assert np.array_equal(written, _scatter(values, scales, cache, np.where(shut, slots, -1)))
