"""kpool-cupy: the k-pool compression kernel of sparse-attention indexers, for CuPy.

    logits[m, c] = gate[member m, c] + ape[m, c]
    w[:, c]      = softmax over m of logits[:, c]     # per channel, not per member
    pooled[p, c] = sum_m w[m, c] * k[member m, c]

``kpool_compress`` runs on the GPU through CuPy; ``reference.kpool_compress``
(NumPy) and ``emulate.kpool_compress`` (the CUDA source run on the CPU) take the
same arguments on host arrays. Importing the package needs no CuPy.

Every op is described once in ``kpool_cupy.ops`` and defined once in
``kpool_cupy.functions``; the functions here are those defs bound to the
GPU backend (``kpool_cupy.backends``).
"""

from . import emulate, reference
from .backends.cupy import BINDING as _GPU
from .functions import *  # noqa: F403  (the defs, for readers and type checkers; bound below)
from .functions import DEFINITIONS as _DEFINITIONS
from .kernel.nvrtc import compile_ptx
from .ops.compress_backward import compress_backward_workspace_bytes
from .ops.framework.binding import bind_into as _bind_into
from .ops.index_select_fp8 import index_select_workspace_bytes
from .ops.index_topk import index_topk_workspace_bytes
from .pool_offsets import pool_row_offsets

# Every op's def, bound to this module's backend; the names come from the defs.
_OP_NAMES = _bind_into(globals(), _DEFINITIONS.values(), _GPU)


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kpool-cupy")
    except PackageNotFoundError:  # a source checkout on PYTHONPATH
        return "0.0.0+unknown"


__version__ = _package_version()

__all__ = [
    *_OP_NAMES,
    "__version__",
    "compile_ptx",
    "emulate",
    "compress_backward_workspace_bytes",
    "index_select_workspace_bytes",
    "index_topk_workspace_bytes",
    "pool_row_offsets",
    "reference",
]
