"""kpool_index_topk, described once: each token's best pools by their index logits, expanded to positions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import FLOAT32, INT32
from ..kernel import codes
from ..kernel.declarations import INDEX_TOPK
from ..kernel.geometry import select_geometry
from ..pool_offsets import check_kpool
from .families.expansion import EXPANSION_OPTIONS, check_paged_table
from .families.scoring import MAX_POOLS, check_rows_of
from .families.selection import MAX_TOKENS, POOL_TOPK, check_covered, check_pool_topk, select_cap
from .framework.checks import as_size, check_batch_index, check_rows_and_cache, fail
from .framework.operands import CACHE_LENGTHS, INPUT_ROW_OFFSETS, KPOOL
from .framework.spec import VALIDATE, Backend, CallArgs, Launch, Operand, OpSpec, OutputShape


@dataclass(frozen=True)
class IndexTopkCall:
    """What the checks learned about a selection call."""

    num_tokens: int
    logits_width: int
    batch: int
    kpool: int
    pool_topk: int
    width: int  # columns of positions: pool_topk * kpool, plus kpool - 1 with always_select_tail
    max_blocks: int  # columns of block_table; 0 without one
    block_size: int  # 0 without a block table
    compact: bool


def check_index_topk_args(a: CallArgs) -> IndexTopkCall:
    check_kpool(a.kpool)
    check_pool_topk(a.pool_topk)
    check_rows_of("logits", a.logits, FLOAT32, 2, "[num_tokens, pools]")
    num_tokens, logits_width = (as_size(n) for n in a.logits.shape)
    if num_tokens > MAX_TOKENS:
        raise fail("logits", f"at most {MAX_TOKENS} tokens (one block a token)", num_tokens)
    if logits_width > MAX_POOLS:
        raise fail("logits", f"at most {MAX_POOLS} pools a row (pool ids are int32)", logits_width)
    batch = check_batch_index(a.input_row_offsets, a.cache_lengths)
    kpool, pool_topk = int(a.kpool), int(a.pool_topk)
    width = pool_topk * kpool + (kpool - 1 if a.always_select_tail else 0)
    max_blocks, size = check_paged_table(a.block_table, a.block_size, batch)
    return IndexTopkCall(num_tokens, logits_width, batch, kpool, pool_topk, width, max_blocks, size, bool(a.compact))


def output_shapes(call: IndexTopkCall) -> dict[str, OutputShape]:
    shapes = {"positions": ((call.num_tokens, call.width), INT32)}
    if call.compact:
        shapes["counts"] = ((call.num_tokens,), INT32)
    return shapes


def index_topk_launch(call: IndexTopkCall, operands: dict[str, Any]) -> Launch:
    """The launch of ``kpool_index_topk``."""
    o = operands
    logits, positions = o["logits"], o["positions"]
    paged = o.get("block_table") is not None
    values = {"logits": logits, "logits_stride": logits.strides[0] // 4, "logits_width": call.logits_width}
    values |= {name: o[name] for name in ("input_row_offsets", "cache_lengths")}
    values |= {"batch": call.batch, "num_tokens": call.num_tokens, "kpool": call.kpool, "pool_topk": call.pool_topk}
    values |= {"block_table": o["block_table"] if paged else positions}  # any int32 array where none is read
    values |= {"max_blocks": call.max_blocks, "block_table_stride": codes.stride(o["block_table"]) if paged else 0}
    values |= {"block_size": max(call.block_size, 1), "positions": positions, "width": call.width}
    values |= {"counts": o["counts"] if call.compact else positions}  # written only when compacting
    vector = int(codes.data_pointer(logits) % 16 == 0 and logits.strides[0] % 16 == 0)
    template = {"CAP": select_cap(call.pool_topk), "VECTOR": vector, "IO": o["input_row_offsets"].dtype}
    template |= {"IC": o["cache_lengths"].dtype, "PAGED": paged, "COMPACT": call.compact}
    return Launch(INDEX_TOPK, template, values, select_geometry(call.num_tokens), o)


def run(backend: Backend, call: IndexTopkCall, a: dict[str, Any], *, validate: bool, **options: Any) -> Any:
    """Validate (one host read of the offsets and lengths), allocate the outputs, launch."""
    if validate:
        offsets, lengths = backend.host_copies([a["input_row_offsets"], a["cache_lengths"]])
        check_rows_and_cache(call.num_tokens, offsets, lengths)
        tail = call.width > call.pool_topk * call.kpool
        check_covered(call, offsets.astype(np.int64), lengths.astype(np.int64), tail)
    shapes = output_shapes(call)
    positions = backend.empty(*shapes["positions"])
    counts = backend.empty(*shapes["counts"]) if call.compact else None
    if positions.size:
        operands = {name: a[name] for name in ("logits", "input_row_offsets", "cache_lengths", "block_table")}
        operands |= {"positions": positions, "counts": counts}
        backend.launch(index_topk_launch(call, operands))
    elif counts is not None and counts.size:
        counts[...] = 0
    return (positions, counts) if call.compact else positions


EMULATE_DOC = """:func:`kpool_cupy.kpool_index_topk`, running the CUDA kernel on the CPU (host arrays)."""
REFERENCE_DOC = (
    """:func:`kpool_cupy.kpool_index_topk` in NumPy: a stable argsort by the stated order, then the expansion."""
)
DOCS = {"emulate": EMULATE_DOC, "reference": REFERENCE_DOC}  # the GPU's is the def's (functions.py)

LOGITS = Operand("logits", "[num_tokens, pools] float32; last dim contiguous")
PARAMETERS = (
    LOGITS,
    INPUT_ROW_OFFSETS,
    CACHE_LENGTHS,
    KPOOL,
    POOL_TOPK,
    *EXPANSION_OPTIONS,
    VALIDATE,
)

SPEC = OpSpec(
    "kpool_index_topk",
    PARAMETERS,
    ("positions",),
    check_index_topk_args,
    run,
    DOCS,
    output_shapes,
    conditional_results={"counts": "compact"},
    kernel=INDEX_TOPK,
)
