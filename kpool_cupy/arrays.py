"""What kind of array object an argument is, before anything reads its dtype or shape."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np


class CudaArrayInterface(Protocol):
    """An array that describes its device memory with CUDA's array interface (CuPy, Numba, PyTorch)."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...


class DLPackArray(Protocol):
    """An array that exports itself through DLPack (CuPy, PyTorch, JAX)."""

    def __dlpack__(self, *, stream: Any = None) -> Any: ...
    def __dlpack_device__(self) -> Any: ...


# What the GPU path takes as an array; it returns CuPy arrays. At run time
# CuPy may be missing, so CupyArray is Any there; a type checker sees cupy.ndarray.
# NumPy arrays export DLPack too, so a checker lets one through where the GPU
# path refuses it at run time (a TypeError naming the argument).
DeviceArray = CudaArrayInterface | DLPackArray
if TYPE_CHECKING:
    from cupy import ndarray as CupyArray
else:
    CupyArray = Any

# What the ops' defs (kpool_cupy/functions.py) take and return. One def serves
# every backend, so its array parameters take what any of them might
# (NumPy, CuPy and torch arrays all export DLPack) and what it returns is the
# array type of the module it is called through: cupy.ndarray from
# kpool_cupy, numpy.ndarray from .emulate and .reference, torch.Tensor from
# kpool_cupy.torch; to a type checker, Any. Each bound copy's
# inspect.signature names its backend's own types.
Array = DeviceArray
Result = Any


def is_cupy_array(array: Any) -> bool:
    """Whether ``array`` is a CuPy array, told without importing CuPy."""
    return type(array).__module__.split(".")[0] == "cupy"


def check_array_kind(name: str, array: Any) -> None:
    """A NumPy or CuPy array, or a TypeError naming ``name``.

    NumPy subclasses that change what the elements mean are refused: a masked
    array's mask and a matrix's 2-D-only rules would be ignored by a kernel
    reading the bare buffer. Memory maps and other plain views are arrays.
    """
    if isinstance(array, (np.ma.MaskedArray, np.matrix)):
        raise TypeError(
            f"Invalid {name}: expected a plain array, got {type(array).__module__}.{type(array).__name__} "
            "(pass .data of a masked array after handling its mask, or np.asarray of a matrix)"
        )
    if isinstance(array, np.ndarray) or is_cupy_array(array):
        return
    raise TypeError(
        f"Invalid {name}: expected a NumPy or CuPy array, got {type(array).__module__}.{type(array).__name__} "
        "(other frameworks' arrays convert without a copy through numpy.from_dlpack or cupy.from_dlpack)"
    )
