"""kpool_compress_fp8: kpool_compress with the FP8 epilogue fused (``fp8_form``), into rows or a paged cache.

The values equal the epilogue applied to kpool_compress's own float32
result; a pool lands at output row p, at ``slots[p]``, or through its
request's block table row.
"""

from __future__ import annotations

from ..kernel.declarations import COMPRESS_FP8
from .compress import SPEC as PLAIN_SPEC
from .compress import CompressCall, pool_into
from .fp8_form import PlainOp, RowsRule, fp8_docs, fp8_form
from .spec import Operand

ACCUMULATE_DOC = """Parameters
----------
accumulate
    ``"float32"`` (the kernel's arithmetic) or ``"float64"`` for the pooling.
"""

SLOTS_IN = Operand("slots", "[>= total_pools] int64 or int32: each pool's cache slot, -1 to skip", optional=True)
DOCS = fp8_docs("kpool_compress_fp8", ACCUMULATE_DOC)


def rows_rule(call: CompressCall) -> RowsRule:
    """Rows at any stride, counted against the pools written; a block table row per request."""
    return RowsRule(batch=call.batch)


PLAIN = PlainOp(PLAIN_SPEC, pool_into, rows_rule)
SPEC = fp8_form("kpool_compress_fp8", PLAIN, COMPRESS_FP8, SLOTS_IN, DOCS)
