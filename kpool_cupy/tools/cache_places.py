"""Where `kpool-cupy check --op` has an FP8 op write its pools in a paged cache, and what the cache must then hold.

The cache is uint8 ``[pages, BLOCK, head_dim + 4]``: a page's ``BLOCK``
rows of e4m3fn bytes, then their ``BLOCK`` float32 scales (the layout vLLM
and SGLang share, ``ops/families/fp8_target.py``). Flat slot ``s`` is entry
``s % BLOCK`` of page ``s // BLOCK``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernel.pages import FP8_PAGES

BLOCK = 4  # entries a page
TABLE_POOLS = 4096  # pool ids below this go through a block table; a table row spans id // BLOCK pages


@dataclass
class Places:
    target: dict[str, np.ndarray]  # block_table= or slots=, as the op takes it
    slots: list[list[int]]  # each request's pools' flat slots, in pool order
    pages: int


def places(pools: list[list[int]], rng: np.random.Generator, slot_per: str | None) -> Places | None:
    """A block table over each request's pool ids, or where the ids are too large, slots.

    ``slot_per`` is how the op takes slots: one a pool row ("pool"), one a
    request ("request"), or not at all (None: no cache form past the table's ids).
    """
    top = max((q for qs in pools for q in qs), default=0)
    if top < TABLE_POOLS:
        blocks = top // BLOCK + 1
        table = rng.permutation(len(pools) * blocks).astype(np.int32).reshape(len(pools), blocks)
        flat = [[int(table[b, q // BLOCK]) * BLOCK + q % BLOCK for q in qs] for b, qs in enumerate(pools)]
        return Places({"block_table": table}, flat, len(pools) * blocks)
    if slot_per is None:
        return None
    if slot_per == "pool":
        slots = rng.permutation(sum(len(qs) for qs in pools))
        ends = np.cumsum([len(qs) for qs in pools])
        flat = [[int(s) for s in part] for part in np.split(slots, ends[:-1])] if pools else []
    else:
        slots = rng.permutation(len(pools))
        flat = [[int(slots[b])] if qs else [] for b, qs in enumerate(pools)]
    return Places({"slots": slots.astype(np.int64)}, flat, -(-len(slots) // BLOCK))


def empty_cache(where: Places, head_dim: int) -> np.ndarray:
    return np.zeros((where.pages, BLOCK, FP8_PAGES.entry_bytes(head_dim)), np.uint8)


def filled_cache(where: Places, values: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """An empty cache with row i of (values, scales), the pools in request then pool order, at its slot."""
    head_dim = values.shape[-1]
    cache = empty_cache(where, head_dim)
    flat = cache.reshape(where.pages, -1)
    for row, slot in enumerate(s for per_request in where.slots for s in per_request):
        page, entry = divmod(slot, BLOCK)
        first, scale = FP8_PAGES.value_offset(head_dim, entry), FP8_PAGES.scale_offset(BLOCK, head_dim, entry)
        flat[page, first : first + head_dim] = values[row]
        flat[page, scale : scale + FP8_PAGES.scale_bytes] = scales[row : row + 1].view(np.uint8)
    return cache
