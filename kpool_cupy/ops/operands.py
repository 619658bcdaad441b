"""Operands several ops share, described once: name, dtype and shape rule, whether written."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..kernel import codes
from .spec import Operand, Option, is_pair

TOKEN_K = Operand("k", "[total_tokens, head_dim] bfloat16, float16 or float32; last dim contiguous")
TOKEN_GATE = Operand("gate", "like k; any of the three element dtypes")
RING_GATE = Operand("gate", "like k; in k's dtype with one ring array, the gate ring's with a pair")
# The dtype of the pooled output, when neither out= nor k's dtype is wanted.
OUT_DTYPE = Option("out_dtype", "Any", None)
# Write each pool's Hadamard rotation instead of the pool (issue 12: engines
# with bf16 caches of rotated keys).
ROTATE = Option("rotate", "bool", False)
APE = Operand("ape", "float32 [kpool, head_dim]")
INPUT_ROW_OFFSETS = Operand("input_row_offsets", "[batch + 1] int32, uint32 or int64")
CACHE_LENGTHS = Operand("cache_lengths", "[batch] int32, uint32 or int64")
SLOT_IDX = Operand("slot_idx", "[requests] int32, uint32 or int64: each request's ring")
_RING_RULE = (
    "[max_slots, 2, ring >= kpool, head_dim] in k's dtype, or a pair (key_ring, gate_ring) of "
    "[max_slots, ring >= kpool, head_dim] in k's and gate's dtypes; any strides, last dim contiguous"
)
RING = Operand("tail", _RING_RULE, written=True, pair=True)
RING_READ = Operand("tail", _RING_RULE + " (read only)", pair=True)


def ring(operands: dict[str, Any], max_slots: int) -> tuple[Any, ...]:
    """A ring kernel's first arguments (kernels/kpool_ring.cu): key ring, gate ring, the gate ring's offset,
    slots, rows, then the key ring's and the gate ring's slot and row strides.

    One ring array is passed twice, its gate half ``half stride`` elements on:
    the kernel's arguments stay the caller's arrays (a launch plan needs them).
    """
    tail = operands["tail"]
    if is_pair(tail):
        keys, gates = tail
        rows = keys.shape[1]
        layout = (np.int64(0), np.int64(max_slots), np.int64(rows))
        strides = (codes.stride(keys, 0), codes.stride(keys, 1), codes.stride(gates, 0), codes.stride(gates, 1))
        return (keys, gates, *layout, *strides)
    slot, half, row = (codes.stride(tail, axis) for axis in range(3))
    return (tail, tail, half, np.int64(max_slots), np.int64(tail.shape[2]), slot, row, slot, row)


def ring_vector(operands: dict[str, Any]) -> dict[str, Any]:
    """The ``vector_mask`` entries of a ring: its key and gate arrays (one ring array stands for both halves:
    16-byte access to either needs its half stride aligned too)."""
    tail = operands["tail"]
    keys, gates = tail if is_pair(tail) else (tail, tail)
    return {"tail": keys, "gate_ring": gates}


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
