"""kpool_ring_close_fp8: ring close with the FP8 epilogue fused (``fp8_form``), into rows or a paged cache.

Request b's closed pool lands at output row b, at ``slots[b]``, or through
block table row b.
"""

from __future__ import annotations

from ..kernel.declarations import RING_CLOSE_FP8
from .fp8_form import PlainOp, RowsRule, fp8_docs, fp8_form
from .ring_close import SPEC as PLAIN_SPEC
from .ring_close import RingCloseCall, pool_into
from .spec import Operand

GPU_DOC = """Close each request's pending pool into an FP8 key: :func:`kpool_ring_close` with the FP8 epilogue fused.

The pool is :func:`kpool_ring_close`'s; its bytes and scale are
:func:`kpool_compress_fp8`'s for the same pool, bit for bit (head_dim a
power of two from 8 to 256). ``tail``, ``k``, ``gate``, ``ape``,
offsets, lengths and ``slot_idx`` as :func:`kpool_ring_close`; every ring
form (longer, split, padded) is taken.

Parameters
----------
round_scale
    As :func:`kpool_compress_fp8`.
cache
    As :func:`kpool_compress_fp8`; request b's pool goes to slot
    ``slots[b]`` (int64 or int32 ``[batch]``, -1 skips) or through
    ``block_table`` row b.
out, out_scale
    Without ``cache``: uint8 ``[>= batch, head_dim]`` and float32 ``[out
    rows]``, given together; new zeroed ones otherwise.
closed
    Optional int32 ``[>= batch]``: the pool id closed, or -1.
validate
    As :func:`kpool_ring_close`, and every closed pool lands in the cache in
    a slot of its own.

Returns
-------
(values, scales, closed), or closed when writing the cache
    values uint8 ``[batch, head_dim]``, scales float32 ``[batch]``; rows of
    requests that close nothing are left alone.
"""

DOCS = fp8_docs("kpool_ring_close_fp8", GPU_DOC)

RING_SLOTS = Operand("slots", "[batch] int64 or int32: each request's cache slot, -1 to skip", optional=True)


def rows_rule(call: RingCloseCall) -> RowsRule:
    """One row, slot or block table row per request."""
    return RowsRule(batch=call.batch, min_rows=(call.batch, "one per request"), slot_rows=call.batch)


PLAIN = PlainOp(PLAIN_SPEC, pool_into, rows_rule)
SPEC = fp8_form("kpool_ring_close_fp8", PLAIN, RING_CLOSE_FP8, RING_SLOTS, DOCS)
