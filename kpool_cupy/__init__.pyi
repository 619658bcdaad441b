# Written by kpool_cupy/tools/stubs.py from the module's exports (python -m kpool_cupy.tools.stubs);
# tests/test_type_stubs.py checks it.
from typing import Any

from . import emulate as emulate
from . import reference as reference

__version__: str

def compile_ptx(head_dim: int, kpool: int, dtype: str = "bfloat16", *, arch: str = "sm_90") -> str: ...
def hadamard_quant_fp8(
    x: Any,
    *,
    round_scale: bool = True,
    out: Any = None,
    out_scale: Any = None,
    validate: bool = True,
    stream: Any = None,
) -> tuple[Any, Any]: ...
def kpool_compress(
    k: Any,
    gate: Any,
    ape: Any,
    input_row_offsets: Any,
    cache_lengths: Any,
    *,
    pool_row_offsets: Any = None,
    out: Any = None,
    validate: bool = True,
    out_dtype: Any = None,
    rotate: bool = False,
    stream: Any = None,
) -> Any: ...
def kpool_compress_fp8(
    k: Any,
    gate: Any,
    ape: Any,
    input_row_offsets: Any,
    cache_lengths: Any,
    *,
    pool_row_offsets: Any = None,
    round_scale: bool = True,
    cache: Any = None,
    slots: Any = None,
    block_table: Any = None,
    out: Any = None,
    out_scale: Any = None,
    validate: bool = True,
    stream: Any = None,
) -> tuple[Any, Any]: ...
def kpool_expand_topk(
    pool_ids: Any,
    input_row_offsets: Any,
    cache_lengths: Any,
    *,
    kpool: int,
    always_select_tail: bool = False,
    validate: bool = True,
    block_table: Any = None,
    block_size: int | None = None,
    compact: bool = False,
    stream: Any = None,
) -> Any: ...
def kpool_ring_close(
    tail: Any,
    k: Any,
    gate: Any,
    ape: Any,
    input_row_offsets: Any,
    cache_lengths: Any,
    slot_idx: Any,
    *,
    out: Any = None,
    closed: Any = None,
    validate: bool = True,
    out_dtype: Any = None,
    rotate: bool = False,
    stream: Any = None,
) -> tuple[Any, Any]: ...
def kpool_ring_close_fp8(
    tail: Any,
    k: Any,
    gate: Any,
    ape: Any,
    input_row_offsets: Any,
    cache_lengths: Any,
    slot_idx: Any,
    *,
    round_scale: bool = True,
    cache: Any = None,
    slots: Any = None,
    block_table: Any = None,
    out: Any = None,
    out_scale: Any = None,
    closed: Any = None,
    validate: bool = True,
    stream: Any = None,
) -> tuple[Any, Any, Any]: ...
def kpool_seed_tail(
    tail: Any,
    k: Any,
    gate: Any,
    input_row_offsets: Any,
    cache_lengths: Any,
    slot_idx: Any,
    *,
    validate: bool = True,
    kpool: int | None = None,
    stream: Any = None,
) -> None: ...
def kpool_tail_update(
    tail: Any,
    k: Any,
    gate: Any,
    ape: Any,
    positions: Any,
    slot_idx: Any,
    *,
    out: Any = None,
    closed: Any = None,
    validate: bool = True,
    out_dtype: Any = None,
    rotate: bool = False,
    stream: Any = None,
) -> tuple[Any, Any]: ...
def kpool_tail_update_fp8(
    tail: Any,
    k: Any,
    gate: Any,
    ape: Any,
    positions: Any,
    slot_idx: Any,
    *,
    round_scale: bool = True,
    cache: Any = None,
    block_table: Any = None,
    out: Any = None,
    out_scale: Any = None,
    closed: Any = None,
    validate: bool = True,
    stream: Any = None,
) -> tuple[Any, Any, Any]: ...
def pool_row_offsets(input_row_offsets: Any, cache_lengths: Any, kpool: int) -> Any: ...
