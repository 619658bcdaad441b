"""Torch tensors as the package's arrays and back, without copies.

bfloat16 goes through an int16 view both ways: NumPy takes no bfloat16
tensor (``.numpy()`` refuses it, and its DLPack import refuses kDLBfloat) and
torch takes no ml_dtypes array; float8_e4m3fn through a uint8 view, the same
way. CuPy has no float8 dtype: an op reads e4m3fn values as their bytes
(``ops.framework.engine_forms``), so a float8 tensor reaches CuPy only where
an op takes no e4m3fn, and is refused there. A tensor that requires grad (an
``nn.Parameter`` ape) is read through ``.detach()``: the ops only read it.
Strides come along as they are, 0 and transposed ones too (``.numpy()`` and
torch's DLPack export keep them; the int16 view as well): an expanded
gradient reaches the backward op with no copy.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from ..dtypes import BFLOAT16, FLOAT8_E4M3FN

# Every torch dtype NumPy has, spelled out: a dtype conversion through a
# zero-size tensor would make a fake tensor under torch.compile's tracing.
_NUMPY_DTYPES = {
    torch.bool: np.dtype(np.bool_),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.uint16: np.dtype(np.uint16),
    torch.int32: np.dtype(np.int32),
    torch.uint32: np.dtype(np.uint32),
    torch.int64: np.dtype(np.int64),
    torch.uint64: np.dtype(np.uint64),
    torch.float16: np.dtype(np.float16),
    torch.bfloat16: BFLOAT16,
    torch.float8_e4m3fn: FLOAT8_E4M3FN,
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
}
# By name: torch 2.11's dynamo cannot hash a NumPy dtype (a dict keyed by them breaks the trace).
_TORCH_DTYPES = {numpy.name: dtype for dtype, numpy in _NUMPY_DTYPES.items()}
# The dtypes NumPy holds only as ml_dtypes', and the torch dtype of the same width each is viewed through.
_VIEWED = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8}


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The NumPy dtype of a torch dtype (bfloat16 as ml_dtypes'); a TypeError for one NumPy lacks."""
    if dtype not in _NUMPY_DTYPES:
        raise TypeError(f"no NumPy dtype for {dtype}")
    return _NUMPY_DTYPES[dtype]


def torch_dtype(dtype: np.dtype | str) -> torch.dtype:
    """The torch dtype of a NumPy dtype or its name."""
    if isinstance(dtype, str) and dtype in _TORCH_DTYPES:  # the specs' names, as dynamo traces them
        return _TORCH_DTYPES[dtype]
    return _TORCH_DTYPES[np.dtype(dtype).name]  # an alias ("f4", "long") or a dtype


def check_not_negated(name: str, tensor: torch.Tensor) -> None:
    """A tensor whose values are its memory's, negated lazily by torch (its negative bit: ``torch._neg_view``,
    the imaginary part of a conjugate): the kernels read memory, so it is refused (NumPy and DLPack refuse it
    too, with errors that name nothing)."""
    if tensor.is_neg():
        raise ValueError(
            f"Invalid {name}: expected a tensor whose memory holds its values, got one torch negates lazily "
            "(its negative bit is set: pass .resolve_neg())"
        )


def to_numpy(name: str, tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor's memory as a NumPy array (same bytes, same strides)."""
    check_not_negated(name, tensor)
    tensor = tensor.detach()
    if tensor.dtype in _VIEWED:
        return tensor.view(_VIEWED[tensor.dtype]).numpy().view(_NUMPY_DTYPES[tensor.dtype])
    try:
        return tensor.numpy()
    except TypeError:
        raise TypeError(f"Invalid {name}: expected a dtype the kernels read, got {tensor.dtype}") from None


def from_numpy(array: np.ndarray) -> torch.Tensor:
    """A NumPy array's memory as a CPU tensor."""
    # A byte-swapped array keeps torch.from_numpy's own refusal: its name alone would read the bytes swapped.
    dtype = _TORCH_DTYPES.get(array.dtype.name) if array.dtype.isnative else None
    if dtype in _VIEWED:
        return torch.from_numpy(array.view(_NUMPY_DTYPES[_VIEWED[dtype]])).view(dtype)
    return torch.from_numpy(array)


def to_cupy(name: str, tensor: torch.Tensor) -> Any:
    """A CUDA tensor's memory as a CuPy array (DLPack, on CuPy's current stream: call it inside torch's)."""
    import cupy

    check_not_negated(name, tensor)
    tensor = tensor.detach()
    if tensor.dtype == torch.float8_e4m3fn:  # an op that takes e4m3fn has read it as bytes already
        raise TypeError(f"Invalid {name}: expected a dtype the kernels read, got {tensor.dtype}")
    if tensor.dtype == torch.bfloat16:
        return cupy.from_dlpack(tensor.view(torch.int16)).view(BFLOAT16)
    return cupy.from_dlpack(tensor)


def from_cupy(array: Any) -> torch.Tensor:
    """A CuPy array's memory as a CUDA tensor."""
    if array.dtype == BFLOAT16:
        return torch.from_dlpack(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_dlpack(array)


class SymbolicMetadata:
    """A tensor's shape, byte strides and NumPy dtype as torch.compile traces them, sizes left symbolic:
    what the checks read of an array (they read no element), with no guard that fixes a size. int() on a
    symbolic size would compile the graph for that one size (a recompile per batch size)."""

    def __init__(self, tensor: torch.Tensor, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.shape = tuple(tensor.shape)
        self.strides = tuple(s * dtype.itemsize for s in tensor.stride())
        self.ndim = len(self.shape)
        self.size = tensor.numel()
        # A traced tensor has no address; the checks see address 0 (aligned), as they see the NumPy
        # metadata's one fresh element: alignment is the real call's to check.
        self.ctypes = SimpleNamespace(data=0)


def metadata(name: str, tensor: torch.Tensor) -> Any:
    """What the checks read of a tensor without reading an element (fake tensors have none): a NumPy array
    with its shape, dtype and strides over one element, or, where torch.compile traces symbolic sizes,
    ``SymbolicMetadata``. Never read or write it."""
    try:
        dtype = numpy_dtype(tensor.dtype)
    except TypeError:
        raise TypeError(f"Invalid {name}: expected a dtype the kernels read, got {tensor.dtype}") from None
    check_not_negated(name, tensor)
    if any(isinstance(n, torch.SymInt) for n in (*tensor.shape, *tensor.stride())):
        return SymbolicMetadata(tensor, dtype)
    strides = tuple(int(s) * dtype.itemsize for s in tensor.stride())
    shape = tuple(int(n) for n in tensor.shape)
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape, strides)
