"""The index scorer in NumPy: what the reference backend runs for ``kpool_index_logits_fp8``.

    logits[t, p] = sum over h of weights[t, h] * relu(s[p] * dot(q[t, h, :], k[p, :]))   p < visible(t)

The e4m3fn bytes are decoded exactly; each dot product is exact in float64
(a product of two e4m3 values has 8 significant bits and lies in [2^-18,
2^18), so 256 of them sum without rounding), and the rest is float64 too,
rounded to float32 once. Tokens, requests, visibility and pages follow the
kernel step for step (``kp::find_request``, ``kp::request_rows``, the
table's bounds), so garbage indices with ``validate=False`` land where the
kernel lands: -inf where it writes -inf, nothing outside the arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from ..kernel.pages import FP8_PAGES
from ..kernel.requests import token_visibility
from ..ops.framework.spec import Launch
from .reference_kernels import expand_pool_ids, kernel_scalars

# Every e4m3fn byte's value (0x7f and 0xff are NaN), exactly, in float64.
E4M3_VALUES = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def e4m3_values(raw: np.ndarray) -> np.ndarray:
    """Exact float64 values of e4m3fn bytes."""
    return E4M3_VALUES[raw]


def relu_keep_nan(x: np.ndarray) -> np.ndarray:
    """relu that lets NaN through (``x < 0 ? 0 : x``)."""
    return np.where(x < 0, 0.0, x)


def index_logits_fp8(launch: Launch, accumulate: type[np.floating]) -> None:
    """``kpool_index_logits_fp8``: every token's logits, request by request, in float64."""
    s = kernel_scalars(launch)
    o = launch.operands
    score_rows(o, s.kpool, s.block_size, s.pages, s.max_pools, o["out"])


def score_rows(o: dict, kpool: int, block_size: int, pages: int, max_pools: int, out: np.ndarray) -> None:
    """The logits of every token into ``out[:, :max_pools]`` (-inf where it sees no pool or its page is missing).
    ``o``: the op's arrays by name (q, weights, cache, cache_block_table, offsets, lengths)."""
    q, weights, cache, table = (o[n] for n in ("q", "weights", "cache", "cache_block_table"))
    num_tokens, _, head_dim = q.shape
    out[:, :max_pools] = -np.inf
    request, known, visible = token_visibility(o["input_row_offsets"], o["cache_lengths"], num_tokens, kpool)
    for b in np.unique(request[known]):
        rows = np.flatnonzero(known & (request == b))
        count = int(min(visible[rows].max(), max_pools))
        if count <= 0:
            continue
        pools = np.arange(count, dtype=np.int64)
        column = pools // block_size
        present = column < table.shape[1]
        page = np.full(count, -1, np.int64)
        page[present] = table[b, column[present]]
        present &= (page >= 0) & (page < pages)
        entry = pools % block_size
        keys = np.zeros((count, head_dim), np.float64)
        scales = np.zeros(count, np.float64)
        for p in np.flatnonzero(present):
            page_view = cache[int(page[p])].reshape(-1)  # block_size rows of values, then the scales
            first = FP8_PAGES.value_offset(head_dim, int(entry[p]))
            keys[p] = e4m3_values(page_view[first : first + head_dim])
            at = FP8_PAGES.scale_offset(block_size, head_dim, int(entry[p]))
            scale_bytes = page_view[at : at + FP8_PAGES.scale_bytes]
            scales[p] = scale_bytes.view(np.float32)[0]
        queries = e4m3_values(q[rows])  # [tokens, heads, D]
        dots = np.einsum("thd,pd->thp", queries, keys)
        terms = weights[rows].astype(np.float64)[:, :, None] * relu_keep_nan(scales[None, None, :] * dots)
        logits = terms.sum(axis=1).astype(np.float32)  # the one rounding
        seen = present[None, :] & (pools[None, :] < visible[rows][:, None])
        out[rows, :count] = np.where(seen, logits, np.float32(-np.inf))


def selection_order(row: np.ndarray) -> np.ndarray:
    """Pool ids of a logits row, best first: a larger logit first, equal logits by lower id (-0.0 equal to +0.0),
    every NaN last (by id)."""
    values = row.astype(np.float64)
    nan = np.isnan(values)
    descending = -np.where(nan, 0.0, values) + 0.0  # + 0.0: -0.0 becomes +0.0
    return np.lexsort((np.arange(row.shape[0]), descending, nan))  # the last key sorts first


def index_topk(launch: Launch, accumulate: type[np.floating]) -> None:
    """``kpool_index_topk``: each token's candidates (the scorer's visibility, cut at the logits' width), the
    best pool_topk by ``selection_order`` listed in ascending id, then expanded as ``kpool_expand_topk``."""
    s = kernel_scalars(launch)
    o = launch.operands
    _, _, visible = token_visibility(o["input_row_offsets"], o["cache_lengths"], s.num_tokens, s.kpool)
    select_rows(s, o, o["logits"], np.minimum(visible, s.logits_width))


def select_rows(s: Any, o: dict, logits: np.ndarray, candidates: np.ndarray) -> None:
    """Each token's best pool_topk of its ``candidates`` logits, expanded into ``o["positions"]``."""
    ids = np.full((s.num_tokens, s.pool_topk), -1, np.int64)
    for t in range(s.num_tokens):
        n = int(candidates[t])
        chosen = np.arange(n) if n <= s.pool_topk else np.sort(selection_order(logits[t, :n])[: s.pool_topk])
        ids[t, : chosen.shape[0]] = chosen
    expand_pool_ids(s, o, ids, s.kpool)


def index_select_fp8(launch: Launch, accumulate: type[np.floating]) -> None:
    """``kpool_index_select_fp8``: the reference scorer's logits over every visible pool the table reaches, then
    ``select_rows`` (what the two calls give, so bit for bit the same)."""
    s = kernel_scalars(launch)
    o = launch.operands
    _, _, visible = token_visibility(o["input_row_offsets"], o["cache_lengths"], s.num_tokens, s.kpool)
    visible = np.minimum(visible, s.table_columns * s.cache_block_size)  # the table's reach
    visible = np.minimum(visible, 2**31 - 1)  # pool ids are int32
    # Rows with at most pool_topk candidates need no logits; the others fit in memory on the CPU.
    width = int(np.where(visible > s.pool_topk, visible, 0).max(initial=0))
    logits = np.empty((s.num_tokens, width), np.float32)
    score_rows(o, s.kpool, s.cache_block_size, s.pages, width, logits)
    select_rows(s, o, logits, visible)


KERNELS: dict[str, Callable[[Launch, type[np.floating]], None]] = {
    "kpool_index_logits_fp8": index_logits_fp8,
    "kpool_index_topk": index_topk,
    "kpool_index_select_fp8": index_select_fp8,
}
