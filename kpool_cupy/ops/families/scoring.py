"""Scoring: query tokens against the pooled FP8 cache, as kpool_index_logits_fp8 and the fused select read it.

    logit[t, p] = sum over h of weights[t, h] * relu(s[p] * dot(q[t, h, :], k[p, :]))

The operands the two share (q, weights, the cache and its block table), their checks, the page layout the
cache must have, and the tensor-core instruction a backend runs."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...dtypes import FLOAT32, dtype_name
from ...kernel.codes import data_pointer
from ...kernel.declarations import MMA_E4M3
from ...kernel.geometry import LARGE_BATCH, LaunchGeometry, index_block_pools, index_geometry
from ...kernel.pages import FP8_PAGES, PageLayout
from ..framework.checks import (
    as_size,
    check_batch_index,
    check_block_table,
    check_nowhere,
    definitely,
    dtype_fail,
    fail,
    require_array,
)
from ..framework.engine_forms import E4M3, PAGED_CACHE
from ..framework.operands import CACHE_LENGTHS, INPUT_ROW_OFFSETS, KPOOL
from ..framework.spec import CallArgs, Operand
from .fp8_target import UINT8, check_cache_layout, check_rotation_head_dim

HEAD_DIMS = (64, 128, 256)
# The pages the scorer reads: what kp::Fp8Sink writes.
CACHE_LAYOUT = FP8_PAGES


MAX_HEADS = 128


# A logits row is at most this wide: pool ids stay int32 (2^31 - 1 pools is a context of 2^31 tokens at kpool 1).
MAX_POOLS = (1 << 31) - 1


def check_rows_of(name: str, array: Any, dtype: np.dtype, ndim: int, shape_rule: str, dtype_rule: str = "") -> None:
    """``dtype_rule``: what the error says is taken, where more than ``dtype`` is (an engine form)."""
    require_array(name, array)
    if np.dtype(array.dtype) != dtype:
        raise dtype_fail(name, dtype_rule or f"dtype {dtype_name(dtype)}", dtype_name(np.dtype(array.dtype)))
    if array.ndim != ndim:
        raise fail(name, f"a {ndim}-D array {shape_rule}", f"shape {tuple(array.shape)}")
    if not definitely(array.size != 0):  # an empty array (or, traced, one that may be): no stride is used
        return
    if definitely(array.shape[-1] > 1) and array.strides[-1] != array.dtype.itemsize:
        raise fail(name, "a contiguous last dim", f"byte strides {array.strides}")
    if any(definitely(s < 0) or definitely(s % array.dtype.itemsize != 0) for s in array.strides):
        raise fail(name, "non-negative strides in whole elements", f"byte strides {array.strides}")


def check_scoring_inputs(
    a: CallArgs, layout: PageLayout = CACHE_LAYOUT, query: tuple[np.dtype, str] = (UINT8, "e4m3fn bytes")
) -> tuple[int, int, int, int, int, int]:
    """q, weights, the cache, its table, offsets and lengths, as every scoring op takes them: (num_tokens, heads,
    head_dim, pages, block_size, batch). ``layout``: the cache's pages; ``query``: q's dtype and what it holds
    (another key format is another layout and query, not another check)."""
    taken = f"dtype {dtype_name(query[0])} ({query[1]})" + (" or float8_e4m3fn" if query[0] == UINT8 else "")
    check_rows_of("q", a.q, query[0], 3, f"[num_tokens, heads, head_dim] ({query[1]})", taken)
    num_tokens, heads, head_dim = (as_size(n) for n in a.q.shape)
    if head_dim not in HEAD_DIMS:
        raise fail("q", f"head_dim (last dim) one of {', '.join(map(str, HEAD_DIMS))}", head_dim)
    if not 1 <= heads <= MAX_HEADS:
        raise fail("q", f"1 to {MAX_HEADS} heads (dim 1)", heads)
    check_rows_of("weights", a.weights, FLOAT32, 2, "[num_tokens, heads]")
    if tuple(a.weights.shape) != (num_tokens, heads):
        raise fail(
            "weights", f"shape [{num_tokens}, {heads}] (q's tokens and heads)", f"shape {tuple(a.weights.shape)}"
        )
    pages, block_size = check_cache_layout(a.cache, head_dim, writable=False, layout=layout)
    batch = check_batch_index(a.input_row_offsets, a.cache_lengths)
    check_block_table(a.cache_block_table, batch, name="cache_block_table")
    return num_tokens, heads, head_dim, pages, block_size, batch


# What a table too short for the visible pools often means: lengths that count the call's own tokens too.
LENGTHS_HINT = (
    "; cache_lengths counts each request's tokens before this call (an engine's seq_lens or context_lens, which "
    "include them, is cache_lengths plus the call's tokens)"
)


def check_table_covers(call: Any, table: np.ndarray, lengths: np.ndarray, offsets: np.ndarray) -> None:
    """Every pool a token sees has its page in the table, inside the cache (host arrays). ``call``: kpool, the
    cache's block_size and pages (an ``IndexLogitsCall``, or a scoring call's ``scoring``)."""
    counts = offsets[1:] - offsets[:-1]
    last = np.where(counts > 0, (lengths + counts) // call.kpool, 0)  # pools the request's last token sees
    columns = -(-last // call.block_size)
    wide = columns > table.shape[1]
    if wide.any():
        b = int(np.argmax(wide))
        raise fail(
            "cache_block_table",
            f"a column for every visible pool's page (request {b} sees {int(last[b])} pools, "
            f"block_size {call.block_size}{LENGTHS_HINT})",
            f"{table.shape[1]} columns",
        )
    used = np.arange(table.shape[1])[None, :] < columns[:, None]
    check_nowhere(
        used & ((table < 0) | (table >= call.pages)),
        "cache_block_table",
        f"pages in [0, {call.pages}) (num_blocks) for every visible pool{LENGTHS_HINT}",
        lambda b, column: f"{int(table[b, column])} at request {b}, column {column}",
    )


def check_scorer_head_dim(name: str, head_dim: int) -> None:
    """A head_dim the scorer's kernels take: the FP8 epilogue's (a power of two from 8 to 256), then 64, 128 or
    256."""
    check_rotation_head_dim(name, head_dim)
    if head_dim not in HEAD_DIMS:
        raise fail(name, "64, 128 or 256 for the scorer", head_dim)


def scoring_launch(head_dim: int) -> LaunchGeometry:
    """The scorer's launch over a large batch (e4m3 pool tiles), what the SASS report sizes blocks by."""
    return index_geometry(LARGE_BATCH, LARGE_BATCH, 1, index_block_pools(head_dim, MMA_E4M3))[0]


def query_values(q: Any, heads: int) -> dict[str, Any]:
    """The scoring kernels' query arguments: q, its token and head strides in bytes, and ``heads``. A single
    head's stride is passed as a whole row's (``head_dim`` bytes): a size-1 dimension's stride may be anything
    (NumPy and torch keep what a view gave it), and kp::score_token forms the addresses of rows g and g + 8 of
    each tile of 16 heads before it knows they exist, which with such a stride would overflow."""
    return {"q": q, "q_token_stride": q.strides[0], "q_head_stride": q.strides[1] if heads > 1 else q.shape[2],
            "heads": heads}  # fmt: skip


def aligned16(array: Any, *strides: int) -> bool:
    """Whether ``array``'s data and every stride given (in bytes) are multiples of 16: the 16-byte path's rule."""
    return data_pointer(array) % 16 == 0 and all(s % 16 == 0 for s in strides)


QUERY = Operand(
    "q", "[num_tokens, heads, head_dim] uint8 (e4m3fn bytes) or float8_e4m3fn; last dim contiguous", form=E4M3
)


WEIGHTS = Operand("weights", "[num_tokens, heads] float32")


POOLED_CACHE = Operand(
    "cache",
    "[num_blocks, block_size, head_dim + 4] uint8 (or DeepGEMM's [num_blocks, block_size, 1, head_dim + 4]): the "
    "pooled FP8 cache (read only)",
    form=PAGED_CACHE,
)


CACHE_BLOCK_TABLE = Operand("cache_block_table", "[batch, max_blocks] int32: each request's cache pages")


# What the scorer reads, in its order: the fused select takes the same first.
SCORING_PARAMETERS = (QUERY, WEIGHTS, POOLED_CACHE, CACHE_BLOCK_TABLE, INPUT_ROW_OFFSETS, CACHE_LENGTHS, KPOOL)
