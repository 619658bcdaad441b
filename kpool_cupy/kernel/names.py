"""The one place that spells a kernel instantiation.

The same string goes to NVRTC's name expressions, to CuPy's ``get_function``
and into the emulator's launch shim, so the three cannot disagree.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import ELEMENT_CTYPES, INDEX_CTYPES, INT32
from .codes import VectorAccess

# The VECTOR argument of a kernel whose every operand allows 16-byte access,
# and the index dtypes a name defaults to: the variants tools and tests look at.
_RINGS = VectorAccess.TAIL | VectorAccess.GATE_RING
ALIGNED = {
    "kpool_compress": VectorAccess.K | VectorAccess.GATE | VectorAccess.APE | VectorAccess.OUT,
    "kpool_ring_close": VectorAccess.K | VectorAccess.GATE | VectorAccess.APE | VectorAccess.OUT | _RINGS,
    "kpool_seed_tail": VectorAccess.K | VectorAccess.GATE | _RINGS,
    "kpool_tail_update": VectorAccess.K | VectorAccess.GATE | VectorAccess.APE | VectorAccess.OUT | _RINGS,
}
INDEX_ARRAYS = {
    "kpool_compress": 3,  # input_row_offsets, cache_lengths, pool_row_offsets
    "kpool_ring_close": 3,  # input_row_offsets, cache_lengths, slot_idx
    "kpool_seed_tail": 3,
    "kpool_tail_update": 2,  # positions, slot_idx
    "kpool_expand_topk": 3,  # pool_ids, input_row_offsets, cache_lengths
    "kpool_compress_fp8": 4,  # input_row_offsets, cache_lengths, pool_row_offsets, slots or block_table
    "kpool_ring_close_fp8": 4,  # input_row_offsets, cache_lengths, slot_idx, slots or block_table
    "kpool_tail_update_fp8": 3,  # positions, slot_idx, block_table
}

# Files under kernels/: one per kernel family. The benchmark-only baseline
# lives apart, under kernels/bench/.
COMPRESS_SOURCE = "kpool_compress.cu"
RING_SOURCE = "kpool_ring.cu"
EXPAND_SOURCE = "kpool_expand.cu"
BASELINE_SOURCE = "bench/kpool_compress_baseline.cu"
HADAMARD_SOURCE = "kpool_hadamard_quant.cu"


def instantiation(kernel: str, *parameters: np.dtype | int) -> str:
    """``kernel<...>``: element dtypes as kernels/kpool_common.cuh's storage types, index dtypes as C integer
    types, sizes and masks as integers."""
    spelled = [
        (ELEMENT_CTYPES.get(p) or INDEX_CTYPES[p]) if isinstance(p, np.dtype) else str(int(p)) for p in parameters
    ]
    return f"{kernel}<{', '.join(spelled)}>"


def _indexes(kernel: str, index_dtypes: tuple[np.dtype, ...] | None) -> tuple[np.dtype, ...]:
    dtypes = (INT32,) * INDEX_ARRAYS[kernel] if index_dtypes is None else tuple(np.dtype(d) for d in index_dtypes)
    if len(dtypes) != INDEX_ARRAYS[kernel]:
        raise ValueError(f"{kernel} takes {INDEX_ARRAYS[kernel]} index dtypes, got {len(dtypes)}")
    return dtypes


def compress_kernel_name(
    k_dtype: np.dtype,
    gate_dtype: np.dtype,
    out_dtype: np.dtype,
    head_dim: int,
    kpool: int,
    vector: int | None = None,
    index_dtypes: tuple[np.dtype, ...] | None = None,
    *,
    rotate: bool = False,
) -> str:
    """``kpool_compress<KT, GT, OT, HEAD_DIM, KPOOL, VECTOR, ROTATE, IO, IC, IP>``.

    ``vector`` defaults to every operand aligned, ``index_dtypes`` (of
    input_row_offsets, cache_lengths, pool_row_offsets) to int32.
    """
    kernel = "kpool_compress"
    mask = ALIGNED[kernel] if vector is None else vector
    types = (np.dtype(k_dtype), np.dtype(gate_dtype), np.dtype(out_dtype))
    return instantiation(kernel, *types, head_dim, kpool, mask, int(rotate), *_indexes(kernel, index_dtypes))


def compress_fp8_kernel_name(
    k_dtype: np.dtype,
    gate_dtype: np.dtype,
    head_dim: int,
    kpool: int,
    vector: int,
    target: int,
    index_dtypes: tuple[np.dtype, ...] | None = None,
) -> str:
    """``kpool_compress_fp8<KT, GT, HEAD_DIM, KPOOL, VECTOR, TARGET, IO, IC, IP, ID>``: TARGET is
    ``kp::Fp8Target`` (rows, slots, block table), ID the dtype of slots or the block table."""
    kernel = "kpool_compress_fp8"
    types = (np.dtype(k_dtype), np.dtype(gate_dtype))
    return instantiation(kernel, *types, head_dim, kpool, vector, target, *_indexes(kernel, index_dtypes))


def ring_fp8_kernel_name(
    kernel: str,
    dtype: np.dtype,
    gate_dtype: np.dtype,
    head_dim: int,
    kpool: int,
    vector: int,
    target: int,
    index_dtypes: tuple[np.dtype, ...] | None = None,
    *,
    split: bool = False,
) -> str:
    """``kpool_ring_close_fp8<T, G, HEAD_DIM, KPOOL, VECTOR, TARGET, IO, IC, IS, ID>`` or
    ``kpool_tail_update_fp8<T, G, HEAD_DIM, KPOOL, VECTOR, SPLIT, TARGET, IPOS, IS, ID>``."""
    layout = (int(split),) if kernel == "kpool_tail_update_fp8" else ()
    types = (np.dtype(dtype), np.dtype(gate_dtype))
    return instantiation(kernel, *types, head_dim, kpool, vector, *layout, target, *_indexes(kernel, index_dtypes))


def hadamard_quant_kernel_name(dtype: np.dtype, head_dim: int, vector: int) -> str:
    """``kpool_hadamard_quant<T, HEAD_DIM, VECTOR>``, the query side's rotate-and-quantize kernel."""
    return instantiation("kpool_hadamard_quant", np.dtype(dtype), head_dim, vector)


def baseline_kernel_name(dtype: np.dtype, head_dim: int, kpool: int) -> str:
    """``kpool_compress_baseline<T, HEAD_DIM, KPOOL>``, the benchmark's upstream-geometry kernel."""
    return instantiation("kpool_compress_baseline", np.dtype(dtype), head_dim, kpool)


def ring_kernel_name(
    kernel: str,
    dtype: np.dtype,
    out_dtype: np.dtype | None,
    head_dim: int,
    kpool: int,
    vector: int | None = None,
    index_dtypes: tuple[np.dtype, ...] | None = None,
    *,
    gate_dtype: np.dtype | None = None,
    split: bool = False,
    rotate: bool = False,
) -> str:
    """``kpool_ring_close<T, G, OT, HEAD_DIM, KPOOL, VECTOR, ROTATE, ...index types>`` and its siblings.

    Seed tail has no output type and no ROTATE; tail update takes ``SPLIT``
    (the ring is a pair of arrays) after VECTOR, then ROTATE. ``gate_dtype``
    (G: gate's and the gate ring's) defaults to ``dtype``; the rest as
    :func:`compress_kernel_name`.
    """
    gate = np.dtype(dtype if gate_dtype is None else gate_dtype)
    types = (np.dtype(dtype), gate) if out_dtype is None else (np.dtype(dtype), gate, np.dtype(out_dtype))
    mask = ALIGNED[kernel] if vector is None else vector
    layout = {
        "kpool_ring_close": (int(rotate),),
        "kpool_tail_update": (int(split), int(rotate)),
    }.get(kernel, ())
    return instantiation(kernel, *types, head_dim, kpool, mask, *layout, *_indexes(kernel, index_dtypes))


def expand_kernel_name(
    kpool: int, index_dtypes: tuple[np.dtype, ...] | None = None, paged: bool = False, compact: bool = False
) -> str:
    """``kpool_expand_topk<KPOOL, IPID, IO, IC, PAGED, COMPACT>``; index dtypes default to int32."""
    kernel = "kpool_expand_topk"
    return instantiation(kernel, kpool, *_indexes(kernel, index_dtypes), int(paged), int(compact))
