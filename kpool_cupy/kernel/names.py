"""The one place that spells a kernel instantiation.

The same string goes to NVRTC's name expressions, to CuPy's ``get_function``
and into the emulator's launch shim, so the three cannot disagree.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import ELEMENT_CTYPES

# Files under kernels/: one per kernel family. The benchmark-only baseline
# lives apart, under kernels/bench/.
COMPRESS_SOURCE = "kpool_compress.cu"
RING_SOURCE = "kpool_ring.cu"
EXPAND_SOURCE = "kpool_expand.cu"
BASELINE_SOURCE = "bench/kpool_compress_baseline.cu"


def instantiation(kernel: str, *parameters: np.dtype | int) -> str:
    """``kernel<...>`` with dtypes spelled as kernels/kpool_common.cuh's storage types and sizes as integers."""
    spelled = [ELEMENT_CTYPES[p] if isinstance(p, np.dtype) else str(int(p)) for p in parameters]
    return f"{kernel}<{', '.join(spelled)}>"


def compress_kernel_name(
    k_dtype: np.dtype, gate_dtype: np.dtype, out_dtype: np.dtype, head_dim: int, kpool: int
) -> str:
    """``kpool_compress<KT, GT, OT, HEAD_DIM, KPOOL>`` for these element types and sizes."""
    return instantiation(
        "kpool_compress", np.dtype(k_dtype), np.dtype(gate_dtype), np.dtype(out_dtype), head_dim, kpool
    )


def baseline_kernel_name(dtype: np.dtype, head_dim: int, kpool: int) -> str:
    """``kpool_compress_baseline<T, HEAD_DIM, KPOOL>``, the benchmark's upstream-geometry kernel."""
    return instantiation("kpool_compress_baseline", np.dtype(dtype), head_dim, kpool)


def ring_kernel_name(kernel: str, dtype: np.dtype, out_dtype: np.dtype | None, head_dim: int, kpool: int) -> str:
    """``kpool_ring_close<T, OT, HEAD_DIM, KPOOL>`` and its siblings; seed tail has no output type."""
    types = (np.dtype(dtype),) if out_dtype is None else (np.dtype(dtype), np.dtype(out_dtype))
    return instantiation(kernel, *types, head_dim, kpool)


def expand_kernel_name(kpool: int) -> str:
    """``kpool_expand_topk<KPOOL>``."""
    return instantiation("kpool_expand_topk", kpool)
