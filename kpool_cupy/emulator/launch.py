"""Launching an emulated kernel: CUDA-style arguments through ctypes, widths checked, launches recorded."""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kernel.sources import kernel_source
from .toolchain import BARRIERS, COOPERATED, ENTRY, SIZES, WGMMAS, load_code


@dataclass(frozen=True)
class EmulatedLaunch:
    """What one emulated launch did, as ``recording()`` lists it."""

    kernel_name: str
    grid: int
    block: int
    vector_accesses: int  # 16-byte loads and stores the kernel made
    cooperative: bool = False  # ran as fibers (KP_THREADS_COOPERATE), not one thread after another
    shared_bytes: int = 0  # dynamic shared memory each block had (KP_DYNAMIC_SHARED)
    barriers: int = 0  # block-wide barriers its blocks passed, summed over them (fibers only)
    wgmmas: int = 0  # wgmma.mma_async its warpgroups issued, one a warpgroup's instruction, summed over them


_records = threading.local()


@contextlib.contextmanager
def recording() -> Iterator[list[EmulatedLaunch]]:
    """Collect the launches this thread makes inside the block (for tests: did the 16-byte path run?)."""
    launches: list[EmulatedLaunch] = []
    previous = getattr(_records, "launches", None)
    _records.launches = launches
    try:
        yield launches
    finally:
        _records.launches = previous


def _c_value(value: Any) -> ctypes._SimpleCData:
    if isinstance(value, np.ndarray):
        return ctypes.c_void_p(value.ctypes.data)
    if isinstance(value, np.int64):
        return ctypes.c_longlong(int(value))
    if isinstance(value, np.int32):
        return ctypes.c_int(int(value))
    if type(value) is int:  # as CuPy passes one: 8 bytes (a device pointer, from torch's data_ptr())
        return ctypes.c_longlong(value)
    raise TypeError(f"no C type for a kernel argument of type {type(value).__name__}")


def _check_widths(library: ctypes.CDLL, kernel_name: str, values: list[ctypes._SimpleCData]) -> None:
    """Refuse arguments whose count or byte widths differ from the kernel's parameters.

    Passing an int64 where the kernel takes an int works on the emulator and
    shifts every later argument on a GPU: this makes the emulator fail first.
    """
    sizes = (ctypes.c_ulonglong * 64)()
    count = getattr(library, SIZES)(sizes, 64)
    if count != len(values):
        raise TypeError(f"{kernel_name} takes {count} arguments, got {len(values)}")
    for i, value in enumerate(values):
        if sizes[i] != ctypes.sizeof(value):
            raise TypeError(
                f"{kernel_name} argument {i}: the parameter is {sizes[i]} bytes, got {ctypes.sizeof(value)} "
                f"({type(value).__name__})"
            )


# The most dynamic shared memory any GPU gives a block: 227 KiB, the opt-in
# limit of compute capability 9.0 and 10.0 (CUDA C++ Programming Guide,
# "Technical Specifications per Compute Capability"; sm_80 has 163 KiB, sm_86,
# sm_89 and sm_120 99 KiB). The emulator refuses more: no GPU would launch it.
MAX_SHARED_BYTES = 227 * 1024


def check_shared_bytes(shared_bytes: int) -> None:
    """Refuse a dynamic shared memory size no GPU launches (negative, or above ``MAX_SHARED_BYTES``)."""
    if not 0 <= shared_bytes <= MAX_SHARED_BYTES:
        raise ValueError(
            f"Invalid shared_bytes: expected 0 to {MAX_SHARED_BYTES} bytes of dynamic shared memory a block "
            f"(227 KiB, the most a GPU gives), got {shared_bytes}"
        )


def launch_code(
    code: str, kernel_name: str, grid: int, block: int, args: tuple[Any, ...], shared_bytes: int = 0
) -> None:
    """Run ``kernel_name`` of the kernel text ``code`` over ``grid`` x ``block`` threads, each block with
    ``shared_bytes`` of dynamic shared memory (``KP_DYNAMIC_SHARED``)."""
    check_shared_bytes(shared_bytes)
    library = load_code(code, kernel_name)
    values = [_c_value(a) for a in args]  # kept alive until the call returns
    _check_widths(library, kernel_name, values)
    pointers = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
    accesses = getattr(library, ENTRY)(grid, block, shared_bytes, pointers)
    launches = getattr(_records, "launches", None)
    if launches is not None:
        # ctypes calls on this OS thread, so the flag is this launch's.
        cooperated = bool(getattr(library, COOPERATED)())
        barriers, wgmmas = int(getattr(library, BARRIERS)()), int(getattr(library, WGMMAS)())
        launches.append(
            EmulatedLaunch(kernel_name, grid, block, int(accesses), cooperated, shared_bytes, barriers, wgmmas)
        )


def launch(
    source_file: str, kernel_name: str, grid: int, block: int, args: tuple[Any, ...], shared_bytes: int = 0
) -> None:
    """Run ``kernel_name`` of kernels/``source_file`` over ``grid`` x ``block`` threads with CUDA-style arguments,
    each block with ``shared_bytes`` of dynamic shared memory."""
    launch_code(kernel_source(source_file), kernel_name, grid, block, args, shared_bytes)
