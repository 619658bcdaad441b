"""A NumPy-backed stand-in for the slice of CuPy kpool_cupy uses; kernels run on the CPU emulator.

Test double only (see ../README.md): arrays are NumPy arrays of a subclass
that answers ``.data.ptr`` and ``.device.id``; "device" time is wall time.
Kernel launches and copies go to streams (``cuda``: queued on a non-default
stream, recorded while it captures); array operations run at once, after the
current stream's queued work.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from . import cuda, lib, random  # noqa: F401

__version__ = "0.0+numpy-double"

float32, int32, int64, uint8 = np.float32, np.int32, np.int64, np.uint8

_allocated = 0  # bytes of every array the double made; never decreases


def _count(array: np.ndarray) -> None:
    global _allocated
    _allocated += array.nbytes


class _Pointer:
    device_id = 0  # the device its memory is on: the double's one device, as ndarray.device says

    def __init__(self, array: np.ndarray, offset: int = 0) -> None:
        self._array = array  # keeps the memory alive while the pointer is
        self._offset = offset

    @property
    def ptr(self) -> int:
        return int(np.ndarray.__array_interface__.__get__(self._array)["data"][0]) + self._offset

    def __add__(self, offset: int) -> _Pointer:
        return _Pointer(self._array, self._offset + int(offset))

    def copy_from_device_async(self, source: _Pointer, size: int, stream=None) -> None:
        target, origin = self.ptr, source.ptr

        def copy(keep=(self._array, source._array)) -> None:  # the arrays live until the copy ran
            ctypes.memmove(target, origin, size)

        cuda._enqueue(stream, copy)


def _plain(value):
    """``value`` with double arrays seen as plain NumPy arrays (lists and tuples followed)."""
    if isinstance(value, ndarray):
        return value.view(np.ndarray)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def _reads_memory(array: np.ndarray, key) -> bool:
    """Whether ``array[key]`` reads elements (a gather or a scalar) rather than making a view."""
    key = key if isinstance(key, tuple) else (key,)
    integers = 0
    for k in key:
        if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            integers += 1
        elif not (isinstance(k, slice) or k is Ellipsis or k is None):
            return True  # an index array, a list or a mask: a gather
    return integers >= array.ndim


class ndarray(np.ndarray):
    @property
    def data(self) -> _Pointer:  # type: ignore[override]
        return _Pointer(self)

    @property
    def device(self) -> cuda.Device:  # type: ignore[override]
        return cuda.Device(0)

    def get(self, stream=None, order="C", out=None, blocking=True) -> np.ndarray:
        if out is None:
            cuda._wait_for(stream)
            return np.array(self.view(np.ndarray), copy=True, order=order)
        if out.shape != self.shape or out.dtype != self.dtype:
            raise ValueError(f"Shape or dtype mismatch: {out.shape} {out.dtype} for {self.shape} {self.dtype}")
        source = self.view(np.ndarray)

        def copy() -> None:
            np.copyto(out, source)

        if blocking:
            cuda._wait_for(stream)
            copy()
        else:  # as cudaMemcpyAsync into pinned memory: done when the stream reaches it, not before
            cuda._enqueue(stream, copy)
        return out

    # Array operations run on the current stream, after its queued work.
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        cuda._before_array_op()
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = _plain(out)
        result = getattr(ufunc, method)(*_plain(inputs), **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        if isinstance(result, tuple):
            return tuple(_wrap(r) if isinstance(r, np.ndarray) else r for r in result)
        return _wrap(result) if isinstance(result, np.ndarray) else result

    def __array_function__(self, func, types, args, kwargs):
        cuda._before_array_op()
        return super().__array_function__(func, types, args, kwargs)

    def __getitem__(self, key):
        if _reads_memory(self, key):
            cuda._before_array_op()
        return super().__getitem__(key)

    def __setitem__(self, key, value) -> None:
        cuda._before_array_op()
        super().__setitem__(key, value)

    def fill(self, value) -> None:
        cuda._before_array_op()
        super().fill(value)

    def astype(self, dtype, *args, **kwargs):
        cuda._before_array_op()
        return _wrap(self.view(np.ndarray).astype(dtype, *args, **kwargs))

    def copy(self, order="C"):
        cuda._before_array_op()
        return _wrap(self.view(np.ndarray).copy(order=order))

    def item(self, *args):
        cuda._before_array_op()
        return super().item(*args)

    def tolist(self):
        cuda._before_array_op()
        return super().tolist()

    def __int__(self) -> int:
        cuda._before_array_op()
        return int(self.view(np.ndarray))

    def __float__(self) -> float:
        cuda._before_array_op()
        return float(self.view(np.ndarray))

    def __bool__(self) -> bool:
        cuda._before_array_op()
        return bool(self.view(np.ndarray))

    def __index__(self) -> int:
        cuda._before_array_op()
        return self.view(np.ndarray).__index__()


def _wrap(array, new: bool = True) -> ndarray:
    array = np.asarray(array)
    if new:
        _count(array)
    return array.view(ndarray)


def asarray(array, dtype=None) -> ndarray:
    if isinstance(array, ndarray) and (dtype is None or np.dtype(dtype) == array.dtype):
        return array
    return _wrap(np.array(_plain(array), dtype=dtype, copy=True))


def array(array, dtype=None, copy=True) -> ndarray:
    return _wrap(np.array(_plain(array), dtype=dtype, copy=copy))


def asnumpy(array, stream=None) -> np.ndarray:
    if isinstance(array, ndarray):
        return array.get(stream=stream)
    return np.array(array, copy=True)


def from_dlpack(array) -> ndarray:
    return array if isinstance(array, ndarray) else _wrap(np.from_dlpack(array), new=False)


def empty(shape, dtype=np.float64) -> ndarray:
    return _wrap(np.empty(shape, dtype=dtype))


def zeros(shape, dtype=np.float64) -> ndarray:
    return _wrap(np.zeros(shape, dtype=dtype))


def full(shape, value, dtype=None) -> ndarray:
    return _wrap(np.full(shape, value, dtype=dtype))


def arange(*args, **kwargs) -> ndarray:
    return _wrap(np.arange(*args, **kwargs))


def concatenate(arrays, axis=0) -> ndarray:
    cuda._before_array_op()
    return _wrap(np.concatenate([_plain(a) for a in arrays], axis=axis))


def ascontiguousarray(array) -> ndarray:
    cuda._before_array_op()
    return _wrap(np.ascontiguousarray(_plain(array)))


def broadcast_to(array, shape) -> ndarray:
    """A read-only view with stride 0 along the broadcast dims, as CuPy's (no new memory)."""
    return _wrap(np.broadcast_to(_plain(array), shape), new=False)


def where(condition, x, y) -> ndarray:
    cuda._before_array_op()
    return _wrap(np.where(_plain(condition), _plain(x), _plain(y)))


def _elementwise(function, *args) -> ndarray:
    cuda._before_array_op()
    return _wrap(function(*_plain(args)))


def exp(x) -> ndarray:
    return _elementwise(np.exp, x)


def abs(x) -> ndarray:
    return _elementwise(np.abs, x)


def maximum(x, y) -> ndarray:
    return _elementwise(np.maximum, x, y)


def isfinite(x) -> ndarray:
    return _elementwise(np.isfinite, x)


def isneginf(x) -> ndarray:
    return _elementwise(np.isneginf, x)


def matmul(x, y) -> ndarray:
    return _elementwise(np.matmul, x, y)


def sort(x, axis=-1) -> ndarray:
    return _elementwise(lambda a: np.sort(a, axis=axis), x)


def array_equal(x, y) -> bool:
    cuda._before_array_op()
    return bool(np.array_equal(_plain(x), _plain(y)))


inf = np.inf


def cumsum(x, out=None):
    return np.cumsum(x, out=out)


class _MemoryPool:
    def used_bytes(self) -> int:
        """Bytes of every array the double ever made: stricter than CuPy's pool, where a freed block returns."""
        return _allocated

    def free_all_blocks(self) -> None:
        pass


def get_default_memory_pool() -> _MemoryPool:
    return _MemoryPool()


# Where the double appends one line per kernel a process launches (its first
# launch only): the source file and the instance, as scripts/gpu_variants.py
# lists them. Unset: nothing is written.
LAUNCH_RECORD = "CUPY_DOUBLE_LAUNCH_RECORD"


def _source_of(code: str) -> str:
    """The kernels/ file a kernel text was expanded from (kernel_source opens with its ``#line 1``), or
    ``"inline"`` for a text that names none (the benchmark's empty kernel)."""
    first = code.split("\n", 1)[0]
    prefix = '#line 1 "kernels/'
    return first[len(prefix) : -1] if first.startswith(prefix) and first.endswith('"') else "inline"


def _record_launch(code: str, name: str) -> None:
    path = os.environ.get(LAUNCH_RECORD)
    if path:
        # One short line in append mode: lines of several processes do not mix.
        with open(path, "a") as handle:
            handle.write(f"{_source_of(code)}\t{name}\n")


# A function's dynamic shared memory limit until it is raised (48 KB: the double knows no static shared memory),
# and the most it can be raised to (227 KB, Hopper's opt-in limit).
DEFAULT_DYNAMIC_SHARED_BYTES = 48 * 1024
MAX_DYNAMIC_SHARED_BYTES = 227 * 1024


class RawKernel:
    """A loaded kernel: each call queues its launch on the emulator, each block with ``shared_mem`` bytes of
    dynamic shared memory. As CUDA does, a launch of more than ``max_dynamic_shared_size_bytes`` fails, and
    setting that attribute above the opt-in limit fails."""

    def __init__(self, code: str, name: str) -> None:
        self.code, self.name = code, name
        self._launched = False
        self._max_dynamic_shared = DEFAULT_DYNAMIC_SHARED_BYTES

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return self._max_dynamic_shared

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        if not 0 <= value <= MAX_DYNAMIC_SHARED_BYTES:
            raise RuntimeError(f"CUDA_ERROR_INVALID_VALUE: max_dynamic_shared_size_bytes {value} for {self.name}")
        self._max_dynamic_shared = int(value)

    def __call__(self, grid, block, args, shared_mem=0, stream=None) -> None:
        from kpool_cupy.emulator.launch import launch_code

        if shared_mem > self._max_dynamic_shared:
            raise RuntimeError(
                f"CUDA_ERROR_INVALID_VALUE: {self.name} launched with {shared_mem} bytes of dynamic shared memory, "
                f"its max_dynamic_shared_size_bytes is {self._max_dynamic_shared}"
            )
        if not self._launched:
            self._launched = True
            _record_launch(self.code, self.name)
        code, name, arguments, shared = self.code, self.name, tuple(args), int(shared_mem)

        def run() -> None:
            launch_code(code, name, int(grid[0]), int(block[0]), arguments, shared)

        cuda._enqueue(stream, run, name)


class RawModule:
    """Compiles nothing: get_function returns a launcher of the emulated kernel built from the same text."""

    def __init__(self, code: str, options=(), name_expressions=()) -> None:
        self.code = code

    def get_function(self, name: str) -> RawKernel:
        return RawKernel(self.code, name)
