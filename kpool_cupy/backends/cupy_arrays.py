"""CUDA arrays and streams from any framework, as CuPy: the GPU backend's argument placement.

Every check here touches no device, so a bad call fails the same way on a
machine without one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..arrays import (
    DLPACK_CUDA_DEVICES,
    DLPACK_HOST_DEVICES,
    dlpack_device_type,
    has_attribute,
    is_torch_tensor,
    to_numpy_hint,
    torch_device_type,
    type_name,
)


def import_cupy() -> Any:
    """CuPy, or a clear RuntimeError saying how to install it."""
    try:
        import cupy
    except ImportError as error:
        raise RuntimeError(
            "kpool_cupy.kpool_compress needs CuPy: install kpool-cupy[cuda12] or kpool-cupy[cuda13], "
            "or use kpool_cupy.reference / kpool_cupy.emulate on host arrays"
        ) from error
    return cupy


_EXPECTED = "expected a CUDA array (CuPy, or an object with __dlpack__ or __cuda_array_interface__ on a GPU)"


def _host_array_error(name: str, array: Any, op: str | None) -> TypeError:
    kind = type_name(array)
    where = (
        f"kpool_cupy.reference.{op} or kpool_cupy.emulate.{op}" if op else "kpool_cupy.reference or kpool_cupy.emulate"
    )
    if not isinstance(array, np.ndarray):  # another framework's: the CPU backends take NumPy's arrays
        where += f" as a NumPy array ({to_numpy_hint(array)})"
    return TypeError(f"Invalid {name}: {_EXPECTED}, got host array {kind}; host arrays go to {where}")


def check_device_array(name: str, array: Any, op: str | None = None) -> None:
    """TypeError unless ``array`` is None or a CUDA array; touches no device, so it runs first. ``op``: the
    function called, which the error names with its CPU backends (or kpool_cupy.torch's, for a tensor)."""
    if array is None:
        return
    cupy = import_cupy()
    if isinstance(array, cupy.ndarray):
        return
    if isinstance(array, np.ndarray):
        raise _host_array_error(name, array, op)
    device_type = dlpack_device_type(array)
    if device_type in DLPACK_CUDA_DEVICES:  # a CUDA tensor or array: the hot path asks nothing more
        return
    kind = type_name(array)
    if is_torch_tensor(array) and (on := torch_device_type(array)) != "cuda":
        # A torch tensor on the CPU or meta (whose DLPack export raises): the torch ops take it.
        where = f"kpool_cupy.torch.{op}" if op else "kpool_cupy.torch"
        raise TypeError(f"Invalid {name}: {_EXPECTED}, got a {kind} on {on or 'no readable device'}; such tensors "
                        f"go to {where}")  # fmt: skip
    if device_type in DLPACK_HOST_DEVICES:
        raise _host_array_error(name, array, op)
    if device_type is not None:
        raise TypeError(f"Invalid {name}: {_EXPECTED}, got {kind} on DLPack device type {device_type}")
    if not has_attribute(array, "__cuda_array_interface__"):
        raise TypeError(
            f"Invalid {name}: expected a CUDA array (CuPy, __dlpack__ or __cuda_array_interface__), got {kind}"
        )


def device_of(array: Any) -> int:
    """The CUDA device id of a CUDA array from any framework, without converting it."""
    cupy = import_cupy()
    if isinstance(array, cupy.ndarray):
        return int(array.device.id)
    if hasattr(array, "__dlpack_device__"):
        return int(array.__dlpack_device__()[1])
    pointer = array.__cuda_array_interface__["data"][0]
    return int(cupy.cuda.runtime.pointerGetAttributes(pointer).device)


def as_device_array(name: str, array: Any) -> Any:
    """A zero-copy CuPy view of a CUDA array from any framework, or a TypeError."""
    check_device_array(name, array)
    if array is None:
        return None
    cupy = import_cupy()
    if isinstance(array, cupy.ndarray):
        return array
    if hasattr(array, "__dlpack__"):
        return cupy.from_dlpack(array)
    return cupy.asarray(array)


class _RawStreamHandle:
    """A raw cudaStream_t seen through the CUDA stream protocol."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def stream_of_handle(handle: int, device_id: int) -> Any:
    """CuPy's stream of a raw ``cudaStream_t`` of device ``device_id`` (``Stream.from_external``, which takes the
    current device for the stream's: made inside ``device_id``; CuPy 14 deprecates ``ExternalStream``)."""
    cupy = import_cupy()
    with cupy.cuda.Device(device_id):
        return cupy.cuda.Stream.from_external(_RawStreamHandle(handle))


def _external_stream(stream: Any) -> Any:
    """The stream-protocol object for a foreign stream, or a TypeError; touches no device."""
    if hasattr(stream, "__cuda_stream__"):
        return stream
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream and friends
        return _RawStreamHandle(int(stream.cuda_stream))
    if isinstance(stream, (int, np.integer)) and not isinstance(stream, bool):
        return _RawStreamHandle(int(stream))
    raise TypeError(
        "Invalid stream: expected a cupy.cuda.Stream, a raw stream handle (int), or an object with "
        f"__cuda_stream__ or .cuda_stream, got {type_name(stream)}"
    )


def stream_device(stream: Any) -> int | None:
    """The device a stream object says it belongs to (torch's ``.device``, CuPy's ``.device_id``), or None
    when it does not say (a raw handle, a bare ``__cuda_stream__``)."""
    index = getattr(getattr(stream, "device", None), "index", None)
    if isinstance(index, int):
        return index
    device_id = getattr(stream, "device_id", None)
    return device_id if isinstance(device_id, int) and device_id >= 0 else None


def resolve_stream(stream: Any) -> Any:
    """A CuPy stream for a CuPy stream, a raw handle, ``__cuda_stream__`` or ``.cuda_stream``."""
    cupy = import_cupy()
    if stream is None:
        return cupy.cuda.get_current_stream()
    if isinstance(stream, cupy.cuda.Stream):
        return stream
    return cupy.cuda.Stream.from_external(_external_stream(stream))


@contextlib.contextmanager
def on_device(
    names: tuple[str, ...], given: tuple[Any, ...], stream: Any, op: str | None = None
) -> Iterator[tuple[Any, int, tuple[Any, ...]]]:
    """Check, convert and place the arrays of one GPU call; yields (cupy, device id, CuPy views in order).

    Type errors come first, before any CUDA call, so a bad call fails the same
    way on a machine without a device. The launch goes to the first array's
    device, entered before the stream is wrapped (a foreign stream is bound to
    the device current when it is wrapped); every other array must be there.
    """
    cupy = import_cupy()
    if stream is not None and not isinstance(stream, cupy.cuda.Stream):
        _external_stream(stream)
    for name, array in zip(names, given, strict=True):
        check_device_array(name, array, op)
    first = names[0]
    device_id = device_of(given[0])
    on = stream_device(stream) if stream is not None else None
    if on is not None and on != device_id:
        # A stream belongs to one device; launching there with another's arrays
        # fails later with an invalid-handle error that names nothing.
        raise ValueError(
            f"Invalid stream: expected a stream of device {device_id} like {first} "
            f"(torch: torch.cuda.current_stream({first}.device), or kpool_cupy.torch), got one of device {on}"
        )
    with cupy.cuda.Device(device_id), resolve_stream(stream):
        arrays = tuple([as_device_array(name, array) for name, array in zip(names, given, strict=True)])
        for name, array in zip(names, arrays, strict=True):
            if array is not None and array.device.id != device_id:
                where = f"device {array.device.id}"
                raise ValueError(f"Invalid {name}: expected an array on device {device_id} like {first}, got {where}")
        yield cupy, device_id, arrays
