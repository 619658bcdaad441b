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

DOCS = fp8_docs("kpool_ring_close_fp8")

RING_SLOTS = Operand("slots", "[batch] int64 or int32: each request's cache slot, -1 to skip", optional=True)


def rows_rule(call: RingCloseCall) -> RowsRule:
    """One row, slot or block table row per request."""
    return RowsRule(batch=call.batch, min_rows=(call.batch, "one per request"), slot_rows=call.batch)


PLAIN = PlainOp(PLAIN_SPEC, pool_into, rows_rule)
SPEC = fp8_form("kpool_ring_close_fp8", PLAIN, RING_CLOSE_FP8, RING_SLOTS, DOCS)
