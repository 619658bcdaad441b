"""kpool_tail_update_fp8: the decode step with the FP8 epilogue fused (``fp8_form``), into rows or a paged cache.

Request r's j-th closed pool lands at output row ``[r, j]`` or through
block table row r.
"""

from __future__ import annotations

from ..kernel.declarations import TAIL_UPDATE_FP8
from .fp8_form import PlainOp, RowsRule, fp8_docs, fp8_form
from .tail_update import SPEC as PLAIN_SPEC
from .tail_update import TailUpdateCall, pool_into

GPU_DOC = """The decode step into FP8 keys: :func:`kpool_tail_update` with the FP8 epilogue fused.

The ring, positions and closings are :func:`kpool_tail_update`'s (every
ring form, speculative steps included); each closed pool's bytes and scale
are :func:`kpool_compress_fp8`'s for the same pool, bit for bit (head_dim a
power of two from 8 to 256).

Speculative steps write every pool their tokens close, drafts included: with
``cache`` a pool closed by a draft that is then rejected stays in its slot
until the pool closes again with accepted tokens, which rewrites it. A
scorer reads only the pools the accepted length makes visible
(``q < accepted // kpool``), and the block table must cover the drafts'
positions too (the README's FP8 example runs such a schedule).

Parameters
----------
round_scale
    As :func:`kpool_compress_fp8`.
cache, block_table
    As :func:`kpool_compress_fp8`, given together: request r's pool q goes
    to slot ``block_table[r, q // block_size] * block_size + q % block_size``
    (row r of the call is block table row r).
out, out_scale
    Without ``cache``: uint8 ``[R, ceil(next_n / kpool), head_dim]`` and
    float32 ``[R, ceil(next_n / kpool)]``, C-contiguous, given together;
    new zeroed ones otherwise.
closed
    Optional int32 ``[R, ceil(next_n / kpool)]``.
validate
    As :func:`kpool_tail_update`, and every closed pool lands in the cache in
    a slot of its own.

Returns
-------
(values, scales, closed), or closed when writing the cache
    closed lists the pool ids closed in order, padded with -1 (those rows
    are left alone).
"""

DOCS = fp8_docs("kpool_tail_update_fp8", GPU_DOC)


def rows_rule(call: TailUpdateCall) -> RowsRule:
    """Rows ``[R, ceil(next_n / kpool)]``, C-contiguous; a block table row per request; no slots."""
    return RowsRule(batch=call.requests, leading=(call.requests, call.pools_per_request))


PLAIN = PlainOp(PLAIN_SPEC, pool_into, rows_rule)
SPEC = fp8_form("kpool_tail_update_fp8", PLAIN, TAIL_UPDATE_FP8, None, DOCS)
