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


def is_torch_tensor(array: Any) -> bool:
    """Whether ``array`` is a torch tensor (or a subclass from torch, a Parameter), told without importing torch."""
    return type(array).__module__.split(".")[0] == "torch"


# DLPack's device types (dlpack.h's DLDeviceType): memory a CUDA kernel may touch (kDLCUDA, kDLCUDAManaged),
# and host memory the CPU backends could read once NumPy views it (kDLCPU, kDLCUDAHost).
DLPACK_CUDA_DEVICES = (2, 13)
DLPACK_HOST_DEVICES = (1, 3)


def array_home(array: Any) -> str:
    """Which door of the package an array goes through, told without importing its framework or touching a
    device: ``"torch"`` (kpool_cupy.torch takes CPU and CUDA tensors), ``"device"`` (CuPy or another
    framework's CUDA array: the GPU functions of kpool_cupy), ``"host"`` (NumPy, or another framework's host
    array, which the CPU backends take once ``numpy.asarray`` makes it NumPy's) or ``""`` (none the package
    knows: a list, a scalar, a ROCm array)."""
    if is_torch_tensor(array):
        return "torch"
    if isinstance(array, np.ndarray):
        return "host"
    if is_cupy_array(array) or hasattr(array, "__cuda_array_interface__"):
        return "device"
    if hasattr(array, "__dlpack_device__") and hasattr(array, "__dlpack__"):
        device_type = int(array.__dlpack_device__()[0])
        if device_type in DLPACK_CUDA_DEVICES:
            return "device"
        if device_type in DLPACK_HOST_DEVICES:
            return "host"
    return ""


def check_array_kind(name: str, array: Any, torch_op: str | None = None) -> None:
    """A NumPy or CuPy array, or a TypeError naming ``name`` (and ``torch_op``, where a torch tensor goes).

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
    if torch_op is not None and is_torch_tensor(array):
        hint = f"torch tensors go to {torch_op}"
    else:
        hint = "other frameworks' arrays convert without a copy through numpy.from_dlpack or cupy.from_dlpack"
    raise TypeError(
        f"Invalid {name}: expected a NumPy or CuPy array, got {type(array).__module__}.{type(array).__name__} ({hint})"
    )
