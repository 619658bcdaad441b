"""Operands several ops share, described once: name, dtype and shape rule, whether written."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..kernel import codes
from .spec import Operand, Option

TOKEN_K = Operand("k", "[total_tokens, head_dim] bfloat16, float16 or float32; last dim contiguous")
TOKEN_GATE = Operand("gate", "like k; any of the three element dtypes")
RING_GATE = Operand("gate", "like k, in k's dtype")
# The dtype of the pooled output, when neither out= nor k's dtype is wanted.
OUT_DTYPE = Option("out_dtype", "Any", None)
APE = Operand("ape", "float32 [kpool, head_dim]")
INPUT_ROW_OFFSETS = Operand("input_row_offsets", "[batch + 1] int32, uint32 or int64")
CACHE_LENGTHS = Operand("cache_lengths", "[batch] int32, uint32 or int64")
SLOT_IDX = Operand("slot_idx", "[requests] int32, uint32 or int64: each request's ring")
RING = Operand(
    "tail", "[max_slots, 2, ring >= kpool, head_dim] in k's dtype, any strides, last dim contiguous", written=True
)
RING_READ = Operand(
    "tail", "[max_slots, 2, ring >= kpool, head_dim] in k's dtype, any strides, last dim contiguous (read only)"
)


def ring(operands: dict[str, Any], max_slots: int) -> tuple[Any, ...]:
    """A ring kernel's first arguments: the ring, its slots, its rows, and its slot, half and row strides."""
    tail = operands["tail"]
    strides = (codes.stride(tail, axis) for axis in range(3))
    return (tail, np.int64(max_slots), np.int64(tail.shape[2]), *strides)


def ring_and_tokens(operands: dict[str, Any], max_slots: int) -> tuple[Any, ...]:
    """The arguments ring close and seed tail open with: the ring (`ring`), then k and gate rows."""
    return (*ring(operands, max_slots), *codes.rows(operands["k"]), *codes.rows(operands["gate"]))


def requests(operands: dict[str, Any], batch: int, total_tokens: int) -> tuple[Any, ...]:
    """The arguments of a token-row ring kernel that place each request: offsets, lengths, slots, counts."""
    return (
        operands["input_row_offsets"],
        operands["cache_lengths"],
        operands["slot_idx"],
        np.int64(batch),
        np.int64(total_tokens),
    )
