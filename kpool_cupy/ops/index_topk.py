"""kpool_index_topk, described once: each token's best pools by their index logits, expanded to positions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import FLOAT32, INT32
from ..kernel import codes
from ..kernel.declarations import INDEX_TOPK, SELECT_CAPS
from ..kernel.geometry import select_geometry
from ..kernel.requests import token_visibility
from ..pool_offsets import check_kpool
from .checks import as_size, check_batch_index, check_rows_and_cache, dtype_fail, fail
from .expand_topk import EXPANSION_OPTIONS, check_paged_table
from .index_logits_fp8 import MAX_POOLS, check_rows_of
from .operands import CACHE_LENGTHS, INPUT_ROW_OFFSETS
from .spec import VALIDATE, Backend, CallArgs, Launch, Operand, OpSpec, Option, OutputShape

# The most pools a token may select: the shared buffer of the largest instantiation (SELECT_CAPS).
MAX_POOL_TOPK = SELECT_CAPS[-1]
# One block a token: a grid of at most 2^31 - 1 blocks.
MAX_TOKENS = (1 << 31) - 1


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


def check_pool_topk(pool_topk: Any) -> None:
    """An integer (TypeError otherwise) in [1, MAX_POOL_TOPK] (ValueError otherwise)."""
    if isinstance(pool_topk, bool) or not isinstance(pool_topk, (int, np.integer)):
        raise dtype_fail("pool_topk", "an integer", type(pool_topk).__name__)
    if not 1 <= int(pool_topk) <= MAX_POOL_TOPK:
        raise fail("pool_topk", f"an integer in [1, {MAX_POOL_TOPK}]", int(pool_topk))


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


def select_cap(pool_topk: int) -> int:
    """The smallest instantiation's buffer that holds pool_topk."""
    return next(cap for cap in SELECT_CAPS if cap >= pool_topk)


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


def last_selectable_position(call: Any, offsets: np.ndarray, lengths: np.ndarray, tail: bool):
    """Each token's last position it could select (any of its visible pools, its tail), -1 for none; and the
    pools each sees (host arrays, validated). ``call``: num_tokens and kpool."""
    _, placed, visible = token_visibility(offsets, lengths, call.num_tokens, call.kpool)
    last = np.where(visible > 0, visible * call.kpool - 1, -1)
    if tail:
        request = np.searchsorted(offsets, np.arange(call.num_tokens), side="right") - 1
        seen = lengths[request] + np.arange(call.num_tokens) - offsets[request] + 1  # positions it sees
        last = np.where(placed & (seen % call.kpool > 0), seen - 1, last)
    return last, visible


def check_covered(call: Any, offsets: np.ndarray, lengths: np.ndarray, tail: bool) -> None:
    """The logits (when the call has them) hold every visible pool, and the block table every selectable
    position (validate=True). ``call``: num_tokens, kpool, block_size, max_blocks, and logits_width or None."""
    last, visible = last_selectable_position(call, offsets, lengths, tail)
    if call.logits_width is not None and visible.size and int(visible.max()) > call.logits_width:
        t = int(np.argmax(visible))
        raise fail("logits", f"at least the {int(visible[t])} pools token {t} sees (columns)", call.logits_width)
    if call.block_size:
        bad = last // call.block_size >= call.max_blocks
        if bad.any():
            t = int(np.argmax(bad))
            raise fail(
                "block_table",
                f"a block for every position token {t} could select (position {int(last[t])} is in block "
                f"{int(last[t]) // call.block_size}; the selection is not known on the host)",
                f"{call.max_blocks} blocks a request",
            )


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
KPOOL = Option("kpool", "int", check=check_kpool)
POOL_TOPK = Option("pool_topk", "int", check=check_pool_topk)
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
