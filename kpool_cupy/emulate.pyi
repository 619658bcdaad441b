# Written by kpool_cupy/tools/stubs.py from the module's exports (python -m kpool_cupy.tools.stubs);
# tests/test_type_stubs.py checks it.
import ctypes
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np

BASE_FLAGS: tuple[str, ...]

class CompilerNotFoundError(RuntimeError): ...

FLAGS_VARIABLE: str

def cache_dir() -> Path: ...
def compiler() -> str: ...
def hadamard_quant_fp8(
    x: np.ndarray,
    *,
    round_scale: bool = True,
    out: np.ndarray | None = None,
    out_scale: np.ndarray | None = None,
    validate: bool = True,
) -> tuple[np.ndarray, np.ndarray]: ...
def kpool_compress(
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    pool_row_offsets: np.ndarray | None = None,
    out: np.ndarray | None = None,
    validate: bool = True,
    out_dtype: Any = None,
    rotate: bool = False,
) -> np.ndarray: ...
def kpool_compress_backward(
    grad_pooled: np.ndarray,
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    pool_row_offsets: np.ndarray | None = None,
    grad_k: np.ndarray | None = None,
    grad_gate: np.ndarray | None = None,
    grad_ape: np.ndarray | None = None,
    validate: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
@overload
def kpool_compress_fp8(
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    pool_row_offsets: np.ndarray | None = None,
    round_scale: bool = True,
    cache: None = None,
    slots: np.ndarray | None = None,
    block_table: np.ndarray | None = None,
    out: np.ndarray | None = None,
    out_scale: np.ndarray | None = None,
    validate: bool = True,
) -> tuple[np.ndarray, np.ndarray]: ...
@overload
def kpool_compress_fp8(
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    pool_row_offsets: np.ndarray | None = None,
    round_scale: bool = True,
    cache: np.ndarray,
    slots: np.ndarray | None = None,
    block_table: np.ndarray | None = None,
    out: np.ndarray | None = None,
    out_scale: np.ndarray | None = None,
    validate: bool = True,
) -> None: ...
@overload
def kpool_compress_fp8(
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    pool_row_offsets: np.ndarray | None = None,
    round_scale: bool = True,
    cache: np.ndarray | None = None,
    slots: np.ndarray | None = None,
    block_table: np.ndarray | None = None,
    out: np.ndarray | None = None,
    out_scale: np.ndarray | None = None,
    validate: bool = True,
) -> tuple[np.ndarray, np.ndarray] | None: ...
@overload
def kpool_expand_topk(
    pool_ids: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    kpool: int,
    always_select_tail: bool = False,
    validate: bool = True,
    block_table: np.ndarray | None = None,
    block_size: int | None = None,
    compact: Literal[False] = False,
) -> np.ndarray: ...
@overload
def kpool_expand_topk(
    pool_ids: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    kpool: int,
    always_select_tail: bool = False,
    validate: bool = True,
    block_table: np.ndarray | None = None,
    block_size: int | None = None,
    compact: Literal[True],
) -> tuple[np.ndarray, np.ndarray]: ...
@overload
def kpool_expand_topk(
    pool_ids: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    kpool: int,
    always_select_tail: bool = False,
    validate: bool = True,
    block_table: np.ndarray | None = None,
    block_size: int | None = None,
    compact: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]: ...
def kpool_index_logits_fp8(
    q: np.ndarray,
    weights: np.ndarray,
    cache: np.ndarray,
    cache_block_table: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    kpool: int,
    max_pools: int | None = None,
    out: np.ndarray | None = None,
    validate: bool = True,
) -> np.ndarray: ...
@overload
def kpool_index_select_fp8(
    q: np.ndarray,
    weights: np.ndarray,
    cache: np.ndarray,
    cache_block_table: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    kpool: int,
    pool_topk: int,
    always_select_tail: bool = False,
    block_table: np.ndarray | None = None,
    block_size: int | None = None,
    compact: Literal[False] = False,
    workspace: np.ndarray | None = None,
    validate: bool = True,
) -> np.ndarray: ...
@overload
def kpool_index_select_fp8(
    q: np.ndarray,
    weights: np.ndarray,
    cache: np.ndarray,
    cache_block_table: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    kpool: int,
    pool_topk: int,
    always_select_tail: bool = False,
    block_table: np.ndarray | None = None,
    block_size: int | None = None,
    compact: Literal[True],
    workspace: np.ndarray | None = None,
    validate: bool = True,
) -> tuple[np.ndarray, np.ndarray]: ...
@overload
def kpool_index_select_fp8(
    q: np.ndarray,
    weights: np.ndarray,
    cache: np.ndarray,
    cache_block_table: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    kpool: int,
    pool_topk: int,
    always_select_tail: bool = False,
    block_table: np.ndarray | None = None,
    block_size: int | None = None,
    compact: bool = False,
    workspace: np.ndarray | None = None,
    validate: bool = True,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]: ...
@overload
def kpool_index_topk(
    logits: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    kpool: int,
    pool_topk: int,
    always_select_tail: bool = False,
    block_table: np.ndarray | None = None,
    block_size: int | None = None,
    compact: Literal[False] = False,
    validate: bool = True,
) -> np.ndarray: ...
@overload
def kpool_index_topk(
    logits: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    kpool: int,
    pool_topk: int,
    always_select_tail: bool = False,
    block_table: np.ndarray | None = None,
    block_size: int | None = None,
    compact: Literal[True],
    validate: bool = True,
) -> tuple[np.ndarray, np.ndarray]: ...
@overload
def kpool_index_topk(
    logits: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    kpool: int,
    pool_topk: int,
    always_select_tail: bool = False,
    block_table: np.ndarray | None = None,
    block_size: int | None = None,
    compact: bool = False,
    validate: bool = True,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]: ...
def kpool_ring_close(
    tail: np.ndarray | tuple[np.ndarray, np.ndarray],
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    slot_idx: np.ndarray,
    *,
    out: np.ndarray | None = None,
    closed: np.ndarray | None = None,
    validate: bool = True,
    out_dtype: Any = None,
    rotate: bool = False,
) -> tuple[np.ndarray, np.ndarray]: ...
@overload
def kpool_ring_close_fp8(
    tail: np.ndarray | tuple[np.ndarray, np.ndarray],
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    slot_idx: np.ndarray,
    *,
    round_scale: bool = True,
    cache: None = None,
    slots: np.ndarray | None = None,
    block_table: np.ndarray | None = None,
    out: np.ndarray | None = None,
    out_scale: np.ndarray | None = None,
    closed: np.ndarray | None = None,
    validate: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
@overload
def kpool_ring_close_fp8(
    tail: np.ndarray | tuple[np.ndarray, np.ndarray],
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    slot_idx: np.ndarray,
    *,
    round_scale: bool = True,
    cache: np.ndarray,
    slots: np.ndarray | None = None,
    block_table: np.ndarray | None = None,
    out: np.ndarray | None = None,
    out_scale: np.ndarray | None = None,
    closed: np.ndarray | None = None,
    validate: bool = True,
) -> np.ndarray: ...
@overload
def kpool_ring_close_fp8(
    tail: np.ndarray | tuple[np.ndarray, np.ndarray],
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    slot_idx: np.ndarray,
    *,
    round_scale: bool = True,
    cache: np.ndarray | None = None,
    slots: np.ndarray | None = None,
    block_table: np.ndarray | None = None,
    out: np.ndarray | None = None,
    out_scale: np.ndarray | None = None,
    closed: np.ndarray | None = None,
    validate: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | np.ndarray: ...
def kpool_seed_tail(
    tail: np.ndarray | tuple[np.ndarray, np.ndarray],
    k: np.ndarray,
    gate: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    slot_idx: np.ndarray,
    *,
    validate: bool = True,
    kpool: int | None = None,
) -> None: ...
def kpool_tail_update(
    tail: np.ndarray | tuple[np.ndarray, np.ndarray],
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    positions: np.ndarray,
    slot_idx: np.ndarray,
    *,
    out: np.ndarray | None = None,
    closed: np.ndarray | None = None,
    validate: bool = True,
    out_dtype: Any = None,
    rotate: bool = False,
) -> tuple[np.ndarray, np.ndarray]: ...
@overload
def kpool_tail_update_fp8(
    tail: np.ndarray | tuple[np.ndarray, np.ndarray],
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    positions: np.ndarray,
    slot_idx: np.ndarray,
    *,
    round_scale: bool = True,
    cache: None = None,
    block_table: np.ndarray | None = None,
    out: np.ndarray | None = None,
    out_scale: np.ndarray | None = None,
    closed: np.ndarray | None = None,
    validate: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
@overload
def kpool_tail_update_fp8(
    tail: np.ndarray | tuple[np.ndarray, np.ndarray],
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    positions: np.ndarray,
    slot_idx: np.ndarray,
    *,
    round_scale: bool = True,
    cache: np.ndarray,
    block_table: np.ndarray | None = None,
    out: np.ndarray | None = None,
    out_scale: np.ndarray | None = None,
    closed: np.ndarray | None = None,
    validate: bool = True,
) -> np.ndarray: ...
@overload
def kpool_tail_update_fp8(
    tail: np.ndarray | tuple[np.ndarray, np.ndarray],
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    positions: np.ndarray,
    slot_idx: np.ndarray,
    *,
    round_scale: bool = True,
    cache: np.ndarray | None = None,
    block_table: np.ndarray | None = None,
    out: np.ndarray | None = None,
    out_scale: np.ndarray | None = None,
    closed: np.ndarray | None = None,
    validate: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | np.ndarray: ...
def launch(source_file: str, kernel_name: str, grid: int, block: int, args: tuple[Any, ...]) -> None: ...
def load_variant(source_file: str, kernel_name: str) -> ctypes.CDLL: ...
