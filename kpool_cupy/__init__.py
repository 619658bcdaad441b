"""kpool-cupy: the k-pool compression kernel of sparse-attention indexers, for CuPy.

    logits[m, c] = gate[member m, c] + ape[m, c]
    w[:, c]      = softmax over m of logits[:, c]     # per channel, not per member
    pooled[p, c] = sum_m w[m, c] * k[member m, c]

``kpool_compress`` runs on the GPU through CuPy; ``reference.kpool_compress``
(NumPy) and ``emulate.kpool_compress`` (the CUDA source run on the CPU) take the
same arguments on host arrays. Importing the package needs no CuPy.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from . import emulate, reference
from ._cupy_backend import kpool_compress
from ._cupy_ring import kpool_expand_topk, kpool_ring_close, kpool_seed_tail, kpool_tail_update
from ._nvrtc import compile_ptx
from ._pools import pool_row_offsets

try:
    __version__ = version("kpool-cupy")
except PackageNotFoundError:  # a source checkout on PYTHONPATH
    __version__ = "0.0.0+unknown"

__all__ = [
    "__version__",
    "compile_ptx",
    "emulate",
    "kpool_compress",
    "kpool_expand_topk",
    "kpool_ring_close",
    "kpool_seed_tail",
    "kpool_tail_update",
    "pool_row_offsets",
    "reference",
]
