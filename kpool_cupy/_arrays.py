"""Small facts about array objects that hold for NumPy and CuPy alike, without importing CuPy."""

from __future__ import annotations

import types
from typing import Any

import numpy as np


def is_cupy_array(array: Any) -> bool:
    return type(array).__module__.split(".")[0] == "cupy"


def array_module(array: Any) -> types.ModuleType:
    """``cupy`` for CuPy arrays, ``numpy`` otherwise."""
    if is_cupy_array(array):
        import cupy

        return cupy
    return np


class HostArrays:
    """Where the CPU backends keep arrays: NumPy, so a "host copy" is the array itself."""

    def host_copies(self, arrays: list[Any]) -> list[np.ndarray]:
        return [np.asarray(a) for a in arrays]

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return array

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.empty(shape, dtype=dtype)


def data_pointer(array: Any) -> int:
    """Address of the first element of a NumPy or CuPy array (views included)."""
    if is_cupy_array(array):
        return int(array.data.ptr)
    return int(array.ctypes.data)


def allows_vector_access(array: Any) -> bool:
    """Whether 16-byte loads and stores are legal on every row of ``array``.

    The kernel reaches 8 channels at a time from a row start, and 8 channels
    are 16 or 32 bytes, so the base address and the row stride decide it.
    """
    rows_aligned = array.shape[0] <= 1 or array.strides[0] % 16 == 0
    return rows_aligned and data_pointer(array) % 16 == 0
