"""The ops on the CPU, running their CUDA source itself.

    pooled[p, c] = sum_m softmax_m(gate[member m, c] + ape[m, c]) * k[member m, c]

The kernels in kernels/ are compiled by the host C++ compiler (``CXX``,
default ``c++``) with kernels/emulator/ standing in for the CUDA
built-ins, then launched over the grid and block geometry the GPU launcher
computes, one thread after another (threads that meet at shuffles or
barriers run as cooperating fibers). What this checks is the kernels' index
math, bounds checks and arithmetic, not the GPU's timing. Contraction is
pinned (neither compiler fuses what the source does not spell as ``fmaf``)
and the GPU's flush-to-zero is reproduced; what differs is the softmax's
``exp2`` and reciprocal, correctly rounded here and approximate on the GPU
(at most 2 and 1 ulp), so a GPU result is compared within the README's
error bound, not bit for bit.

Each variant is built once into a per-user cache folder (``$XDG_CACHE_HOME``
or ``~/.cache``, then ``kpool-cupy/emulate``). ``KPOOL_CUPY_EMULATE_CXXFLAGS``
is appended to the compile flags and is part of the cache key, so a test can
build with ``-fsanitize=address``.
"""

from .backends.emulate import BINDING as _EMULATE
from .emulator.launch import launch
from .emulator.toolchain import BASE_FLAGS, FLAGS_VARIABLE, CompilerNotFoundError, cache_dir, compiler, load_variant
from .functions import *  # noqa: F403  (the defs, for readers and type checkers; bound below)
from .functions import DEFINITIONS as _DEFINITIONS
from .ops.framework.binding import bind_into as _bind_into

# Every op's def, bound to this module's backend; the names come from the defs.
_OP_NAMES = _bind_into(globals(), _DEFINITIONS.values(), _EMULATE)

__all__ = [
    *_OP_NAMES,
    "BASE_FLAGS",
    "FLAGS_VARIABLE",
    "CompilerNotFoundError",
    "cache_dir",
    "compiler",
    "launch",
    "load_variant",
]
