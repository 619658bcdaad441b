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
RING = Operand("tail", "[max_slots, 2, kpool, head_dim] in k's dtype, C-contiguous", written=True)
RING_READ = Operand("tail", "[max_slots, 2, kpool, head_dim] in k's dtype, C-contiguous (read only)")


def ring_and_tokens(operands: dict[str, Any], max_slots: int) -> tuple[Any, ...]:
    """The arguments ring close and seed tail open with: the ring, its slot count, k and gate rows."""
    return (operands["tail"], np.int64(max_slots), *codes.rows(operands["k"]), *codes.rows(operands["gate"]))


def requests(operands: dict[str, Any], batch: int, total_tokens: int) -> tuple[Any, ...]:
    """The arguments of a token-row ring kernel that place each request: offsets, lengths, slots, counts."""
    return (
        operands["input_row_offsets"],
        operands["cache_lengths"],
        operands["slot_idx"],
        np.int64(batch),
        np.int64(total_tokens),
    )
