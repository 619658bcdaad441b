"""NumPy's dtypes and torch's, both ways, as the torch ops convert them (kpool_cupy/torch/tensors.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kpool_cupy.torch.tensors import _NUMPY_DTYPES, from_numpy, torch_dtype  # noqa: E402  (after the skip)


@pytest.mark.parametrize("dtype", list(_NUMPY_DTYPES), ids=str)
def test_every_dtype_goes_there_and_back_by_dtype_and_by_name(dtype):
    numpy = _NUMPY_DTYPES[dtype]
    assert torch_dtype(numpy) is dtype and torch_dtype(numpy.name) is dtype
    assert from_numpy(np.zeros(2, numpy)).dtype is dtype


def test_aliases_name_their_dtype():
    # Looked up by name (torch 2.11's dynamo cannot hash a NumPy dtype); an alias still resolves through NumPy.
    assert [torch_dtype(a) for a in ("f4", "long", "<i4", "half")] == [
        torch.float32,
        torch.int64,
        torch.int32,
        torch.float16,
    ]


def test_a_byte_swapped_array_is_refused_not_read_swapped():
    # A review's finding: by its dtype's name alone, a big-endian bfloat16 array came out as other numbers.
    swapped = np.array([1.5, 2.0], ml_dtypes.bfloat16).byteswap()
    swapped = swapped.view(swapped.dtype.newbyteorder())
    assert swapped.astype(np.float32).tolist() == [1.5, 2.0]
    with pytest.raises(TypeError):
        from_numpy(swapped)
