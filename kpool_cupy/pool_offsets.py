"""The pool-to-request mapping, in the array library of its inputs."""

from __future__ import annotations

from typing import Any

import numpy as np

from .arrays import check_array_kind, is_cupy_array
from .dtypes import INDEX_DTYPES, MAX_KPOOL


def check_kpool(kpool: Any) -> None:
    """An integer (TypeError otherwise) in [1, MAX_KPOOL] (ValueError otherwise)."""
    if isinstance(kpool, bool) or not isinstance(kpool, (int, np.integer)):
        raise TypeError(f"Invalid kpool: expected an integer, got {type(kpool).__name__} {kpool!r}")
    if not 1 <= kpool <= MAX_KPOOL:
        raise ValueError(f"Invalid kpool: expected an integer in [1, {MAX_KPOOL}], got {kpool!r}")


def _array_module(array: Any) -> Any:
    """``cupy`` for CuPy arrays, ``numpy`` otherwise; CuPy is imported only when it is already in use."""
    if is_cupy_array(array):
        import cupy

        return cupy
    return np


def check_pool_row_offsets_args(input_row_offsets: Any, cache_lengths: Any, kpool: Any) -> None:
    """What :func:`pool_row_offsets` checks without reading an element: ``kpool``, and the arrays' dtypes,
    ranks and lengths (anything with ``dtype``, ``ndim`` and ``shape``: torch's fake kernel passes metadata)."""
    check_kpool(kpool)
    for name, array in (("input_row_offsets", input_row_offsets), ("cache_lengths", cache_lengths)):
        if np.dtype(array.dtype) not in INDEX_DTYPES:
            raise TypeError(
                f"Invalid {name}: expected dtype int32, uint32 or int64, got {getattr(array, 'dtype', type(array))}"
            )
        if array.ndim != 1:
            raise ValueError(f"Invalid {name}: expected a 1-D array, got shape {tuple(array.shape)}")
    if input_row_offsets.shape[0] == 0:  # as every op says it
        raise ValueError("Invalid input_row_offsets: expected length batch + 1 >= 1, got length 0")
    if cache_lengths.shape[0] + 1 != input_row_offsets.shape[0]:
        raise ValueError(
            f"Invalid cache_lengths: expected length {input_row_offsets.shape[0] - 1} "
            f"(len(input_row_offsets) - 1), got length {cache_lengths.shape[0]}"
        )


def pool_row_offsets(input_row_offsets: Any, cache_lengths: Any, kpool: int) -> Any:
    """Output row offsets ``[batch + 1]`` (int64) of each request's complete pools.

        pools(b) = floor((c + n) / kpool) - ceil(c / kpool),  c = cache_lengths[b],
                   n = input_row_offsets[b + 1] - input_row_offsets[b]
        pool_row_offsets = [0, cumsum(pools)]

    A request whose tokens complete no pool gets zero rows, never a negative
    count. NumPy in, NumPy out; CuPy in, CuPy out, computed on the device
    without a host sync.

    Raises
    ------
    TypeError
        Offsets or lengths of another dtype than int32, uint32 or int64, or a
        ``kpool`` that is not an integer.
    ValueError
        Offsets or lengths of the wrong rank or length, or ``kpool`` outside
        [1, 1024].
    """
    for name, array in (("input_row_offsets", input_row_offsets), ("cache_lengths", cache_lengths)):
        check_array_kind(name, array, torch_op="torch.ops.kpool.pool_row_offsets")
    check_pool_row_offsets_args(input_row_offsets, cache_lengths, kpool)
    xp = _array_module(input_row_offsets)
    return pool_rows(input_row_offsets.astype(xp.int64), cache_lengths.astype(xp.int64), int(kpool), xp)


def pool_rows(offsets: Any, cached: Any, kpool: int, xp: Any = np) -> Any:
    """``pool_row_offsets`` of int64 offsets and lengths of ``xp``'s (NumPy's or CuPy's), checked before."""
    first_pool = -((-cached) // kpool)
    end_pool = (cached + (offsets[1:] - offsets[:-1])) // kpool
    counts = xp.maximum(end_pool - first_pool, 0)
    result = xp.zeros(offsets.shape[0], dtype=xp.int64)
    xp.cumsum(counts, out=result[1:])
    return result
