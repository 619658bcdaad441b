"""Operands several ops share, described once: name, dtype and shape rule, whether written."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...kernel import codes
from ...pool_offsets import check_kpool
from .spec import Operand, Option, is_pair

TOKEN_K = Operand("k", "[total_tokens, head_dim] bfloat16, float16 or float32; last dim contiguous")
TOKEN_GATE = Operand("gate", "like k; any of the three element dtypes")
RING_GATE = Operand("gate", "like k; in k's dtype with one ring array, the gate ring's with a pair")
# The dtype of the pooled output, when neither out= nor k's dtype is wanted.
OUT_DTYPE = Option("out_dtype", "Any", None, kind="dtype")
# Write each pool's Hadamard rotation instead of the pool (for engines with
# bf16 caches of rotated keys).
ROTATE = Option("rotate", "bool", False)
APE = Operand("ape", "float32 [kpool, head_dim]")
INPUT_ROW_OFFSETS = Operand("input_row_offsets", "[batch + 1] int32, uint32 or int64")
CACHE_LENGTHS = Operand("cache_lengths", "[batch] int32, uint32 or int64")
# kpool as an option: keyword-only, required where no array says it (ape's rows do for the pooling ops).
KPOOL = Option("kpool", "int", check=check_kpool)
SLOT_IDX = Operand("slot_idx", "[requests] int32, uint32 or int64: each request's ring")
_RING_RULE = (
    "[max_slots, 2, ring >= kpool, head_dim] in k's dtype, or a pair (key_ring, gate_ring) of "
    "[max_slots, ring >= kpool, head_dim] in k's and gate's dtypes; any strides, last dim contiguous"
)
RING = Operand("tail", _RING_RULE, written=True, pair=True)
RING_READ = Operand("tail", _RING_RULE + " (read only)", pair=True)


def ring(operands: dict[str, Any], max_slots: int) -> dict[str, Any]:
    """A ring as every ring kernel takes it (``kernel.declarations.ring``): key ring, gate ring, the gate
    ring's offset, slots, rows, then the key ring's and the gate ring's slot and row strides.

    One ring array is passed twice, its gate half ``half stride`` elements on:
    the kernel's arguments stay the caller's arrays (a launch plan needs them).
    """
    tail = operands["tail"]
    if is_pair(tail):
        keys, gates = tail
        layout = {"key_ring": keys, "gate_ring": gates, "gate_offset": 0, "ring_rows": keys.shape[1]}
        slot_strides = {"key_slot_stride": codes.stride(keys, 0), "key_row_stride": codes.stride(keys, 1)}
        slot_strides |= {"gate_slot_stride": codes.stride(gates, 0), "gate_row_stride": codes.stride(gates, 1)}
    else:
        slot, half, row = (codes.stride(tail, axis) for axis in range(3))
        layout = {"key_ring": tail, "gate_ring": tail, "gate_offset": half, "ring_rows": tail.shape[2]}
        slot_strides = {"key_slot_stride": slot, "key_row_stride": row, "gate_slot_stride": slot}
        slot_strides |= {"gate_row_stride": row}
    return {**layout, "max_slots": max_slots, **slot_strides}


def ring_template(operands: dict[str, Any], call: Any) -> dict[str, Any]:
    """The template parameters every ring kernel opens with: element types and head_dim (the kernels that pool
    add KPOOL)."""
    return {"T": call.dtype, "G": call.gate_dtype, "HEAD_DIM": call.head_dim}


def ring_vector(operands: dict[str, Any]) -> dict[str, Any]:
    """The ``vector_mask`` entries of a ring: its key and gate arrays (one ring array stands for both halves:
    16-byte access to either needs its half stride aligned too)."""
    tail = operands["tail"]
    keys, gates = tail if is_pair(tail) else (tail, tail)
    return {"tail": keys, "gate_ring": gates}


@dataclass(frozen=True)
class TokenRingCall:
    """What ring close and seed tail both learn from their checks: sizes, the ring's slots, element dtypes."""

    head_dim: int
    batch: int
    total_tokens: int
    max_slots: int
    dtype: np.dtype
    gate_dtype: np.dtype


def token_ring_values(operands: dict[str, Any], call: TokenRingCall) -> dict[str, Any]:
    """What ring close and seed tail open with: the ring (`ring`), k and gate rows, then what places each
    request (offsets, lengths, slots, counts)."""
    o = operands
    tokens = codes.rows("k", o["k"]) | codes.rows("gate", o["gate"], "gate_row_stride_tokens")
    places = {name: o[name] for name in ("input_row_offsets", "cache_lengths", "slot_idx")}
    return ring(o, call.max_slots) | tokens | places | {"batch": call.batch, "total_tokens": call.total_tokens}


def token_ring_template(operands: dict[str, Any], call: TokenRingCall) -> dict[str, Any]:
    """Their template parameters: element types and sizes, the index types of offsets, lengths and slots, and
    the VECTOR bits of k, gate and the ring."""
    o = operands
    indexes = {"IO": o["input_row_offsets"].dtype, "IC": o["cache_lengths"].dtype, "IS": o["slot_idx"].dtype}
    vector = codes.vector_mask(k=o["k"], gate=o["gate"], **ring_vector(o))
    return ring_template(o, call) | indexes | {"VECTOR": vector}
