"""Expansion: selected pools back to token positions (kernels/kpool_expand.cuh).

kpool_expand_topk, kpool_index_topk and kpool_index_select_fp8 all expand their selections the same way;
these are what the three share: the options (the tail, a block table with its page size, compact rows),
their checks, the part of the call record they decide (``Expansion``), the kernel values they give, and
the outputs (positions, and counts when compacting)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...dtypes import INT32
from ...kernel import codes
from ..framework.checks import (
    as_size,
    check_block_table,
    check_contiguous,
    check_integer,
    check_writable,
    dtype_fail,
    fail,
    require_array,
)
from ..framework.spec import Backend, CallArgs, Operand, Option, OutputShape

# A page of a paged KV cache holds at most this many tokens; real engines use
# 16 to 256, and slot arithmetic stays far from int32's edge.
MAX_BLOCK_SIZE = 1 << 20


def check_block_size(block_size: Any) -> None:
    """An integer (TypeError otherwise) in [1, MAX_BLOCK_SIZE] (ValueError otherwise)."""
    check_integer("block_size", block_size, 1, MAX_BLOCK_SIZE)


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


# The outputs a caller may hand the op: positions (``out``) and, with compact, counts. The kernel writes every
# element of both (``filled``), so a frontend allocates them without zeroing.
POSITIONS_OUT = Operand(
    "out", "int32 [rows, width], C-contiguous: the positions (or KV slots)", True, True, rows_of="*",
    dtype="int32", filled="always",
)  # fmt: skip
COUNTS_OUT = Operand(
    "counts", "int32 [rows], contiguous: each row's kept entries (compact=True only; with out)", True, True,
    dtype="int32", filled="always",
)  # fmt: skip
OUTPUTS = (POSITIONS_OUT, COUNTS_OUT)


def _check_output(name: str, array: Any, shape: tuple[int, ...], rule: str) -> None:
    require_array(name, array)
    if np.dtype(array.dtype) != INT32:
        raise dtype_fail(name, "dtype int32", np.dtype(array.dtype).name)
    if tuple(array.shape) != shape:
        raise fail(name, f"shape {rule}", f"shape {tuple(array.shape)}")
    check_contiguous(name, array)
    check_writable(name, array)


def check_outputs(a: CallArgs, rows: int, expanded: dict[str, Any]) -> None:
    """``out`` int32 ``[rows, width]`` and ``counts`` int32 ``[rows]`` where given: C-contiguous, writable;
    counts only with compact, and only beside out (the op makes the positions it writes, or takes them)."""
    width = expanded["width"]
    if a.out is not None:
        _check_output("out", a.out, (rows, width), f"[{rows}, {width}] (rows, pool_topk * kpool + tail)")
    if a.counts is None:
        return
    if not expanded["compact"]:
        raise fail("counts", "None without compact=True (only compacted rows have counts)", "an array")
    if a.out is None:
        raise fail("counts", "None without out (counts are given with the positions they count)", "an array")
    _check_output("counts", a.counts, (rows,), f"[{rows}] (rows)")


# How a selected pool becomes positions: the tail, the KV cache's pages, compaction (the selecting ops take them
# after their own options).
# What an op that expands returns: positions, and counts after them with compact (torch's schemas return
# both always).
RETURNS: dict[str, Any] = {"results": ("positions",), "conditional_results": {"counts": "compact"}}
OPTIONS = (ALWAYS_SELECT_TAIL, BLOCK_TABLE, BLOCK_SIZE, COMPACT)  # OUTPUTS follow them in each op


@dataclass(frozen=True)
class Expansion:
    """The part of a call record that says how selections expand (each op's record extends it)."""

    kpool: int
    pool_topk: int
    width: int  # columns of positions: pool_topk * kpool, plus kpool - 1 with always_select_tail
    max_blocks: int  # columns of block_table; 0 without one
    block_size: int  # the token table's; 0 without one
    compact: bool

    @property
    def tail(self) -> bool:
        """Whether each row also takes the token's own unfinished pool (``always_select_tail``)."""
        return self.width > self.pool_topk * self.kpool


def check(a: CallArgs, batch: int, pool_topk: int) -> dict[str, Any]:
    """The ``Expansion`` fields of a call (kpool already checked), its block table and page size checked."""
    kpool = int(a.kpool)
    max_blocks, block_size = check_paged_table(a.block_table, a.block_size, batch)
    width = pool_topk * kpool + (kpool - 1 if a.always_select_tail else 0)
    return {"kpool": kpool, "pool_topk": pool_topk, "width": width, "max_blocks": max_blocks,
            "block_size": block_size, "compact": bool(a.compact)}  # fmt: skip


def output_shapes(call: Expansion, rows: int) -> dict[str, OutputShape]:
    """positions (``out``) ``[rows, width]``, and with ``compact`` counts ``[rows]``, both int32."""
    shapes = {"out": ((rows, call.width), INT32)}
    if call.compact:
        shapes["counts"] = ((rows,), INT32)
    return shapes


def token_output_shapes(call: Any) -> dict[str, OutputShape]:
    """``output_shapes`` a row a query token (``call.num_tokens``): the selecting ops'."""
    return output_shapes(call, call.num_tokens)


# What a selecting op's spec takes beside RETURNS: its outputs, a row a query token.
SELECTING: dict[str, Any] = {**RETURNS, "outputs": token_output_shapes}


def launch_values(call: Expansion, o: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The kernel values and template parameters of the expansion (``kp::write_selection``'s and
    ``kp::expanded``'s), from the operands ``block_table``, ``positions`` and ``counts``."""
    positions, paged = o["positions"], o.get("block_table") is not None
    values = {"block_table": o["block_table"] if paged else positions}  # any int32 array where none is read
    values |= {"max_blocks": call.max_blocks, "block_table_stride": codes.stride(o["block_table"]) if paged else 0}
    values |= {"block_size": max(call.block_size, 1), "positions": positions, "width": call.width}
    values |= {"counts": o["counts"] if call.compact else positions}  # written only when compacting
    return values, {"PAGED": paged, "COMPACT": call.compact}


def expand_into(
    backend: Backend, call: Expansion, rows: int, launch: Callable[[Any, Any], None], given: dict[str, Any]
) -> Any:
    """The outputs for ``rows`` rows (``given``'s ``out`` and ``counts`` where the caller handed them, else new),
    filled by ``launch(positions, counts)`` (no launch for an empty one: its counts are zeros); what the op
    returns. Every element is written, so nothing is zeroed first."""
    shapes = output_shapes(call, rows)
    positions = given.get("out")
    if positions is None:
        positions = backend.empty(*shapes["out"])
    counts = given.get("counts")
    if counts is None and call.compact:
        counts = backend.empty(*shapes["counts"])
    if positions.size:
        launch(positions, counts)
    elif counts is not None and counts.size:
        counts[...] = 0
    return (positions, counts) if call.compact else positions


def check_blocks_reach(call: Expansion, last: np.ndarray, reach: Callable[[int], str]) -> None:
    """Each token's last position (``last``, host int64, -1 for none) has a block in its request's table;
    ``reach(t)`` says what the first token past it reaches for."""
    bad = last // call.block_size >= call.max_blocks
    if bad.any():
        t = int(np.argmax(bad))
        raise fail("block_table", reach(t), f"{call.max_blocks} blocks a request")
