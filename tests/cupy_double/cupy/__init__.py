"""A NumPy-backed stand-in for the slice of CuPy kpool_cupy uses; kernels run on the CPU emulator.

Test double only (see ../README.md): arrays are NumPy arrays of a subclass
that answers ``.data.ptr`` and ``.device.id``; "device" time is wall time.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import cuda, random  # noqa: F401

__version__ = "0.0+numpy-double"

float32, int32, int64, uint8 = np.float32, np.int32, np.int64, np.uint8


class _Pointer:
    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    @property
    def ptr(self) -> int:
        return int(np.ndarray.__array_interface__.__get__(self._array)["data"][0])

    def copy_from_device_async(self, source: _Pointer, size: int, stream=None) -> None:
        ctypes.memmove(self.ptr, source.ptr, size)


class ndarray(np.ndarray):
    @property
    def data(self) -> _Pointer:  # type: ignore[override]
        return _Pointer(self)

    @property
    def device(self) -> cuda.Device:  # type: ignore[override]
        return cuda.Device(0)

    def get(self, stream=None) -> np.ndarray:
        return np.array(self, copy=True).view(np.ndarray)


def _wrap(array) -> ndarray:
    return np.asarray(array).view(ndarray)


def asarray(array, dtype=None) -> ndarray:
    if isinstance(array, ndarray) and dtype is None:
        return array
    return _wrap(np.asarray(array, dtype=dtype))


def array(array, dtype=None, copy=True) -> ndarray:
    return _wrap(np.array(array, dtype=dtype, copy=copy))


def asnumpy(array) -> np.ndarray:
    return np.array(array, copy=True).view(np.ndarray)


def from_dlpack(array) -> ndarray:
    return array if isinstance(array, ndarray) else _wrap(np.from_dlpack(array))


def empty(shape, dtype=np.float64) -> ndarray:
    return _wrap(np.empty(shape, dtype=dtype))


def zeros(shape, dtype=np.float64) -> ndarray:
    return _wrap(np.zeros(shape, dtype=dtype))


def full(shape, value, dtype=None) -> ndarray:
    return _wrap(np.full(shape, value, dtype=dtype))


def arange(*args, **kwargs) -> ndarray:
    return _wrap(np.arange(*args, **kwargs))


def concatenate(arrays, axis=0) -> ndarray:
    return _wrap(np.concatenate([np.asarray(a) for a in arrays], axis=axis))


def ascontiguousarray(array) -> ndarray:
    return _wrap(np.ascontiguousarray(array))


def where(condition, x, y) -> ndarray:
    return _wrap(np.where(condition, x, y))


def exp(x) -> ndarray:
    return _wrap(np.exp(x))


def abs(x) -> ndarray:
    return _wrap(np.abs(x))


def maximum(x, y) -> ndarray:
    return _wrap(np.maximum(x, y))


def cumsum(x, out=None):
    return np.cumsum(x, out=out)


class _MemoryPool:
    def used_bytes(self) -> int:
        return 0


def get_default_memory_pool() -> _MemoryPool:
    return _MemoryPool()


class RawModule:
    """Compiles nothing: get_function returns a launcher of the emulated kernel built from the same text."""

    def __init__(self, code: str, options=(), name_expressions=()) -> None:
        self.code = code

    def get_function(self, name: str):
        code = self.code

        def launch(grid, block, args, shared_mem=0) -> None:
            from kpool_cupy.emulator.launch import launch_code

            def run() -> None:
                launch_code(code, name, int(grid[0]), int(block[0]), args)

            cuda._launch(run)

        return launch
