"""The NumPy reference of the ops, each kernel written in NumPy and vectorized over pools and channels.

    logits[m, c] = gate[member m, c] + ape[m, c]
    w[:, c]      = softmax over m of logits[:, c]
    pooled[p, c] = sum_m w[m, c] * k[member m, c]

The softmax is per channel, not per member. The arithmetic is float32 like
the kernel's (or float64 with ``accumulate="float64"``), rounded once to the
output dtype; it takes the kernel's chunks and per-chunk passes, with exp and
a division where the kernel uses exp2 and a reciprocal, so the two agree to
rounding (the bound of tools/accuracy.py), not bit for bit.
"""

from .backends.reference import BINDING as _REFERENCE
from .backends.reference_kernels import member_rows, pool_members
from .functions import *  # noqa: F403  (the defs, for readers and type checkers; bound below)
from .functions import DEFINITIONS as _DEFINITIONS
from .ops.framework.binding import bind_into as _bind_into

# Every op's def, bound to this module's backend; the names come from the defs.
_OP_NAMES = _bind_into(globals(), _DEFINITIONS.values(), _REFERENCE)

__all__ = [
    *_OP_NAMES,
    "member_rows",
    "pool_members",
]
