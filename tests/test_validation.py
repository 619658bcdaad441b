"""The shared validator: one bad call, the same error type and argument name on every host backend.

(The full contract table is issue 4's; these pin the rules issue 2 states.)
"""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16, make_batch

from kpool_cupy import emulate, reference

BACKENDS = {"emulate": emulate.kpool_compress, "reference": reference.kpool_compress}


def good():
    batch = make_batch([9, 6], [0, 3], seed=1)
    return dict(
        k=batch.k,
        gate=batch.gate,
        ape=batch.ape,
        input_row_offsets=batch.input_row_offsets,
        cache_lengths=batch.cache_lengths,
    )


def _k_3d(a):
    a["k"] = a["k"][None]


def _gate_shape(a):
    a["gate"] = a["gate"][:-1]


def _head_dim_zero(a):
    a["k"] = a["k"][:, :0]


def _head_dim_odd(a):
    a["k"], a["gate"], a["ape"] = a["k"][:, :12], a["gate"][:, :12], a["ape"][:, :12]


def _kpool_zero(a):
    a["ape"] = a["ape"][:0]


def _int_k(a):
    a["k"] = a["k"].astype(np.int16)


def _f16_ape(a):
    a["ape"] = a["ape"].astype(np.float16)


def _float_offsets(a):
    a["input_row_offsets"] = a["input_row_offsets"].astype(np.float32)


def _noncontiguous_k(a):
    a["k"] = np.asfortranarray(a["k"])


def _offsets_not_from_zero(a):
    a["input_row_offsets"] = a["input_row_offsets"] + 1


def _offsets_decreasing(a):
    a["input_row_offsets"] = np.array([0, 10, 9, 15], np.int32)
    a["cache_lengths"] = np.zeros(3, np.int32)


def _offsets_short_of_tokens(a):
    a["input_row_offsets"] = np.array([0, 9, 14], np.int32)


def _offsets_wrong_length(a):
    a["cache_lengths"] = np.zeros(3, np.int32)


def _negative_cache(a):
    a["cache_lengths"] = np.array([0, -1], np.int32)


def _pool_offsets_wrong(a):
    a["pool_row_offsets"] = np.array([0, 2, 5], np.int64)


def _out_too_short(a):
    a["out"] = np.empty((1, 128), BF16)


def _out_too_narrow(a):
    a["out"] = np.empty((4, 64), BF16)


def _out_wrong_dtype(a):
    a["out"] = np.empty((4, 128), np.float16)


def _device_array(a):
    class FakeDeviceArray:  # anything that is not a NumPy array
        shape, dtype, strides, ndim = (15, 128), BF16, (256, 2), 2

    a["k"] = FakeDeviceArray()


CASES = [
    (_k_3d, ValueError, "k"),
    (_gate_shape, ValueError, "gate"),
    (_head_dim_zero, ValueError, "k"),
    (_head_dim_odd, ValueError, "k"),
    (_kpool_zero, ValueError, "ape"),
    (_int_k, TypeError, "k"),
    (_f16_ape, TypeError, "ape"),
    (_float_offsets, TypeError, "input_row_offsets"),
    (_noncontiguous_k, ValueError, "k"),
    (_offsets_not_from_zero, ValueError, "input_row_offsets"),
    (_offsets_decreasing, ValueError, "input_row_offsets"),
    (_offsets_short_of_tokens, ValueError, "input_row_offsets"),
    (_offsets_wrong_length, ValueError, "cache_lengths"),
    (_negative_cache, ValueError, "cache_lengths"),
    (_pool_offsets_wrong, ValueError, "pool_row_offsets"),
    (_out_too_short, ValueError, "out"),
    (_out_too_narrow, ValueError, "out"),
    (_out_wrong_dtype, TypeError, "out"),
    (_device_array, TypeError, "k"),
]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize(("mutate", "error", "name"), CASES, ids=[c[0].__name__.strip("_") for c in CASES])
def test_bad_call_names_the_argument(backend, mutate, error, name):
    args = good()
    mutate(args)
    with pytest.raises(error, match=rf"^Invalid {name}: expected .+, got .+"):
        BACKENDS[backend](**args)


def test_good_call_passes():
    # The control for the table above: the unmutated call is accepted.
    for run in BACKENDS.values():
        assert run(**good()).shape == (2 + 1, 128)  # positions 0..8 and 3..8
