"""Host memory, shared by the two CPU backends (emulate and reference)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ..arrays import array_home, check_array_kind, dlpack_device_type, to_numpy_hint, type_name
from ..kernel.declarations import MMA_E4M3, MMA_E4M3_HMMA, MMA_F16, MMA_WGMMA
from ..ops.framework.binding import Binding, execute, given_back
from ..ops.framework.spec import Backend, OpSpec, spread

# Which GPU path the emulator runs for the scorer and the fused select: the e4m3 mma.sync of sm_89 and newer
# (default), the f16 one of sm_80, sm_90's f16 mma.sync on converted e4m3 (hmma), or the wgmma of an sm_90a
# build. The reference backend computes its model either way.
EMULATE_MMA_VARIABLE = "KPOOL_CUPY_EMULATE_MMA"
EMULATED_PATHS = {"e4m3": MMA_E4M3, "f16": MMA_F16, "hmma": MMA_E4M3_HMMA, "wgmma": MMA_WGMMA}


def emulated_tensor_core() -> int:
    """The ``MMA`` template argument ``KPOOL_CUPY_EMULATE_MMA`` names (e4m3 when unset or empty); a ValueError
    naming the variable for another value."""
    value = os.environ.get(EMULATE_MMA_VARIABLE, "") or "e4m3"
    if value not in EMULATED_PATHS:
        raise ValueError(
            f"Invalid {EMULATE_MMA_VARIABLE}: expected one of {', '.join(EMULATED_PATHS)} (or unset), got {value!r}"
        )
    return EMULATED_PATHS[value]


class HostMemory:
    """Where the CPU backends keep arrays: NumPy, so a "host copy" is the array itself."""

    def host_copies(self, arrays: list[Any]) -> list[np.ndarray]:
        # int64 like the GPU's copies, so sums of offsets and lengths in the
        # checks cannot wrap at the caller's int32 or uint32.
        return [np.asarray(a).astype(np.int64) for a in arrays]

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return array

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.empty(shape, dtype=dtype)

    def tensor_core(self) -> int:
        # The emulator runs every path's instruction; a CPU backend takes the one sm_89 and newer run unless
        # KPOOL_CUPY_EMULATE_MMA names another.
        return emulated_tensor_core()


def check_host_arrays(backend: str, op: str, names: tuple[str, ...], arrays: tuple[Any, ...]) -> None:
    """The CPU backends take plain NumPy arrays; name the first argument that is not one, and where it goes
    instead: a torch tensor to the op's torch function, a CUDA array to the op's GPU function, anything else
    through ``numpy.asarray``."""
    for name, array in zip(names, arrays, strict=True):
        if isinstance(array, np.ndarray):
            check_array_kind(name, array)  # a masked array or a matrix is refused here
        elif array is not None:
            home = array_home(array)
            if home == "torch":
                hint = f"torch tensors go to kpool_cupy.torch.{op}"
            elif home == "device":
                hint = f"device arrays go to kpool_cupy.{op}"
            elif home == "elsewhere":
                hint = f"an array on DLPack device type {dlpack_device_type(array)}, which no backend reads"
            else:  # another framework's host array (JAX's views without a copy), a list
                hint = f"{to_numpy_hint(array)} makes one"
            raise TypeError(
                f"Invalid {name}: expected a NumPy array for kpool_cupy.{backend}, got {type_name(array)} ({hint})"
            )


def _plain(value: Any, behind: dict[int, Any]) -> Any:
    """``value`` with each ndarray subclass (a memmap, a user's class) as a plain ndarray of the same memory, so
    both backends read the bare buffer: the reference computes with NumPy, which would take a subclass's own
    operators and indexing. An output comes back as the caller's array (``behind``)."""
    if isinstance(value, (tuple, list)):  # a split ring's pair, either way
        return type(value)(_plain(v, behind) for v in value)
    if isinstance(value, np.ndarray) and type(value) is not np.ndarray:
        view = value.view(np.ndarray)
        behind[id(view)] = value
        return view
    return value


def host_binding(name: str, backend: Callable[[dict[str, Any]], Backend]) -> Binding:
    """The binding of a CPU backend: NumPy arrays only, then the op's call flow on ``backend(extras)``."""

    def call(spec: OpSpec, arrays: tuple[Any, ...], options: dict[str, Any], extras: dict[str, Any]) -> Any:
        chosen = backend(extras)  # checks the backend's own options first
        placed = spread(spec.operands, arrays)  # a split ring's two arrays are checked one by one
        check_host_arrays(name, spec.name, placed.names, placed.arrays)
        behind: dict[int, Any] = {}
        plain = tuple(_plain(a, behind) for a in arrays)
        return given_back(execute(spec, chosen, plain, options), behind)

    return Binding(name, f"kpool_cupy.{name}", array="np.ndarray", result="np.ndarray", options=(), call=call)
