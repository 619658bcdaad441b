"""Selection split over blocks (kernels/kpool_select.cuh's publish_split and merge_splits): the workspace.

For a few tokens, a token's candidates are split over several blocks: each selects its split's best into a list
of the workspace, and the last of the token's blocks to finish selects again over the lists. The workspace holds a
counter per token (a fixed region at its start, whatever num_tokens, so one zeroed buffer serves every batch size;
the kernel leaves the counters zero) and, per token and split, a head (its count and the two keys that give the
merge its threshold), pool_topk keys and pool_topk ids (``kp::select_workspace``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..framework.checks import check_integer, fail
from ..framework.spec import Backend, Operand
from .fp8_target import UINT8
from .selection import check_pool_topk

# Blocks a call aims at: tokens times splits of their candidates, about two per SM of a large GPU.
TARGET_BLOCKS = 256
MAX_SPLITS = 64
# The counters: one per token, for the most tokens whose candidates are split (TARGET_BLOCKS // 2), in a fixed
# region at the workspace's start (kp::kSelectCounterBytes in kernels/kpool_select.cuh).
COUNTER_BYTES = 4 * (TARGET_BLOCKS // 2)
# The last block of a token selects again over splits x pool_topk candidates: at most this many.
MAX_MERGED = 16384
# A list's head: its count, its least key when full, its ceil(pool_topk / splits)-th largest key, a word unused
# (kp::kSplitHeadWords).
HEAD_BYTES = 16

WORKSPACE = Operand("workspace", "[bytes] uint8: counters and per-split lists; zeroed", True, True, scratch=True)


def most_splits(num_tokens: int, pool_topk: int) -> int:
    """The most blocks a token's candidates may be split over: TARGET_BLOCKS in all, MAX_MERGED merged."""
    if num_tokens <= 0:
        return 1
    return max(1, min(MAX_SPLITS, TARGET_BLOCKS // num_tokens, MAX_MERGED // pool_topk))


def _align16(size: int) -> int:
    return -(-size // 16) * 16


def workspace_bytes(num_tokens: int, splits: int, pool_topk: int) -> int:
    """The workspace's bytes for ``splits`` lists a token: 0 for one (nothing to merge)."""
    if splits == 1:
        return 0
    lists = num_tokens * splits
    return COUNTER_BYTES + HEAD_BYTES * lists + _align16(4 * lists * pool_topk) + 4 * lists * pool_topk


# The batches after which most_splits steps down (the largest batch of each TARGET_BLOCKS // num_tokens).
_STEP_ENDS = tuple(sorted({TARGET_BLOCKS // m for m in range(1, TARGET_BLOCKS + 1)}))


def checked_workspace_bytes(num_tokens: Any, pool_topk: Any, splits: Callable[[int, int], int]) -> int:
    """A public sizing call: the most ``workspace_bytes`` any batch of at most ``num_tokens`` tokens needs, so
    one buffer sized for an engine's largest batch serves every smaller one (helper-64: the need itself rises
    and falls with the batch, as the splits a token shrink). num_tokens a count (TypeError or ValueError naming
    it), pool_topk checked as the ops check it, ``splits(num_tokens, pool_topk)`` the op's rule.

    Between two of most_splits' steps the splits are the same and the bytes grow with the batch, so the most
    is at num_tokens or at the last batch of an earlier step. This holds for a ``splits`` that changes with the
    batch only where ``TARGET_BLOCKS // num_tokens`` does (both ops' rules: most_splits, capped by the pools)."""
    check_integer("num_tokens", num_tokens, 0)
    check_pool_topk(pool_topk)
    tokens, topk = int(num_tokens), int(pool_topk)
    batches = [n for n in _STEP_ENDS if n < tokens] + [tokens]
    return max(workspace_bytes(n, splits(n, topk), topk) for n in batches)


def counters_to_check(workspace: Any, splits: int) -> list[Any]:
    """The part of a caller's workspace validation reads back (the counters, when the call splits)."""
    return [workspace[:COUNTER_BYTES]] if splits > 1 and workspace is not None else []


def check_counters_zero(counters: np.ndarray) -> None:
    """The counters read back are zero: a fresh zeroed buffer, or one a previous call left."""
    if counters.any():
        raise fail(
            "workspace",
            f"its first {COUNTER_BYTES} bytes zero (a fresh zeroed buffer, or one a previous call left)",
            "non-zero bytes",
        )


def workspace_for_launch(backend: Backend, workspace: Any, needed: int, stand_in: Any) -> Any:
    """The caller's workspace, a fresh zeroed one, or (nothing split) any array: the kernel never touches it."""
    if needed == 0:
        return stand_in
    return workspace if workspace is not None else backend.zeros((needed,), UINT8)
