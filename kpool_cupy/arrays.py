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


def type_name(value: Any) -> str:
    """``value``'s type as an error names it: module and class (``jaxlib._jax.ArrayImpl``)."""
    return f"{type(value).__module__}.{type(value).__name__}"


def is_cupy_array(array: Any) -> bool:
    """Whether ``array`` is a CuPy array, told without importing CuPy."""
    return type(array).__module__.split(".")[0] == "cupy"


def is_torch_tensor(array: Any) -> bool:
    """Whether ``array`` is a torch tensor, or of a subclass of one (a Parameter, a user's or another library's
    subclass), told without importing torch."""
    return any(cls.__name__ == "Tensor" and cls.__module__ == "torch" for cls in type(array).__mro__)


def torch_device_type(array: Any) -> str:
    """A torch tensor's device type ("cpu", "cuda", "meta"...), "" where it cannot be read."""
    try:
        return str(array.device.type)
    except Exception:  # a tensor subclass may refuse: the caller's error is about the argument, not this
        return ""


# DLPack's device types (dlpack.h's DLDeviceType): memory a CUDA kernel may touch (kDLCUDA, kDLCUDAManaged),
# and host memory the CPU backends could read once NumPy views it (kDLCPU, kDLCUDAHost).
DLPACK_CUDA_DEVICES = (2, 13)
DLPACK_HOST_DEVICES = (1, 3)


def dlpack_device_type(array: Any) -> int | None:
    """The DLPack device type ``array`` reports, or None: no DLPack, or asking failed (a deleted or sharded
    array may raise; the caller's error is then about the argument's kind, not this)."""
    try:
        if not (hasattr(array, "__dlpack_device__") and hasattr(array, "__dlpack__")):
            return None
        return int(array.__dlpack_device__()[0])
    except Exception:
        return None


def has_attribute(array: Any, name: str) -> bool:
    """``hasattr`` that reads an attribute raising anything (a JAX array's CUDA interface may raise a
    ValueError) as absent."""
    try:
        return hasattr(array, name)
    except Exception:
        return False


def array_home(array: Any) -> str:
    """Which door of the package an array goes through, told without importing its framework or touching a
    device: ``"torch"`` (kpool_cupy.torch takes CPU and CUDA tensors), ``"device"`` (CuPy or another
    framework's CUDA array: the GPU functions of kpool_cupy), ``"host"`` (NumPy, or another framework's host
    array, which the CPU backends take once NumPy views it), ``"elsewhere"`` (a DLPack array on another kind
    of device: no door) or ``""`` (none the package knows: a list, a scalar)."""
    if is_torch_tensor(array):
        return "torch"
    if isinstance(array, np.ndarray):
        return "host"
    if is_cupy_array(array):
        return "device"
    device_type = dlpack_device_type(array)
    if device_type in DLPACK_CUDA_DEVICES:
        return "device"
    if device_type in DLPACK_HOST_DEVICES:
        return "host"
    if device_type is not None:
        return "elsewhere"
    return "device" if has_attribute(array, "__cuda_array_interface__") else ""


def to_numpy_hint(array: Any) -> str:
    """How a host array of another framework becomes a NumPy one: ``numpy.asarray`` where it has
    ``__array__`` (JAX's: a view, no copy), else ``numpy.from_dlpack``."""
    if has_attribute(array, "__array__") or dlpack_device_type(array) is None:
        return "numpy.asarray(x)"
    return "numpy.from_dlpack(x)"


def check_array_kind(name: str, array: Any, torch_op: str | None = None) -> None:
    """A NumPy or CuPy array, or a TypeError naming ``name`` (and ``torch_op``, where a torch tensor goes).

    NumPy subclasses that change what the elements mean are refused: a masked
    array's mask and a matrix's 2-D-only rules would be ignored by a kernel
    reading the bare buffer. Memory maps and other plain views are arrays.
    """
    if isinstance(array, (np.ma.MaskedArray, np.matrix)):
        raise TypeError(
            f"Invalid {name}: expected a plain array, got {type_name(array)} "
            "(pass .data of a masked array after handling its mask, or np.asarray of a matrix)"
        )
    if isinstance(array, np.ndarray) or is_cupy_array(array):
        return
    if torch_op is not None and is_torch_tensor(array):
        hint = f"torch tensors go to {torch_op}, once kpool_cupy.torch is imported"
    else:
        hint = "other frameworks' arrays convert without a copy through numpy.from_dlpack or cupy.from_dlpack"
    raise TypeError(f"Invalid {name}: expected a NumPy or CuPy array, got {type_name(array)} ({hint})")
