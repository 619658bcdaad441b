"""Selection: each token's pool_topk best pools (kernels/kpool_select.cuh), for kpool_index_topk and the fused select.

Larger logits first, ties to the lower pool id, -0 equal to +0, NaN lowest; the selected ids ascending."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...kernel.declarations import SELECT_CAPS
from ...kernel.requests import token_visibility
from ..framework.checks import check_integer, fail
from ..framework.spec import Option
from .expansion import check_blocks_reach

# The most pools a token may select: the shared buffer of the largest instantiation (SELECT_CAPS).
MAX_POOL_TOPK = SELECT_CAPS[-1]


# One block a token: a grid of at most 2^31 - 1 blocks.
MAX_TOKENS = (1 << 31) - 1


def check_pool_topk(pool_topk: Any) -> None:
    """An integer (TypeError otherwise) in [1, MAX_POOL_TOPK] (ValueError otherwise)."""
    check_integer("pool_topk", pool_topk, 1, MAX_POOL_TOPK)


def select_cap(pool_topk: int) -> int:
    """The smallest instantiation's buffer that holds pool_topk."""
    return next(cap for cap in SELECT_CAPS if cap >= pool_topk)


def last_selectable_position(call: Any, offsets: np.ndarray, lengths: np.ndarray, tail: bool):
    """Each token's last position it could select (any of its visible pools, its tail), -1 for none; and the
    pools each sees (host arrays, validated). ``call``: num_tokens and kpool."""
    _, placed, visible = token_visibility(offsets, lengths, call.num_tokens, call.kpool)
    last = np.where(visible > 0, visible * call.kpool - 1, -1)
    if tail:
        request = np.searchsorted(offsets, np.arange(call.num_tokens), side="right") - 1
        seen = lengths[request] + np.arange(call.num_tokens) - offsets[request] + 1  # positions it sees
        last = np.where(placed & (seen % call.kpool > 0), seen - 1, last)
    return last, visible


def check_covered(call: Any, offsets: np.ndarray, lengths: np.ndarray, tail: bool) -> None:
    """The logits (when the call has them) hold every visible pool, and the block table every selectable
    position (validate=True). ``call``: num_tokens, kpool, block_size, max_blocks, and logits_width or None."""
    last, visible = last_selectable_position(call, offsets, lengths, tail)
    if call.logits_width is not None and visible.size and int(visible.max()) > call.logits_width:
        t = int(np.argmax(visible))
        raise fail("logits", f"at least the {int(visible[t])} pools token {t} sees (columns)", call.logits_width)
    if call.block_size:
        check_blocks_reach(call, last, lambda t: (
            f"a block for every position token {t} could select (position {int(last[t])} is in block "
            f"{int(last[t]) // call.block_size}; the selection is not known on the host)"
        ))  # fmt: skip


POOL_TOPK = Option("pool_topk", "int", check=check_pool_topk)
