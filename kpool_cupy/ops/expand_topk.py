"""kpool_expand_topk, described once: selected pool ids back to token positions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import INDEX_DTYPES, INT32_MAX, signed_index
from ..kernel.declarations import EXPAND_TOPK
from ..kernel.geometry import LARGE_BATCH, expand_geometry
from ..kernel.requests import ids_with_positions
from ..pool_offsets import check_kpool
from .families import expansion
from .framework.checks import (
    as_size,
    check_batch_index,
    check_contiguous,
    check_rows_and_cache,
    dtype_fail,
    fail,
    require_array,
)
from .framework.examples import Example, ExampleBatch
from .framework.operands import CACHE_LENGTHS, INPUT_ROW_OFFSETS, KPOOL
from .framework.spec import VALIDATE, Backend, CallArgs, Launch, Operand, OpSpec, OutputShape

MAX_WIDTH = 2**31 - 1  # columns of a row of positions: kernels/kpool_expand.cuh counts them in 32 bits


@dataclass(frozen=True)
class ExpandCall(expansion.Expansion):
    """What the checks learned about an expand top-k call."""

    batch: int
    total_tokens: int


def check_expand_topk_args(a: CallArgs) -> ExpandCall:
    check_kpool(a.kpool)
    require_array("pool_ids", a.pool_ids)
    if a.pool_ids.dtype not in INDEX_DTYPES:
        raise dtype_fail("pool_ids", "dtype int32, uint32 or int64", a.pool_ids.dtype)
    if a.pool_ids.ndim != 2:
        raise fail("pool_ids", "a 2-D array [total_tokens, pool_topk]", f"shape {tuple(a.pool_ids.shape)}")
    check_contiguous("pool_ids", a.pool_ids)
    batch = check_batch_index(a.input_row_offsets, a.cache_lengths)
    expanded = expansion.check(a, batch, as_size(a.pool_ids.shape[1]))
    if expanded["width"] > MAX_WIDTH:  # a row's columns are 32-bit in the kernel
        raise fail("pool_ids", f"pool_topk * kpool + tail <= {MAX_WIDTH} columns",
                   f"{expanded['width']} (pool_topk {expanded['pool_topk']}, kpool {expanded['kpool']})")  # fmt: skip
    total_tokens = as_size(a.pool_ids.shape[0])
    expansion.check_outputs(a, total_tokens, expanded)
    return ExpandCall(**expanded, batch=batch, total_tokens=total_tokens)


def output_shapes(call: ExpandCall) -> dict[str, OutputShape]:
    return expansion.output_shapes(call, call.total_tokens)


def expand_launch(call: ExpandCall, operands: dict[str, Any]) -> Launch:
    """The launch of ``kpool_expand_topk``."""
    o = operands
    values, template = expansion.launch_values(call, o)
    values |= {name: o[name] for name in ("pool_ids", "input_row_offsets", "cache_lengths")}
    values |= {"pool_topk": call.pool_topk, "batch": call.batch, "total_tokens": call.total_tokens}
    template |= {"KPOOL": call.kpool, "IPID": o["pool_ids"].dtype, "IO": o["input_row_offsets"].dtype}
    template |= {"IC": o["cache_lengths"].dtype}
    geometry = expand_geometry(call.total_tokens, call.width, call.compact)
    return Launch(EXPAND_TOPK, template, values, geometry, o)


def check_blocks_cover(call: ExpandCall, ids: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> None:
    """Every selected position (and tail position) of a token inside its request's block table (host arrays)."""
    tokens = np.arange(call.total_tokens)
    request = np.searchsorted(offsets, tokens, side="right") - 1
    # An id (int64, from signed_index) whose positions pass int32 expands to -1 as a -1 id does (the kernel's
    # rule): no block to check.
    last = np.where(ids_with_positions(ids, call.kpool), ids * call.kpool + call.kpool - 1, -1).max(axis=1, initial=-1)
    if call.tail:  # the tail: visible - 1 at most, none when visible % kpool == 0; past int32, -1 as in the kernel
        visible = lengths[request] + tokens - offsets[request] + 1
        partial = visible % call.kpool
        tail = (partial > 0) & (visible - partial <= INT32_MAX)
        last = np.maximum(last, np.where(tail, np.minimum(visible - 1, INT32_MAX), -1))
    expansion.check_blocks_reach(call, last, lambda t: (
        f"a block for every selected position (position {int(last[t])} of token {t}, request "
        f"{int(request[t])}, is in block {int(last[t]) // call.block_size})"
    ))  # fmt: skip


def run(backend: Backend, call: ExpandCall, a: dict[str, Any], *, validate: bool, **options: Any) -> Any:
    """Validate, check offsets (and the block table's reach) when asked, allocate the outputs, launch."""
    pool_ids, input_row_offsets, cache_lengths, block_table = (
        a[name] for name in ("pool_ids", "input_row_offsets", "cache_lengths", "block_table")
    )
    if validate:
        copies = [input_row_offsets, cache_lengths] + ([pool_ids.reshape(-1)] if block_table is not None else [])
        host = backend.host_copies(copies)
        check_rows_and_cache(call.total_tokens, host[0], host[1])
        if block_table is not None:
            ids = signed_index(host[2], pool_ids.dtype).reshape(call.total_tokens, call.pool_topk)
            check_blocks_cover(call, ids, host[0], host[1])

    def launch(positions: Any, counts: Any) -> None:
        operands = {"pool_ids": pool_ids, "input_row_offsets": input_row_offsets, "cache_lengths": cache_lengths}
        backend.launch(expand_launch(call, operands | {"block_table": block_table, "positions": positions,
                                                       "counts": counts}))  # fmt: skip

    return expansion.expand_into(backend, call, call.total_tokens, launch, a)


POOL_IDS = Operand("pool_ids", "[total_tokens, pool_topk] int32, uint32 or int64, -1 for no selection")
PARAMETERS = (
    POOL_IDS,
    INPUT_ROW_OFFSETS,
    CACHE_LENGTHS,
    KPOOL,
    expansion.ALWAYS_SELECT_TAIL,
    VALIDATE,
    expansion.BLOCK_TABLE,
    expansion.BLOCK_SIZE,
    expansion.COMPACT,
    *expansion.OUTPUTS,
)
EMULATE_DOC = """Selected pool ids to token positions, running the CUDA kernel on the CPU.

Same contract as :func:`kpool_cupy.kpool_expand_topk`."""
REFERENCE_DOC = "Selected pool ids to token positions (NumPy); same contract as :func:`kpool_cupy.kpool_expand_topk`."
DOCS = {"emulate": EMULATE_DOC, "reference": REFERENCE_DOC}  # the GPU's is the def's (functions.py)


def example(b: ExampleBatch) -> Example:
    """3 pool ids a token, the tail selected too."""
    return (b.pool_ids, b.offsets, b.lengths), {"kpool": b.kpool, "always_select_tail": True}


SPEC = OpSpec(
    "kpool_expand_topk",
    PARAMETERS,
    check_args=check_expand_topk_args,
    run=run,
    docs=DOCS,
    outputs=output_shapes,
    **expansion.RETURNS,
    kernel=EXPAND_TOPK,
    large_launch=lambda head_dim: expand_geometry(LARGE_BATCH, 1, False),
    example=example,
)
