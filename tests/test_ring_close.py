"""kpool_ring_close: which request closes which pool, named in the caller's own arrays."""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16
from test_hostile_inputs import _rows

from kpool_cupy import emulate, reference

BACKENDS = {"emulate": emulate, "reference": reference}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_ring_close_names_the_request_in_the_callers_array(backend):
    # Finding 5: the index counted only the requests that close a pool.
    k = _rows(8)
    tail = np.zeros((2, 2, 4, 16), BF16)
    ape = np.zeros((4, 16), np.float32)
    lengths = np.array([4, 2**40 + 1], np.int64)  # request 0 closes nothing, request 1's pool id is too big
    with pytest.raises(ValueError, match=r"^Invalid cache_lengths: .* got 1099511627777 at index 1$"):
        BACKENDS[backend].kpool_ring_close(
            tail, k, k, ape, np.array([0, 4, 8], np.int32), lengths, np.array([0, 1], np.int32)
        )
