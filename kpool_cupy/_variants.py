"""The one place that spells a kernel instantiation.

The same string goes to NVRTC's name expressions, to CuPy's ``get_function``
and into the emulator's launch shim, so the three cannot disagree.
"""

from __future__ import annotations

import numpy as np

from ._dtypes import ELEMENT_CTYPES

COMPRESS_SOURCE = "kpool_compress.cu"


def compress_kernel_name(
    k_dtype: np.dtype, gate_dtype: np.dtype, out_dtype: np.dtype, head_dim: int, kpool: int
) -> str:
    """``kpool_compress<KT, GT, OT, HEAD_DIM, KPOOL>`` for these element types and sizes."""
    types = ", ".join(ELEMENT_CTYPES[d] for d in (k_dtype, gate_dtype, out_dtype))
    return f"kpool_compress<{types}, {int(head_dim)}, {int(kpool)}>"


BASELINE_SOURCE = "kpool_compress_baseline.cu"


def baseline_kernel_name(dtype: np.dtype, head_dim: int, kpool: int) -> str:
    """``kpool_compress_baseline<T, HEAD_DIM, KPOOL>``, the benchmark's upstream-geometry kernel."""
    return f"kpool_compress_baseline<{ELEMENT_CTYPES[dtype]}, {int(head_dim)}, {int(kpool)}>"


RING_SOURCE = "kpool_ring.cu"
EXPAND_SOURCE = "kpool_expand.cu"


def ring_kernel_name(kernel: str, dtype: np.dtype, out_dtype: np.dtype | None, head_dim: int, kpool: int) -> str:
    """``kpool_ring_close<T, OT, HEAD_DIM, KPOOL>`` and its siblings; seed tail has no output type."""
    types = ELEMENT_CTYPES[dtype] if out_dtype is None else f"{ELEMENT_CTYPES[dtype]}, {ELEMENT_CTYPES[out_dtype]}"
    return f"{kernel}<{types}, {int(head_dim)}, {int(kpool)}>"


def expand_kernel_name(kpool: int) -> str:
    return f"kpool_expand_topk<{int(kpool)}>"
