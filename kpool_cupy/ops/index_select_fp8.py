"""kpool_index_select_fp8, described once: the scorer and the selection in one launch, no logits written."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..kernel.declarations import (
    INDEX_PAIRED_TOKENS,
    INDEX_SELECT_FP8,
    INDEX_TILE_PAGES,
    INDEX_VECTOR_CACHE,
    INDEX_VECTOR_Q,
    MMA_WGMMA,
)
from ..kernel.geometry import (
    LARGE_BATCH,
    SELECT_THREADS,
    WGMMA_ROWS,
    LaunchGeometry,
    index_select_shared_bytes,
    select_geometry,
    select_group_tokens,
)
from ..kernel.requests import token_visibility
from ..pool_offsets import check_kpool
from .families import expansion, split_selection
from .families.scoring import (
    MAX_POOLS,
    SCORING_PARAMETERS,
    aligned16,
    check_scorer_head_dim,
    check_scoring_inputs,
    check_table_covers,
    query_values,
)
from .families.selection import MAX_POOL_TOPK, MAX_TOKENS, POOL_TOPK, check_covered, check_pool_topk, select_cap
from .framework.checks import check_rows_and_cache, check_workspace, check_workspace_size, fail
from .framework.examples import SCORING_KPOOL, Example, ExampleBatch
from .framework.spec import VALIDATE, Backend, CallArgs, Launch, OpSpec


def select_splits(num_tokens: int, pool_topk: int) -> int:
    """Blocks a token's visible pools are split over, from shapes alone (the context is not known on the host):
    as many as split_selection allows."""
    return split_selection.most_splits(num_tokens, pool_topk)


def call_workspace_bytes(num_tokens: int, pool_topk: int) -> int:
    """What one call of ``num_tokens`` tokens needs (``index_select_workspace_bytes`` is the most over batches up
    to it): what a call checks and allocates, and what the bench credits."""
    return split_selection.workspace_bytes(num_tokens, select_splits(num_tokens, pool_topk), pool_topk)


def index_select_workspace_bytes(num_tokens: int, pool_topk: int) -> int:
    """Bytes of ``workspace`` that serve every ``kpool_index_select_fp8`` call of at most ``num_tokens`` query
    tokens selecting ``pool_topk`` pools each, whatever the context length: the most such a call needs. A call
    needs 0 when a token's pools are not split over blocks (more than 128 tokens), else the counters (the
    first ``COUNTER_BYTES``, whatever num_tokens, so one zeroed buffer serves every batch size) and, per token
    and split, a head of 16 bytes and pool_topk keys and ids (kernels/kpool_select.cuh's
    ``kp::select_workspace``). The splits a token shrink as tokens grow, so the need rises and falls with
    num_tokens: this is its most over the smaller batches too."""
    return split_selection.checked_workspace_bytes(num_tokens, pool_topk, select_splits)


@dataclass(frozen=True)
class IndexSelectCall(expansion.Expansion):
    """What the checks learned about a fused scoring and selection call."""

    num_tokens: int
    heads: int
    head_dim: int
    batch: int
    pages: int
    cache_block_size: int

    @property
    def logits_width(self) -> None:  # no logits: check_covered's logits check does not apply
        return None


def check_index_select_fp8_args(a: CallArgs) -> IndexSelectCall:
    check_kpool(a.kpool)
    check_pool_topk(a.pool_topk)
    num_tokens, heads, head_dim, pages, cache_block_size, batch = check_scoring_inputs(a)
    if num_tokens > MAX_TOKENS:  # pools are split over blocks for 128 tokens or fewer only
        raise fail("q", f"at most {MAX_TOKENS} tokens (one block a token)", num_tokens)
    expanded = expansion.check(a, batch, int(a.pool_topk))
    expansion.check_outputs(a, num_tokens, expanded)
    check_workspace(a.workspace)
    return IndexSelectCall(**expanded, num_tokens=num_tokens, heads=heads, head_dim=head_dim, batch=batch,
                           pages=pages, cache_block_size=cache_block_size)  # fmt: skip


def index_select_launch(call: IndexSelectCall, operands: dict[str, Any], mma: int, splits: int) -> Launch:
    """The launch of ``kpool_index_select_fp8``."""
    o = operands
    q, weights, cache, table = (o[n] for n in ("q", "weights", "cache", "cache_block_table"))
    values, template = expansion.launch_values(call, o)
    values |= query_values(q, call.heads)
    values |= {"weights": weights, "weights_stride": weights.strides[0] // 4}
    values |= {"cache": cache, "page_stride": cache.strides[0], "pages": call.pages}
    values |= {"cache_block_size": call.cache_block_size, "cache_block_table": table}
    values |= {"table_columns": table.shape[1], "table_stride": table.strides[0] // 4}
    values |= {name: o[name] for name in ("input_row_offsets", "cache_lengths")}
    values |= {"batch": call.batch, "num_tokens": call.num_tokens, "kpool": call.kpool, "pool_topk": call.pool_topk}
    cap = select_cap(call.pool_topk)
    group = select_group_tokens(call.num_tokens, call.batch, call.heads, call.head_dim, mma, cap, splits)
    values |= {"workspace": o["workspace"], "splits": splits, "group_tokens": group}
    vector = (INDEX_VECTOR_CACHE if aligned16(cache, cache.strides[0]) else 0) | (
        INDEX_VECTOR_Q if aligned16(q, q.strides[0], q.strides[1]) else 0
    )
    if mma == MMA_WGMMA and vector & INDEX_VECTOR_CACHE and call.cache_block_size % WGMMA_ROWS == 0:
        vector |= INDEX_TILE_PAGES
    if mma == MMA_WGMMA and call.heads <= WGMMA_ROWS // 2:
        vector |= INDEX_PAIRED_TOKENS
    template |= {"HEAD_DIM": call.head_dim, "MMA": mma, "VECTOR": vector, "CAP": cap}
    template |= {"IO": o["input_row_offsets"].dtype, "IC": o["cache_lengths"].dtype}
    shared = index_select_shared_bytes(call.heads, call.head_dim, mma, cap, group)
    blocks = -(-call.num_tokens // group) * splits
    geometry = LaunchGeometry(blocks, SELECT_THREADS, call.num_tokens, shared_bytes=shared)
    return Launch(INDEX_SELECT_FP8, template, values, geometry, o)


def run(backend: Backend, call: IndexSelectCall, a: dict[str, Any], *, validate: bool, **options: Any) -> Any:
    """Validate (one host read of the offsets, lengths, the cache's table and the workspace's counters), find or
    make the workspace, allocate the outputs, launch."""
    workspace = a["workspace"]
    splits = select_splits(call.num_tokens, call.pool_topk)
    needed = call_workspace_bytes(call.num_tokens, call.pool_topk)
    sizing = f"index_select_workspace_bytes({call.num_tokens}, {call.pool_topk}) covers it"
    check_workspace_size(workspace, needed, sizing)
    if validate:
        table = a["cache_block_table"]
        counters = split_selection.counters_to_check(workspace, splits)
        host = backend.host_copies([a["input_row_offsets"], a["cache_lengths"], table.reshape(-1), *counters])
        offsets, lengths = host[0].astype(np.int64), host[1].astype(np.int64)
        check_rows_and_cache(call.num_tokens, host[0], host[1])
        _, _, visible = token_visibility(offsets, lengths, call.num_tokens, call.kpool)
        if visible.size and int(visible.max()) > MAX_POOLS:
            t = int(np.argmax(visible))
            raise fail("cache_lengths", f"at most {MAX_POOLS} pools a token sees (pool ids are int32)",
                       f"{int(visible[t])} pools at token {t}")  # fmt: skip
        scoring = SimpleNamespace(kpool=call.kpool, block_size=call.cache_block_size, pages=call.pages)
        check_table_covers(scoring, host[2].reshape(table.shape), lengths, offsets)
        check_covered(call, offsets, lengths, call.tail)
        if counters:
            split_selection.check_counters_zero(host[3])

    def launch(positions: Any, counts: Any) -> None:
        space = split_selection.workspace_for_launch(backend, workspace, needed, positions)
        operands = {n: a[n] for n in ("q", "weights", "cache", "cache_block_table", "input_row_offsets")}
        operands |= {"cache_lengths": a["cache_lengths"], "block_table": a["block_table"]}
        operands |= {"positions": positions, "counts": counts, "workspace": space}
        backend.launch(index_select_launch(call, operands, backend.tensor_core(), splits))

    return expansion.expand_into(backend, call, call.num_tokens, launch, a)


EMULATE_DOC = """:func:`kpool_cupy.kpool_index_select_fp8`, running the CUDA kernel on the CPU (host arrays)."""
REFERENCE_DOC = (
    """:func:`kpool_cupy.kpool_index_select_fp8` in NumPy: the reference scorer's logits, then its selection."""
)
DOCS = {"emulate": EMULATE_DOC, "reference": REFERENCE_DOC}  # the GPU's is the def's (functions.py)

PARAMETERS = (
    *SCORING_PARAMETERS,
    POOL_TOPK,
    *expansion.OPTIONS,
    *expansion.OUTPUTS,
    split_selection.WORKSPACE,
    VALIDATE,
)


def example(b: ExampleBatch) -> Example:
    """The scoring batch, 1 pool a token and the tail."""
    return b.scoring, {"kpool": SCORING_KPOOL, "pool_topk": 1, "always_select_tail": True}


SPEC = OpSpec(
    "kpool_index_select_fp8",
    PARAMETERS,
    check_args=check_index_select_fp8_args,
    run=run,
    docs=DOCS,
    **expansion.SELECTING,
    kernel=INDEX_SELECT_FP8,
    large_launch=lambda head_dim: select_geometry(LARGE_BATCH),
    large_dynamic_shared=lambda head_dim, mma: index_select_shared_bytes(64, head_dim, mma, 512, 1),
    check_head_dim=check_scorer_head_dim,
    example=example,
)

__all__ = ["MAX_POOL_TOPK", "SPEC", "index_select_workspace_bytes"]
