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


def _kind(array: Any) -> np.int32:
    return np.int32(INDEX_KINDS[np.dtype(array.dtype)])


def _vector_mask(**operands: Any) -> np.int32:
    """Bits 0 k, 1 gate, 2 ape, 3 out, 4 tail, as the ring kernels read them."""
    bits = {"k": 1, "gate": 2, "ape": 4, "out": 8, "tail": 16}
    return np.int32(sum(bits[name] for name, a in operands.items() if a is not None and allows_vector_access(a)))


def _strides_aligned(array: Any) -> bool:
    """For 3-D token blocks: every stride but the last a multiple of 16 bytes, base aligned."""
    from ._arrays import data_pointer

    return data_pointer(array) % 16 == 0 and all(s % 16 == 0 for s in array.strides[:-1])


def ring_close_arguments(call: Any, tail, k, gate, ape, input_row_offsets, cache_lengths, slot_idx, out, closed):
    """Arguments of ``kpool_ring_close`` in kernels/kpool_ring.cu."""
    return (
        tail,
        np.int64(call.max_slots),
        k,
        _row_stride(k),
        gate,
        _row_stride(gate),
        ape,
        _row_stride(ape),
        input_row_offsets,
        _kind(input_row_offsets),
        cache_lengths,
        _kind(cache_lengths),
        slot_idx,
        _kind(slot_idx),
        np.int64(call.requests),
        np.int64(call.total_tokens),
        out,
        _row_stride(out),
        closed,
        _vector_mask(k=k, gate=gate, ape=ape, out=out, tail=tail),
    )


def seed_tail_arguments(call: Any, tail, k, gate, input_row_offsets, cache_lengths, slot_idx):
    """Arguments of ``kpool_seed_tail`` in kernels/kpool_ring.cu."""
    return (
        tail,
        np.int64(call.max_slots),
        k,
        _row_stride(k),
        gate,
        _row_stride(gate),
        input_row_offsets,
        _kind(input_row_offsets),
        cache_lengths,
        _kind(cache_lengths),
        slot_idx,
        _kind(slot_idx),
        np.int64(call.requests),
        np.int64(call.total_tokens),
        _vector_mask(k=k, gate=gate, tail=tail),
    )


def tail_update_arguments(call: Any, tail, k, gate, ape, positions, slot_idx, out, closed):
    """Arguments of ``kpool_tail_update`` in kernels/kpool_ring.cu."""
    itemsize = k.dtype.itemsize
    mask = int(_vector_mask(ape=ape, out=out, tail=tail))
    mask |= (1 if _strides_aligned(k) else 0) | (2 if _strides_aligned(gate) else 0)
    if not _strides_aligned(out):
        mask &= ~8
    return (
        tail,
        np.int64(call.max_slots),
        k,
        np.int64(k.strides[0] // itemsize),
        np.int64(k.strides[1] // itemsize),
        gate,
        np.int64(gate.strides[0] // itemsize),
        np.int64(gate.strides[1] // itemsize),
        ape,
        _row_stride(ape),
        positions,
        slot_idx,
        _kind(slot_idx),
        np.int64(call.requests),
        np.int32(call.next_n),
        out,
        closed,
        np.int32(call.pools_per_request),
        np.int32(mask),
    )


def expand_arguments(pool_ids, pool_topk, input_row_offsets, cache_lengths, batch, total_tokens, positions):
    """Arguments of ``kpool_expand_topk`` in kernels/kpool_expand.cu."""
    return (
        pool_ids,
        _kind(pool_ids),
        np.int64(pool_topk),
        input_row_offsets,
        _kind(input_row_offsets),
        cache_lengths,
        _kind(cache_lengths),
        np.int64(batch),
        np.int64(total_tokens),
        positions,
        np.int64(positions.shape[1]),
    )
