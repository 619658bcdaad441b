"""kpool_index_topk, described once: each token's best pools by their index logits, expanded to positions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import FLOAT32
from ..kernel import codes
from ..kernel.declarations import INDEX_TOPK
from ..kernel.geometry import LARGE_BATCH, SELECT_THREADS, LaunchGeometry, select_geometry
from ..pool_offsets import check_kpool
from .families import expansion, split_selection
from .families.scoring import MAX_POOLS, check_rows_of
from .families.selection import MAX_TOKENS, POOL_TOPK, check_covered, check_pool_topk, select_cap
from .framework.checks import (
    as_size,
    check_batch_index,
    check_integer,
    check_rows_and_cache,
    check_workspace,
    check_workspace_size,
    fail,
)
from .framework.examples import Example, ExampleBatch
from .framework.operands import CACHE_LENGTHS, INPUT_ROW_OFFSETS, KPOOL
from .framework.spec import VALIDATE, Backend, CallArgs, Launch, Operand, OpSpec

# A split's candidates at least: whole tiles of the kernel (kp::kTopkGroups * kp::kSelectChunk), and 16 times
# pool_topk, so the lists the last block merges hold at most a sixteenth of the row.
TOPK_TILE = 4096
SPLIT_PER_TOPK = 16


def topk_splits(num_tokens: int, pools: int, pool_topk: int) -> int:
    """Blocks each token's row of ``pools`` logits is split over, from shapes alone."""
    per_split = max(TOPK_TILE, SPLIT_PER_TOPK * pool_topk)
    return max(1, min(split_selection.most_splits(num_tokens, pool_topk), -(-pools // per_split)))


def call_workspace_bytes(num_tokens: int, pools: int, pool_topk: int) -> int:
    """What one call on ``num_tokens`` rows of ``pools`` logits needs (``index_topk_workspace_bytes`` is the most
    over batches up to it): what a call checks and allocates, and what the bench credits."""
    return split_selection.workspace_bytes(num_tokens, topk_splits(num_tokens, pools, pool_topk), pool_topk)


def index_topk_workspace_bytes(num_tokens: int, pools: int, pool_topk: int) -> int:
    """Bytes of ``workspace`` that serve every ``kpool_index_topk`` call on logits of at most ``num_tokens`` rows
    of ``pools`` columns selecting ``pool_topk`` each: the most such a call needs. A call needs 0 when each row
    is one block's (more than 128 rows, or rows of at most max(4096, 16 pool_topk) logits), else the counters
    (the first 512 bytes, whatever num_tokens, so one zeroed buffer serves every call) and, per row and split,
    a head of 16 bytes and pool_topk keys and ids (kernels/kpool_select.cuh's ``kp::select_workspace``). The
    splits a row shrink as rows grow, so the need rises and falls with num_tokens: this is its most over the
    smaller batches too (0 only where none of them splits), and it grows with ``pools``."""
    check_integer("pools", pools, 0)
    return split_selection.checked_workspace_bytes(
        num_tokens, pool_topk, lambda tokens, topk: topk_splits(tokens, int(pools), topk)
    )


@dataclass(frozen=True)
class IndexTopkCall(expansion.Expansion):
    """What the checks learned about a selection call."""

    num_tokens: int
    logits_width: int
    batch: int


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
    expanded = expansion.check(a, batch, int(a.pool_topk))
    expansion.check_outputs(a, num_tokens, expanded)
    check_workspace(a.workspace)
    return IndexTopkCall(**expanded, num_tokens=num_tokens, logits_width=logits_width, batch=batch)


def index_topk_launch(call: IndexTopkCall, operands: dict[str, Any], splits: int) -> Launch:
    """The launch of ``kpool_index_topk``: a block a row and split."""
    o = operands
    logits = o["logits"]
    values, template = expansion.launch_values(call, o)
    values |= {"logits": logits, "logits_stride": logits.strides[0] // 4, "logits_width": call.logits_width}
    values |= {name: o[name] for name in ("input_row_offsets", "cache_lengths")}
    values |= {"batch": call.batch, "num_tokens": call.num_tokens, "kpool": call.kpool, "pool_topk": call.pool_topk}
    values |= {"workspace": o["workspace"], "splits": splits}
    vector = int(codes.data_pointer(logits) % 16 == 0 and logits.strides[0] % 16 == 0)
    template |= {"CAP": select_cap(call.pool_topk), "VECTOR": vector, "IO": o["input_row_offsets"].dtype}
    template |= {"IC": o["cache_lengths"].dtype}
    geometry = LaunchGeometry(call.num_tokens * splits, SELECT_THREADS, call.num_tokens)
    return Launch(INDEX_TOPK, template, values, geometry, o)


def run(backend: Backend, call: IndexTopkCall, a: dict[str, Any], *, validate: bool, **options: Any) -> Any:
    """Validate (one host read of the offsets, lengths and the workspace's counters), find or make the
    workspace, allocate the outputs, launch."""
    workspace = a["workspace"]
    splits = topk_splits(call.num_tokens, call.logits_width, call.pool_topk)
    needed = call_workspace_bytes(call.num_tokens, call.logits_width, call.pool_topk)
    sizing = f"index_topk_workspace_bytes({call.num_tokens}, {call.logits_width}, {call.pool_topk}) covers it"
    check_workspace_size(workspace, needed, sizing)
    if validate:
        counters = split_selection.counters_to_check(workspace, splits)
        offsets, lengths, *rest = backend.host_copies([a["input_row_offsets"], a["cache_lengths"], *counters])
        check_rows_and_cache(call.num_tokens, offsets, lengths)
        check_covered(call, offsets.astype(np.int64), lengths.astype(np.int64), call.tail)
        if counters:
            split_selection.check_counters_zero(rest[0])

    def launch(positions: Any, counts: Any) -> None:
        operands = {name: a[name] for name in ("logits", "input_row_offsets", "cache_lengths", "block_table")}
        space = split_selection.workspace_for_launch(backend, workspace, needed, positions)
        operands |= {"positions": positions, "counts": counts, "workspace": space}
        backend.launch(index_topk_launch(call, operands, splits))

    return expansion.expand_into(backend, call, call.num_tokens, launch, a)


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
    *expansion.OPTIONS,
    *expansion.OUTPUTS,
    split_selection.WORKSPACE,
    VALIDATE,
)


def example(b: ExampleBatch) -> Example:
    """Rounded logits (ties), 3 pools a token and the tail."""
    return (b.logits, b.offsets, b.lengths), {"kpool": 2, "pool_topk": 3, "always_select_tail": True}


SPEC = OpSpec(
    "kpool_index_topk",
    PARAMETERS,
    check_args=check_index_topk_args,
    run=run,
    docs=DOCS,
    **expansion.SELECTING,
    kernel=INDEX_TOPK,
    large_launch=lambda head_dim: select_geometry(LARGE_BATCH),
    example=example,
)

__all__ = ["SPEC", "index_topk_workspace_bytes"]
