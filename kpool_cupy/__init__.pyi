# Written by kpool_cupy/tools/stubs.py from the module's exports (python -m kpool_cupy.tools.stubs);
# tests/test_type_stubs.py checks it.
from typing import Any, Literal, overload

from . import emulate as emulate
from . import reference as reference
from .arrays import CupyArray, DeviceArray

__version__: str

def compile_ptx(head_dim: int, kpool: int, dtype: str = "bfloat16", *, arch: str = "sm_90") -> str: ...
def hadamard_quant_fp8(
    x: DeviceArray,
    *,
    round_scale: bool = True,
    out: DeviceArray | None = None,
    out_scale: DeviceArray | None = None,
    validate: bool = True,
    stream: Any = None,
) -> tuple[CupyArray, CupyArray]: ...
def kpool_compress(
    k: DeviceArray,
    gate: DeviceArray,
    ape: DeviceArray,
    input_row_offsets: DeviceArray,
    cache_lengths: DeviceArray,
    *,
    pool_row_offsets: DeviceArray | None = None,
    out: DeviceArray | None = None,
    validate: bool = True,
    out_dtype: Any = None,
    rotate: bool = False,
    stream: Any = None,
) -> CupyArray: ...
@overload
def kpool_compress_fp8(
    k: DeviceArray,
    gate: DeviceArray,
    ape: DeviceArray,
    input_row_offsets: DeviceArray,
    cache_lengths: DeviceArray,
    *,
    pool_row_offsets: DeviceArray | None = None,
    round_scale: bool = True,
    cache: None = None,
    slots: DeviceArray | None = None,
    block_table: DeviceArray | None = None,
    out: DeviceArray | None = None,
    out_scale: DeviceArray | None = None,
    validate: bool = True,
    stream: Any = None,
) -> tuple[CupyArray, CupyArray]: ...
@overload
def kpool_compress_fp8(
    k: DeviceArray,
    gate: DeviceArray,
    ape: DeviceArray,
    input_row_offsets: DeviceArray,
    cache_lengths: DeviceArray,
    *,
    pool_row_offsets: DeviceArray | None = None,
    round_scale: bool = True,
    cache: DeviceArray,
    slots: DeviceArray | None = None,
    block_table: DeviceArray | None = None,
    out: DeviceArray | None = None,
    out_scale: DeviceArray | None = None,
    validate: bool = True,
    stream: Any = None,
) -> None: ...
@overload
def kpool_compress_fp8(
    k: DeviceArray,
    gate: DeviceArray,
    ape: DeviceArray,
    input_row_offsets: DeviceArray,
    cache_lengths: DeviceArray,
    *,
    pool_row_offsets: DeviceArray | None = None,
    round_scale: bool = True,
    cache: DeviceArray | None = None,
    slots: DeviceArray | None = None,
    block_table: DeviceArray | None = None,
    out: DeviceArray | None = None,
    out_scale: DeviceArray | None = None,
    validate: bool = True,
    stream: Any = None,
) -> tuple[CupyArray, CupyArray] | None: ...
@overload
def kpool_expand_topk(
    pool_ids: DeviceArray,
    input_row_offsets: DeviceArray,
    cache_lengths: DeviceArray,
    *,
    kpool: int,
    always_select_tail: bool = False,
    validate: bool = True,
    block_table: DeviceArray | None = None,
    block_size: int | None = None,
    compact: Literal[False] = False,
    stream: Any = None,
) -> CupyArray: ...
@overload
def kpool_expand_topk(
    pool_ids: DeviceArray,
    input_row_offsets: DeviceArray,
    cache_lengths: DeviceArray,
    *,
    kpool: int,
    always_select_tail: bool = False,
    validate: bool = True,
    block_table: DeviceArray | None = None,
    block_size: int | None = None,
    compact: Literal[True],
    stream: Any = None,
) -> tuple[CupyArray, CupyArray]: ...
@overload
def kpool_expand_topk(
    pool_ids: DeviceArray,
    input_row_offsets: DeviceArray,
    cache_lengths: DeviceArray,
    *,
    kpool: int,
    always_select_tail: bool = False,
    validate: bool = True,
    block_table: DeviceArray | None = None,
    block_size: int | None = None,
    compact: bool = False,
    stream: Any = None,
) -> CupyArray | tuple[CupyArray, CupyArray]: ...
def kpool_index_logits_fp8(
    q: DeviceArray,
    weights: DeviceArray,
    cache: DeviceArray,
    cache_block_table: DeviceArray,
    input_row_offsets: DeviceArray,
    cache_lengths: DeviceArray,
    *,
    kpool: int,
    max_pools: int | None = None,
    out: DeviceArray | None = None,
    validate: bool = True,
    stream: Any = None,
) -> CupyArray: ...
@overload
def kpool_index_topk(
    logits: DeviceArray,
    input_row_offsets: DeviceArray,
    cache_lengths: DeviceArray,
    *,
    kpool: int,
    pool_topk: int,
    always_select_tail: bool = False,
    block_table: DeviceArray | None = None,
    block_size: int | None = None,
    compact: Literal[False] = False,
    validate: bool = True,
    stream: Any = None,
) -> CupyArray: ...
@overload
def kpool_index_topk(
    logits: DeviceArray,
    input_row_offsets: DeviceArray,
    cache_lengths: DeviceArray,
    *,
    kpool: int,
    pool_topk: int,
    always_select_tail: bool = False,
    block_table: DeviceArray | None = None,
    block_size: int | None = None,
    compact: Literal[True],
    validate: bool = True,
    stream: Any = None,
) -> tuple[CupyArray, CupyArray]: ...
@overload
def kpool_index_topk(
    logits: DeviceArray,
    input_row_offsets: DeviceArray,
    cache_lengths: DeviceArray,
    *,
    kpool: int,
    pool_topk: int,
    always_select_tail: bool = False,
    block_table: DeviceArray | None = None,
    block_size: int | None = None,
    compact: bool = False,
    validate: bool = True,
    stream: Any = None,
) -> CupyArray | tuple[CupyArray, CupyArray]: ...
def kpool_ring_close(
    tail: DeviceArray | tuple[DeviceArray, DeviceArray],
    k: DeviceArray,
    gate: DeviceArray,
    ape: DeviceArray,
    input_row_offsets: DeviceArray,
    cache_lengths: DeviceArray,
    slot_idx: DeviceArray,
    *,
    out: DeviceArray | None = None,
    closed: DeviceArray | None = None,
    validate: bool = True,
    out_dtype: Any = None,
    rotate: bool = False,
    stream: Any = None,
) -> tuple[CupyArray, CupyArray]: ...
@overload
def kpool_ring_close_fp8(
    tail: DeviceArray | tuple[DeviceArray, DeviceArray],
    k: DeviceArray,
    gate: DeviceArray,
    ape: DeviceArray,
    input_row_offsets: DeviceArray,
    cache_lengths: DeviceArray,
    slot_idx: DeviceArray,
    *,
    round_scale: bool = True,
    cache: None = None,
    slots: DeviceArray | None = None,
    block_table: DeviceArray | None = None,
    out: DeviceArray | None = None,
    out_scale: DeviceArray | None = None,
    closed: DeviceArray | None = None,
    validate: bool = True,
    stream: Any = None,
) -> tuple[CupyArray, CupyArray, CupyArray]: ...
@overload
def kpool_ring_close_fp8(
    tail: DeviceArray | tuple[DeviceArray, DeviceArray],
    k: DeviceArray,
    gate: DeviceArray,
    ape: DeviceArray,
    input_row_offsets: DeviceArray,
    cache_lengths: DeviceArray,
    slot_idx: DeviceArray,
    *,
    round_scale: bool = True,
    cache: DeviceArray,
    slots: DeviceArray | None = None,
    block_table: DeviceArray | None = None,
    out: DeviceArray | None = None,
    out_scale: DeviceArray | None = None,
    closed: DeviceArray | None = None,
    validate: bool = True,
    stream: Any = None,
) -> CupyArray: ...
@overload
def kpool_ring_close_fp8(
    tail: DeviceArray | tuple[DeviceArray, DeviceArray],
    k: DeviceArray,
    gate: DeviceArray,
    ape: DeviceArray,
    input_row_offsets: DeviceArray,
    cache_lengths: DeviceArray,
    slot_idx: DeviceArray,
    *,
    round_scale: bool = True,
    cache: DeviceArray | None = None,
    slots: DeviceArray | None = None,
    block_table: DeviceArray | None = None,
    out: DeviceArray | None = None,
    out_scale: DeviceArray | None = None,
    closed: DeviceArray | None = None,
    validate: bool = True,
    stream: Any = None,
) -> tuple[CupyArray, CupyArray, CupyArray] | CupyArray: ...
def kpool_seed_tail(
    tail: DeviceArray | tuple[DeviceArray, DeviceArray],
    k: DeviceArray,
    gate: DeviceArray,
    input_row_offsets: DeviceArray,
    cache_lengths: DeviceArray,
    slot_idx: DeviceArray,
    *,
    validate: bool = True,
    kpool: int | None = None,
    stream: Any = None,
) -> None: ...
def kpool_tail_update(
    tail: DeviceArray | tuple[DeviceArray, DeviceArray],
    k: DeviceArray,
    gate: DeviceArray,
    ape: DeviceArray,
    positions: DeviceArray,
    slot_idx: DeviceArray,
    *,
    out: DeviceArray | None = None,
    closed: DeviceArray | None = None,
    validate: bool = True,
    out_dtype: Any = None,
    rotate: bool = False,
    stream: Any = None,
) -> tuple[CupyArray, CupyArray]: ...
@overload
def kpool_tail_update_fp8(
    tail: DeviceArray | tuple[DeviceArray, DeviceArray],
    k: DeviceArray,
    gate: DeviceArray,
    ape: DeviceArray,
    positions: DeviceArray,
    slot_idx: DeviceArray,
    *,
    round_scale: bool = True,
    cache: None = None,
    block_table: DeviceArray | None = None,
    out: DeviceArray | None = None,
    out_scale: DeviceArray | None = None,
    closed: DeviceArray | None = None,
    validate: bool = True,
    stream: Any = None,
) -> tuple[CupyArray, CupyArray, CupyArray]: ...
@overload
def kpool_tail_update_fp8(
    tail: DeviceArray | tuple[DeviceArray, DeviceArray],
    k: DeviceArray,
    gate: DeviceArray,
    ape: DeviceArray,
    positions: DeviceArray,
    slot_idx: DeviceArray,
    *,
    round_scale: bool = True,
    cache: DeviceArray,
    block_table: DeviceArray | None = None,
    out: DeviceArray | None = None,
    out_scale: DeviceArray | None = None,
    closed: DeviceArray | None = None,
    validate: bool = True,
    stream: Any = None,
) -> CupyArray: ...
@overload
def kpool_tail_update_fp8(
    tail: DeviceArray | tuple[DeviceArray, DeviceArray],
    k: DeviceArray,
    gate: DeviceArray,
    ape: DeviceArray,
    positions: DeviceArray,
    slot_idx: DeviceArray,
    *,
    round_scale: bool = True,
    cache: DeviceArray | None = None,
    block_table: DeviceArray | None = None,
    out: DeviceArray | None = None,
    out_scale: DeviceArray | None = None,
    closed: DeviceArray | None = None,
    validate: bool = True,
    stream: Any = None,
) -> tuple[CupyArray, CupyArray, CupyArray] | CupyArray: ...
def pool_row_offsets(input_row_offsets: Any, cache_lengths: Any, kpool: int) -> Any: ...
