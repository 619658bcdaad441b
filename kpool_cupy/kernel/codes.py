"""The kernels' VECTOR template argument, and the argument values a launcher builds from arrays.

``VectorAccess`` mirrors the enum of the same name in
kernels/kpool_common.cuh; tests/test_kernel_codes.py reads the header and
compares, so the two cannot drift apart.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np


class VectorAccess(enum.IntFlag):
    """Bits of a kernel's VECTOR argument (``kp::VectorAccess``): operands that may use 16-byte access."""

    K = 1
    GATE = 2
    APE = 4
    OUT = 8
    TAIL = 16  # a ring's keys
    GATE_RING = 32  # a ring's gate scores


class Fp8Target(enum.IntEnum):
    """Where an FP8 writer's rows go (``kp::Fp8Target``): rows of values and scales, or a paged cache through
    per-pool slots or a block table."""

    ROWS = 0
    SLOTS = 1
    TABLE = 2


def data_pointer(array: Any) -> int:
    """Address of the first element of a NumPy or CuPy array (views included)."""
    if type(array).__module__.partition(".")[0] == "cupy":  # arrays.is_cupy_array, inline: a hot path's
        return int(array.data.ptr)
    return int(array.ctypes.data)


def allows_vector_access(array: Any) -> bool:
    """Whether 16-byte loads and stores are legal everywhere a kernel reaches in ``array``.

    A kernel reaches 8 channels at a time from the start of a row, and 8
    channels are 16 or 32 bytes, so the base address and every stride it
    steps by (those of dimensions longer than 1, the last excepted) decide.
    """
    if data_pointer(array) % 16:
        return False
    for size, stride in zip(array.shape[:-1], array.strides[:-1], strict=True):
        if size > 1 and stride % 16:
            return False
    return True


def allows_8byte_rows(array: Any) -> bool:
    """Whether every row of a uint8 array of FP8 values (8 bytes a thread) starts 8-byte aligned: the base
    address and every stepped stride but the last dim's."""
    steps = zip(array.shape[:-1], array.strides[:-1], strict=True)
    return data_pointer(array) % 8 == 0 and all(stride % 8 == 0 for size, stride in steps if size > 1)


def vector_mask(**operands: Any) -> int:
    """The VECTOR template argument: the bit of each named operand (k, gate, ape, out, tail, gate_ring) that
    allows it."""
    bits = 0
    for name, array in operands.items():
        if array is not None and allows_vector_access(array):
            bits |= _VECTOR_BITS[name]
    return bits


_VECTOR_BITS = {name.lower(): int(bit) for name, bit in VectorAccess.__members__.items()}  # plain ints: no enum math


def stride(array: Any, axis: int = 0) -> np.int64:
    """The stride of ``axis`` in elements, as the kernels' ``long long``."""
    return np.int64(array.strides[axis] // array.dtype.itemsize)


def rows(name: str, array: Any, stride_name: str | None = None) -> dict[str, Any]:
    """A row-major operand and its row stride, by the kernel parameters' names (``<name>_row_stride`` unless
    named): what ``kernel.declarations.rows`` declares."""
    return {name: array, stride_name or f"{name}_row_stride": stride(array)}
