"""The GPU path: kpool_compress on CUDA arrays through a CuPy RawModule.

CuPy is imported on first use, so ``import kpool_cupy`` works without it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._driver import run_compress
from ._geometry import launch_geometry
from ._launch import compress_arguments
from ._nvrtc import NVRTC_OPTIONS
from ._sources import kernel_source
from ._validate import CompressCall
from ._variants import COMPRESS_SOURCE, compress_kernel_name

# DLPack device types whose memory a CUDA kernel may touch: CUDA, CUDA managed.
_DLPACK_CUDA_DEVICES = (2, 13)

_kernel_lock = threading.Lock()
_kernels: dict[tuple[str, str, int], Any] = {}


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as error:
        raise RuntimeError(
            "kpool_cupy.kpool_compress needs CuPy: install kpool-cupy[cuda12] or kpool-cupy[cuda13], "
            "or use kpool_cupy.reference / kpool_cupy.emulate on host arrays"
        ) from error
    return cupy


def kernel_function(source: str, name: str, device_id: int) -> Any:
    """The loaded kernel ``name`` of kernels/``source`` on ``device_id``, compiled once per process.

    The lock makes concurrent first calls compile and load once; across
    processes CuPy's disk cache (keyed by the full source text) does the rest.
    """
    cupy = _cupy()
    with _kernel_lock:
        function = _kernels.get((source, name, device_id))
        if function is None:
            with cupy.cuda.Device(device_id):
                module = cupy.RawModule(code=kernel_source(source), options=NVRTC_OPTIONS, name_expressions=(name,))
                function = module.get_function(name)
            _kernels[(source, name, device_id)] = function
        return function


def _host_array_error(name: str, array: Any) -> TypeError:
    kind = f"{type(array).__module__}.{type(array).__name__}"
    return TypeError(
        f"Invalid {name}: expected a CUDA array (CuPy, or an object with __dlpack__ or __cuda_array_interface__ "
        f"on a GPU), got host array {kind}; host arrays go to kpool_cupy.reference.kpool_compress "
        "or kpool_cupy.emulate.kpool_compress"
    )


def check_device_array(name: str, array: Any) -> None:
    """TypeError unless ``array`` is None or a CUDA array; touches no device, so it runs first."""
    if array is None:
        return
    cupy = _cupy()
    if isinstance(array, cupy.ndarray):
        return
    if isinstance(array, np.ndarray):
        raise _host_array_error(name, array)
    if hasattr(array, "__dlpack_device__") and hasattr(array, "__dlpack__"):
        device_type, _ = array.__dlpack_device__()
        if int(device_type) not in _DLPACK_CUDA_DEVICES:
            raise _host_array_error(name, array)
        return
    if not hasattr(array, "__cuda_array_interface__"):
        raise TypeError(
            f"Invalid {name}: expected a CUDA array (CuPy, __dlpack__ or __cuda_array_interface__), "
            f"got {type(array).__module__}.{type(array).__name__}"
        )


def device_of(array: Any) -> int:
    """The CUDA device id of a CUDA array from any framework, without converting it."""
    cupy = _cupy()
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
    cupy = _cupy()
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
        f"__cuda_stream__ or .cuda_stream, got {type(stream).__module__}.{type(stream).__name__}"
    )


def resolve_stream(stream: Any) -> Any:
    """A CuPy stream for a CuPy stream, a raw handle, ``__cuda_stream__`` or ``.cuda_stream``."""
    cupy = _cupy()
    if stream is None:
        return cupy.cuda.get_current_stream()
    if isinstance(stream, cupy.cuda.Stream):
        return stream
    return cupy.cuda.Stream.from_external(_external_stream(stream))


class CupyArrays:
    """Where the GPU path keeps arrays: CuPy, on one device."""

    def __init__(self, cupy: Any, device_id: int) -> None:
        self.cupy = cupy
        self.device_id = device_id

    def host_copies(self, arrays: list[Any]) -> list[np.ndarray]:
        # One device-to-host copy for all of them.
        joined = self.cupy.concatenate([a.astype(self.cupy.int64) for a in arrays]).get()
        ends = np.cumsum([a.shape[0] for a in arrays])
        return np.split(joined, ends[:-1])

    def from_host(self, array: np.ndarray) -> Any:
        return self.cupy.asarray(array)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        return self.cupy.zeros(shape, dtype=dtype)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        return self.cupy.empty(shape, dtype=dtype)


class _CupyBackend(CupyArrays):
    def pool(self, call: CompressCall, slots: int, arrays: tuple[Any, ...], out: Any) -> None:
        name = compress_kernel_name(call.k_dtype, call.gate_dtype, call.out_dtype, call.head_dim, call.kpool)
        geometry = launch_geometry(call.head_dim, slots)
        kernel = kernel_function(COMPRESS_SOURCE, name, self.device_id)
        kernel((geometry.grid,), (geometry.block,), compress_arguments(call, *arrays, out))


def kpool_compress(
    k: Any,
    gate: Any,
    ape: Any,
    input_row_offsets: Any,
    cache_lengths: Any,
    *,
    pool_row_offsets: Any = None,
    out: Any = None,
    validate: bool = True,
    stream: Any = None,
) -> Any:
    """Pool each complete k-pool of a ragged batch into one key, on the GPU.

        logits[m, c] = gate[member m, c] + ape[m, c]
        w[:, c]      = softmax over m of logits[:, c]
        pooled[p, c] = sum_m w[m, c] * k[member m, c]

    The softmax runs per channel: each channel of a pool has its own member
    weights. Request ``b`` owns token rows ``[input_row_offsets[b],
    input_row_offsets[b+1])`` at absolute positions ``cache_lengths[b] + i``;
    pool ``q`` covers positions ``[q*kpool, (q+1)*kpool)`` and only pools whose
    members all arrive in this call are built, in order, at output rows
    ``[pool_row_offsets[b], pool_row_offsets[b+1])``.

    Parameters
    ----------
    k, gate
        ``[total_tokens, head_dim]``, bfloat16, float16 or float32, last dim
        contiguous, rows at any stride. CuPy arrays or any CUDA array with
        ``__dlpack__`` or ``__cuda_array_interface__`` (zero copy).
    ape
        float32 ``[kpool, head_dim]``; ``kpool`` is ``ape.shape[0]``.
    input_row_offsets, cache_lengths
        ``[batch + 1]`` and ``[batch]``, int32, uint32 or int64.
    pool_row_offsets
        Optional ``[batch + 1]``; must equal :func:`kpool_cupy.pool_row_offsets`.
    out
        Optional ``[>= total_pools, head_dim]`` in the dtype of ``k`` or
        float32; rows past ``total_pools`` are not written.
    validate
        Check offset contents (one device-to-host copy). With ``out``,
        ``pool_row_offsets`` and ``validate=False`` the call neither syncs nor
        allocates, so it can be captured in a CUDA graph (for CuPy and DLPack
        inputs; CuPy syncs on the stream a ``__cuda_array_interface__``
        names). Unvalidated garbage never makes the kernel touch memory
        outside its arrays.
    stream
        A ``cupy.cuda.Stream``, a raw handle, or anything with
        ``__cuda_stream__`` or ``.cuda_stream``; default CuPy's current stream.

    Returns
    -------
    cupy.ndarray
        ``out`` (as a CuPy view), or a new ``[total_pools, head_dim]`` array in
        the dtype of ``k``.
    """
    named = {
        "k": k,
        "gate": gate,
        "ape": ape,
        "input_row_offsets": input_row_offsets,
        "cache_lengths": cache_lengths,
        "pool_row_offsets": pool_row_offsets,
        "out": out,
    }
    with on_device(named, stream) as (cupy, device_id, arrays):
        return run_compress(_CupyBackend(cupy, device_id), *arrays.values(), validate)


@contextlib.contextmanager
def on_device(named: dict[str, Any], stream: Any) -> Iterator[tuple[Any, int, dict[str, Any]]]:
    """Check, convert and place the arrays of one GPU call; yields (cupy, device id, CuPy views).

    Type errors come first, before any CUDA call, so a bad call fails the same
    way on a machine without a device. The launch goes to the first array's
    device, entered before the stream is wrapped (a foreign stream is bound to
    the device current when it is wrapped); every other array must be there.
    """
    cupy = _cupy()
    if stream is not None and not isinstance(stream, cupy.cuda.Stream):
        _external_stream(stream)
    for name, array in named.items():
        check_device_array(name, array)
    first = next(iter(named))
    device_id = device_of(named[first])
    with cupy.cuda.Device(device_id), resolve_stream(stream):
        arrays = {name: as_device_array(name, array) for name, array in named.items()}
        for name, array in arrays.items():
            if array is not None and array.device.id != device_id:
                where = f"device {array.device.id}"
                raise ValueError(f"Invalid {name}: expected an array on device {device_id} like {first}, got {where}")
        yield cupy, device_id, arrays
