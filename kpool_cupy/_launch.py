"""Kernel arguments of kpool_compress, built once for the GPU launcher and the emulator."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import allows_vector_access
from ._dtypes import INDEX_KINDS
from ._validate import CompressCall


def _row_stride(array: Any) -> np.int64:
    return np.int64(array.strides[0] // array.dtype.itemsize)


def compress_arguments(
    call: CompressCall,
    k: Any,
    gate: Any,
    ape: Any,
    input_row_offsets: Any,
    cache_lengths: Any,
    pool_row_offsets: Any,
    out: Any,
) -> tuple[Any, ...]:
    """The argument tuple, in the order of ``kpool_compress`` in kernels/kpool_compress.cu.

    Scalars are NumPy scalars of the exact C++ width (a Python int would
    travel as a 64-bit ``long long`` whatever the parameter's type).
    """
    vector_mask = sum(bit for bit, a in zip((1, 2, 4, 8), (k, gate, ape, out), strict=True) if allows_vector_access(a))
    return (
        k,
        _row_stride(k),
        gate,
        _row_stride(gate),
        ape,
        _row_stride(ape),
        input_row_offsets,
        np.int32(INDEX_KINDS[np.dtype(input_row_offsets.dtype)]),
        cache_lengths,
        np.int32(INDEX_KINDS[np.dtype(cache_lengths.dtype)]),
        pool_row_offsets,
        np.int32(INDEX_KINDS[np.dtype(pool_row_offsets.dtype)]),
        np.int64(call.batch),
        np.int64(call.total_tokens),
        out,
        _row_stride(out),
        np.int64(out.shape[0]),
        np.int32(vector_mask),
    )
