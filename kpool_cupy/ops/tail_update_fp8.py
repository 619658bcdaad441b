"""kpool_tail_update_fp8: the decode step with the FP8 epilogue fused (``fp8_form``), into rows or a paged cache.

Request r's j-th closed pool lands at output row ``[r, j]`` or through
block table row r.
"""

from __future__ import annotations

from ..kernel.declarations import TAIL_UPDATE_FP8
from .fp8_form import PlainOp, RowsRule, fp8_docs, fp8_form
from .tail_update import SPEC as PLAIN_SPEC
from .tail_update import TailUpdateCall, pool_into

DOCS = fp8_docs("kpool_tail_update_fp8")


def rows_rule(call: TailUpdateCall) -> RowsRule:
    """Rows ``[R, ceil(next_n / kpool)]``, C-contiguous; a block table row per request; no slots."""
    return RowsRule(batch=call.requests, leading=(call.requests, call.pools_per_request))


PLAIN = PlainOp(PLAIN_SPEC, pool_into, rows_rule)
SPEC = fp8_form("kpool_tail_update_fp8", PLAIN, TAIL_UPDATE_FP8, None, DOCS)
