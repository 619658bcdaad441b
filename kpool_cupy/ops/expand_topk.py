"""kpool_expand_topk, described once: selected pool ids back to token positions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import INDEX_DTYPES, INT32
from ..kernel import codes
from ..kernel.geometry import flat_geometry
from ..kernel.names import EXPAND_SOURCE, expand_kernel_name
from ..pool_offsets import check_kpool
from .checks import check_batch_index, check_contiguous, check_rows_and_cache, dtype_fail, fail, require_array
from .operands import CACHE_LENGTHS, INPUT_ROW_OFFSETS
from .spec import VALIDATE, Backend, Launch, Operand, OpSpec, Option, OutputShape


@dataclass(frozen=True)
class ExpandCall:
    """What the checks learned about an expand top-k call."""

    kpool: int
    batch: int
    total_tokens: int
    pool_topk: int
    width: int  # columns of positions: pool_topk * kpool, plus kpool - 1 with always_select_tail


def check_expand_args(
    pool_ids: Any, input_row_offsets: Any, cache_lengths: Any, kpool: Any, always_select_tail: bool
) -> ExpandCall:
    check_kpool(kpool)
    require_array("pool_ids", pool_ids)
    if pool_ids.dtype not in INDEX_DTYPES:
        raise dtype_fail("pool_ids", "dtype int32, uint32 or int64", pool_ids.dtype)
    if pool_ids.ndim != 2:
        raise fail("pool_ids", "a 2-D array [total_tokens, pool_topk]", f"shape {tuple(pool_ids.shape)}")
    check_contiguous("pool_ids", pool_ids)
    batch = check_batch_index(input_row_offsets, cache_lengths)
    kpool = int(kpool)
    pool_topk = int(pool_ids.shape[1])
    width = pool_topk * kpool + (kpool - 1 if always_select_tail else 0)
    return ExpandCall(kpool, batch, int(pool_ids.shape[0]), pool_topk, width)


def output_shapes(call: ExpandCall) -> dict[str, OutputShape]:
    return {"positions": ((call.total_tokens, call.width), INT32)}


def expand_launch(call: ExpandCall, operands: dict[str, Any]) -> Launch:
    """The launch of ``kpool_expand_topk``, arguments in kernels/kpool_expand.cu's order."""
    o = operands
    arguments = (
        o["pool_ids"],
        np.int64(call.pool_topk),
        o["input_row_offsets"],
        o["cache_lengths"],
        np.int64(call.batch),
        np.int64(call.total_tokens),
        o["positions"],
        np.int64(call.width),
    )
    geometry = flat_geometry(call.total_tokens * call.width)
    name = expand_kernel_name(call.kpool, codes.index_dtypes(o["pool_ids"], o["input_row_offsets"], o["cache_lengths"]))
    return Launch("kpool_expand_topk", EXPAND_SOURCE, name, geometry, arguments, call, o)


def run(backend: Backend, arrays: tuple[Any, ...], *, kpool: int, always_select_tail: bool, validate: bool) -> Any:
    """Validate, check offsets when asked, allocate the positions, launch."""
    pool_ids, input_row_offsets, cache_lengths = arrays
    call = check_expand_args(pool_ids, input_row_offsets, cache_lengths, kpool, always_select_tail)
    if validate:
        offsets, lengths = backend.host_copies([input_row_offsets, cache_lengths])
        check_rows_and_cache(call.total_tokens, offsets, lengths)
    # Every element is written, so no zero fill (ring close and tail update
    # zero theirs: the rows of pools that did not close are left alone).
    positions = backend.empty(*output_shapes(call)["positions"])
    if positions.size:
        operands = {"pool_ids": pool_ids, "input_row_offsets": input_row_offsets, "cache_lengths": cache_lengths}
        backend.launch(expand_launch(call, {**operands, "positions": positions}))
    return positions


GPU_DOC = """Selected pool ids ``[total_tokens, pool_topk]`` to token positions, int32.

    positions[t, s*kpool + j] = pool_ids[t, s] * kpool + j, or -1 where pool_ids[t, s] < 0

A -1 id stays -1 in all its columns, never a clamped valid position (so
does an id whose positions would not fit int32). With
``always_select_tail``, ``kpool - 1`` more columns hold the query's
trailing positions no complete pool covers yet: with ``visible =
cache_len + local_index + 1``, column ``i < visible % kpool`` holds
``visible - visible % kpool + i``, the rest -1.
"""

POOL_IDS = Operand("pool_ids", "[total_tokens, pool_topk] int32, uint32 or int64, -1 for no selection")
KPOOL = Option("kpool", "int")  # keyword-only and required: the ids alone do not say it
ALWAYS_SELECT_TAIL = Option("always_select_tail", "bool", False)
PARAMETERS = (POOL_IDS, INPUT_ROW_OFFSETS, CACHE_LENGTHS, KPOOL, ALWAYS_SELECT_TAIL, VALIDATE)
EMULATE_DOC = """Selected pool ids to token positions, running the CUDA kernel on the CPU.

Same contract as :func:`kpool_cupy.kpool_expand_topk`."""
REFERENCE_DOC = "Selected pool ids to token positions (NumPy); same contract as :func:`kpool_cupy.kpool_expand_topk`."
DOCS = {"cupy": GPU_DOC, "emulate": EMULATE_DOC, "reference": REFERENCE_DOC}
SPEC = OpSpec("kpool_expand_topk", PARAMETERS, ("positions",), run, DOCS, output_shapes)
