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

GPU_DOC = """Pool each complete k-pool into an FP8 key: rotated, scaled, e4m3fn, into rows or a paged cache.

One fused kernel: the pooling of :func:`kpool_compress` (float32), then
per pool::

    x = bf16(pooled)
    y = bf16(B(x) * fl32(1/sqrt(D)))         B: Walsh-Hadamard butterflies (a+b, a-b), strides 1 .. D/2
    v = fl32(max(max_c |y_c|, 1e-4) * fl32(1/448))
    s = the smallest power of two >= v       (round_scale=True; s = v when False)
    q = e4m3fn(clamp(fl32(y / s), -448, 448))

Only q's bytes and s are written. head_dim must be a power of two from 8
to 256. The values are bit for bit the epilogue applied to
``kpool_compress``'s own float32 result.

Parameters
----------
k, gate, ape, input_row_offsets, cache_lengths, pool_row_offsets
    As :func:`kpool_compress`.
round_scale
    Round each scale up to a power of two (ue8m0), exactly (default).
cache
    uint8 ``[num_blocks, block_size, head_dim + 4]``: each page holds its
    ``block_size * head_dim`` value bytes (entry t at byte t * head_dim),
    then ``block_size`` float32 scales (entry t at byte
    ``block_size * head_dim + 4 * t``); pages at any stride (a multiple of
    4 bytes), 4-byte aligned. Flat slot s is page s // block_size, entry
    s % block_size. Nothing else in the cache changes.
slots
    With ``cache``: int64 or int32 ``[>= total_pools]``, output pool p's flat
    slot; -1 skips the pool.
block_table
    With ``cache``, instead of ``slots``: int32 ``[batch, max_blocks]``;
    request b's pool q (positions ``[q*kpool, (q+1)*kpool)``) goes to slot
    ``block_table[b, q // block_size] * block_size + q % block_size``.
out, out_scale
    Without ``cache``: uint8 ``[>= total_pools, head_dim]`` (e4m3fn bit
    patterns) and float32 ``[out rows]``, given together; new ones
    otherwise.
validate
    Check offsets and that every pool lands in the cache in a slot of its
    own (device-to-host copies). With ``validate=False`` garbage slots and
    block tables write nothing outside the cache.
stream
    As :func:`kpool_compress`.

Returns
-------
tuple of cupy.ndarray, or None
    ``(values, scales)`` without ``cache``; None when writing the cache.
"""

ACCUMULATE_DOC = """Parameters
----------
accumulate
    ``"float32"`` (the kernel's arithmetic) or ``"float64"`` for the pooling.
"""

SLOTS_IN = Operand("slots", "[>= total_pools] int64 or int32: each pool's cache slot, -1 to skip", optional=True)
DOCS = fp8_docs("kpool_compress_fp8", GPU_DOC, ACCUMULATE_DOC)


def rows_rule(call: CompressCall) -> RowsRule:
    """Rows at any stride, counted against the pools written; a block table row per request."""
    return RowsRule(batch=call.batch)


PLAIN = PlainOp(PLAIN_SPEC, pool_into, rows_rule)
SPEC = fp8_form("kpool_compress_fp8", PLAIN, COMPRESS_FP8, SLOTS_IN, DOCS)
