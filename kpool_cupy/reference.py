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
from .ops import OPS as _OPS
from .ops.binding import bind as _bind

# In the order of ops.OPS; tests/test_public_api.py checks each name.
(
    kpool_compress,
    kpool_ring_close,
    kpool_seed_tail,
    kpool_tail_update,
    kpool_expand_topk,
    kpool_compress_fp8,
    kpool_ring_close_fp8,
    kpool_tail_update_fp8,
    hadamard_quant_fp8,
) = (_bind(spec, _REFERENCE) for spec in _OPS)

__all__ = [
    "hadamard_quant_fp8",
    "kpool_compress",
    "kpool_compress_fp8",
    "kpool_expand_topk",
    "kpool_ring_close",
    "kpool_ring_close_fp8",
    "kpool_seed_tail",
    "kpool_tail_update",
    "kpool_tail_update_fp8",
    "member_rows",
    "pool_members",
]
