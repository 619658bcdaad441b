"""Expansion: selected pools back to token positions (kernels/kpool_expand.cuh).

kpool_expand_topk, kpool_index_topk and kpool_index_select_fp8 all expand their selections the same way;
these are the options the three share (the tail, a block table with its page size, compact rows) and
their checks."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..framework.checks import (
    as_size,
    check_block_table,
    dtype_fail,
    fail,
)
from ..framework.spec import Operand, Option

# A page of a paged KV cache holds at most this many tokens; real engines use
# 16 to 256, and slot arithmetic stays far from int32's edge.
MAX_BLOCK_SIZE = 1 << 20


def check_block_size(block_size: Any) -> None:
    """An integer (TypeError otherwise) in [1, MAX_BLOCK_SIZE] (ValueError otherwise)."""
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
        raise dtype_fail("block_size", "an integer", type(block_size).__name__)
    if not 1 <= int(block_size) <= MAX_BLOCK_SIZE:
        raise fail("block_size", f"an integer in [1, {MAX_BLOCK_SIZE}]", int(block_size))


def check_paged_table(block_table: Any, block_size: Any, batch: int) -> tuple[int, int]:
    """block_table int32 ``[batch, max_blocks]`` (``checks.check_block_table``, as the FP8 ops take it) with a
    block_size, or neither; (max_blocks, size)."""
    if (block_table is None) != (block_size is None):
        given, missing = ("block_table", "block_size") if block_table is not None else ("block_size", "block_table")
        raise fail(missing, f"given with {given}", "None")
    if block_table is None:
        return 0, 0
    check_block_size(block_size)
    check_block_table(block_table, batch)
    return as_size(block_table.shape[1]), int(block_size)


ALWAYS_SELECT_TAIL = Option("always_select_tail", "bool", False)


BLOCK_TABLE = Operand("block_table", "[batch, max_blocks] int32: each request's cache pages", optional=True)


BLOCK_SIZE = Option("block_size", "int | None", None, check=check_block_size)


COMPACT = Option("compact", "bool", False)


# How a selected pool becomes positions: the tail, the KV cache's pages, compaction (the selecting ops take them
# after their own options).
EXPANSION_OPTIONS = (ALWAYS_SELECT_TAIL, BLOCK_TABLE, BLOCK_SIZE, COMPACT)
