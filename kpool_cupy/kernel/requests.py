"""Which request a token belongs to and which pools it sees, on the host, step for step as the kernels.

``kp::find_request``, ``kp::request_rows`` and ``kp::pools_visible``
(kernels/kpool_common.cuh), and which pool ids an expansion turns into
positions (kernels/kpool_expand.cuh), for many items at once.
The reference kernels run them, and an op that sizes a result from the
offsets without validating them does too: unsorted or out-of-range garbage
lands where the kernel lands, never outside an array.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import INT32_MAX


def find_request(offsets: np.ndarray, batch: int, items: np.ndarray) -> np.ndarray:
    """``kp::find_request`` for every item at once: the last b in [0, batch) with offsets[b] <= item.

    The kernel's binary search step for step, so unsorted garbage offsets
    (``validate=False``) give the request the kernel picks.
    """
    lo = np.zeros(items.shape, np.int64)
    hi = np.full(items.shape, batch - 1, np.int64)
    while (active := lo < hi).any():
        mid = lo + (hi - lo + 1) // 2
        right = offsets[np.where(active, mid, 0)] <= items
        lo = np.where(active & right, mid, lo)
        hi = np.where(active & ~right, mid - 1, hi)
    return lo


def request_rows(offsets: np.ndarray, cached: np.ndarray, request: np.ndarray, total_tokens: int):
    """``kp::request_rows`` for many requests: row begin and end, cached length, and whether they are usable."""
    begin, end, length = offsets[request], offsets[request + 1], cached[request]
    return begin, end, length, (begin >= 0) & (end <= total_tokens) & (begin <= end) & (length >= 0)


def pools_visible(cached: np.ndarray, local: np.ndarray, kpool: int) -> np.ndarray:
    """``kp::pools_visible``: (cached + local + 1) // kpool without overflow, 2^63 - 1 where it would pass it."""
    whole, rest = cached // kpool, (cached % kpool + local + 1) // kpool
    top = np.iinfo(np.int64).max
    return np.where(whole > top - rest, top, whole + rest)


def token_visibility(
    input_row_offsets: np.ndarray, cache_lengths: np.ndarray, num_tokens: int, kpool: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each token's request, whether the kernel places it (its request's rows are usable and hold it), and the
    pools it sees (0 where it is not placed). Offsets and lengths as the kernel reads them: their raw values in
    int64 (uint32's all-ones is 4294967295, not -1)."""
    offsets = np.asarray(input_row_offsets).astype(np.int64)
    lengths = np.asarray(cache_lengths).astype(np.int64)
    batch = lengths.shape[0]
    tokens = np.arange(num_tokens, dtype=np.int64)
    if batch <= 0:  # no request: no token is placed
        zeros = np.zeros(num_tokens, np.int64)
        return zeros, np.zeros(num_tokens, bool), zeros
    request = find_request(offsets, batch, tokens)
    begin, end, cached, usable = request_rows(offsets, lengths, request, num_tokens)
    placed = usable & (tokens >= begin) & (tokens < end)
    visible = np.where(placed, pools_visible(np.where(placed, cached, 0), tokens - begin, kpool), 0)
    return request, placed, visible


def ids_with_positions(ids: np.ndarray, kpool: int) -> np.ndarray:
    """The pool ids (int64) an expansion turns into positions: those whose last position, ``id * kpool + kpool -
    1``, fits int32. Every other id, -1 included, expands to -1 in all its columns."""
    return (ids >= 0) & (ids <= (INT32_MAX - (kpool - 1)) // kpool)
