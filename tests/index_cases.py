"""Random scoring calls for kpool_index_logits_fp8: a pooled FP8 cache in shuffled pages, e4m3 queries, weights."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass
class IndexCase:
    q: np.ndarray
    weights: np.ndarray
    cache: np.ndarray
    cache_block_table: np.ndarray
    input_row_offsets: np.ndarray
    cache_lengths: np.ndarray
    kpool: int

    @property
    def args(self) -> tuple[np.ndarray, ...]:
        return (self.q, self.weights, self.cache, self.cache_block_table, self.input_row_offsets, self.cache_lengths)

    def visible(self) -> np.ndarray:
        offsets = self.input_row_offsets.astype(np.int64)
        tokens = np.arange(offsets[-1])
        request = np.searchsorted(offsets, tokens, side="right") - 1
        return (self.cache_lengths.astype(np.int64)[request] + tokens - offsets[request] + 1) // self.kpool


def e4m3_bytes(rng: np.random.Generator, shape: tuple[int, ...], nan: bool = False) -> np.ndarray:
    """Uniform e4m3fn bytes over every finite value (NaN bytes 0x7f/0xff only with ``nan``)."""
    raw = rng.integers(0, 256, size=shape, dtype=np.uint8)
    if not nan:
        raw[(raw & 0x7F) == 0x7F] ^= np.uint8(1)  # 0x7e or 0xfe: the largest finite magnitude, 448
    return raw


def paged_cache(keys: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The scorer's cache ``[pages, block_size, head_dim + 4]`` of keys ``[pages, block_size, head_dim]`` (uint8)
    and scales ``[pages, block_size]`` (float32): a page's key rows, then its scales."""
    pages, block_size, head_dim = keys.shape
    cache = np.zeros((pages, block_size, head_dim + 4), np.uint8)
    flat = cache.reshape(pages, -1)
    flat[:, : block_size * head_dim] = keys.reshape(pages, -1)
    flat[:, block_size * head_dim :] = scales.astype(np.float32).view(np.uint8).reshape(pages, -1)
    return cache


def index_case(
    rng: np.random.Generator,
    *,
    head_dim: int = 128,
    heads: int = 16,
    kpool: int = 4,
    block_size: int = 16,
    counts: tuple[int, ...] = (3, 9, 1),
    cache_lengths: tuple[int, ...] | None = None,
    spare_pages: int = 3,
    spare_columns: int = 1,
    index_dtype: type = np.int32,
) -> IndexCase:
    """A ragged batch (``counts`` tokens a request after ``cache_lengths``, random if None), every visible pool
    in its own page entry, pages shuffled, a few pages and table columns spare (-1 columns past the last)."""
    batch = len(counts)
    lengths = np.array(
        cache_lengths if cache_lengths is not None else rng.integers(0, 6 * kpool, size=batch), dtype=np.int64
    )
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    pools = (lengths + np.array(counts)) // kpool  # what each request's last token sees
    columns = -(-pools // block_size)
    max_columns = int(columns.max(initial=0)) + spare_columns
    pages = int(columns.sum()) + spare_pages
    order = rng.permutation(pages)
    table = np.full((batch, max(max_columns, 1)), -1, np.int32)
    used = 0
    for b in range(batch):
        table[b, : columns[b]] = order[used : used + columns[b]]
        used += int(columns[b])
    keys = e4m3_bytes(rng, (pages, block_size * head_dim)).reshape(pages, block_size, head_dim)
    scales = np.exp2(rng.integers(-8, 4, size=(pages, block_size))).astype(np.float32)  # ue8m0 scales
    cache = paged_cache(keys, scales)
    tokens = int(offsets[-1])
    q = e4m3_bytes(rng, (tokens, heads, head_dim))
    weights = rng.standard_normal((tokens, heads)).astype(np.float32)
    return IndexCase(q, weights, cache, table, offsets.astype(index_dtype), lengths.astype(index_dtype), kpool)


def infinite_scale_case(heads: int) -> IndexCase:
    """Keys and queries of e4m3 1.0 only, weights 1: every head's dot is head_dim (64), so a key scores heads *
    64 at scale 1 and +inf at scale +inf (every third pool here). A column past the token's heads holds a zero
    query row, whose product with an infinite scale is NaN."""
    case = index_case(
        np.random.default_rng(heads), head_dim=64, heads=heads, block_size=16, counts=(3, 2), cache_lengths=(70, 130)
    )
    pages, block_size, _ = case.cache.shape
    scales = np.ones((pages, block_size), np.float32)
    scales.reshape(-1)[::3] = np.inf
    cache = paged_cache(np.full((pages, block_size, 64), 0x38, np.uint8), scales)
    q = np.full(case.q.shape, 0x38, np.uint8)
    weights = np.ones(case.weights.shape, np.float32)
    return IndexCase(q, weights, cache, case.cache_block_table, case.input_row_offsets, case.cache_lengths, 4)


def repaged(case: IndexCase, block_size: int, rng: np.random.Generator) -> IndexCase:
    """The same call with the cache in pages of ``block_size`` pools (a multiple of the case's), shuffled: each
    request's pool p keeps its key and scale, so every logit keeps its bits. A table entry of -1 or past the
    cache in ``case`` stays one for each new page holding a pool of it; rows no pool of a request reaches keep
    random bytes."""
    pages, old_size, width = case.cache.shape
    head_dim = width - 4
    keys = case.cache.reshape(pages, -1)[:, : old_size * head_dim].reshape(pages, old_size, head_dim)
    scales = case.cache.reshape(pages, -1)[:, old_size * head_dim :].view(np.float32).reshape(pages, old_size)
    pools = case.cache_block_table.shape[1] * old_size
    columns = -(-pools // block_size)
    new_pages = len(case.cache_lengths) * columns + 1
    new_keys = rng.integers(0, 0x7E, size=(new_pages, block_size, head_dim), dtype=np.uint8)
    new_scales = np.ones((new_pages, block_size), np.float32)
    order = rng.permutation(new_pages)
    table = np.full((len(case.cache_lengths), columns), -1, np.int32)
    for r in range(len(case.cache_lengths)):
        for c in range(columns):
            old = case.cache_block_table[r, c * block_size // old_size]  # block_size a multiple of old_size
            if old < 0 or old >= pages:
                table[r, c] = -1 if old < 0 else new_pages + 5
                continue
            page = order[r * columns + c]
            table[r, c] = page
            for e in range(block_size):
                pool = c * block_size + e
                source = case.cache_block_table[r, pool // old_size] if pool < pools else -1
                if 0 <= source < pages:
                    new_keys[page, e] = keys[source, pool % old_size]
                    new_scales[page, e] = scales[source, pool % old_size]
    return replace(case, cache=paged_cache(new_keys, new_scales), cache_block_table=table)


def rising_case(counts: tuple[int, ...], cache_lengths: tuple[int, ...], heads: int = 4, head_dim: int = 64):
    """Equal keys, queries and weights, each pool's scale rising with its id (kpool 1): a pool's logit rises with
    its position, so each token's best are the last pools it sees, and a pool it does not see would beat them."""
    rng = np.random.default_rng(len(counts))
    case = index_case(rng, heads=heads, head_dim=head_dim, kpool=1, block_size=16, counts=counts,
                      cache_lengths=cache_lengths)  # fmt: skip
    pages, size = case.cache.shape[:2]
    flat = case.cache.reshape(pages, -1)
    flat[:, : size * head_dim] = 0x38  # e4m3 1.0
    scales = np.ones((pages, size), np.float32)
    for b, length in enumerate(cache_lengths):
        pools = np.arange(length + counts[b])
        scales[case.cache_block_table[b, pools // size], pools % size] = 1 + pools / 8192  # exact in float32
    flat[:, size * head_dim :] = scales.view(np.uint8).reshape(pages, -1)
    case.q[...] = 0x38
    case.weights[...] = 1.0
    return case
