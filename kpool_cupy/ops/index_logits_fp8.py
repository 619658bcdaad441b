"""kpool_index_logits_fp8, described once: query tokens scored against the pooled FP8 cache."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..dtypes import FLOAT32
from ..kernel.declarations import INDEX_LOGITS_FP8, INDEX_VECTOR_CACHE, INDEX_VECTOR_Q
from ..kernel.geometry import index_block_pools, index_geometry, index_logits_shared_bytes, index_stage_tokens
from ..kernel.requests import token_visibility
from ..pool_offsets import check_kpool
from .families.scoring import (
    MAX_POOLS,
    SCORING_PARAMETERS,
    aligned16,
    check_rows_of,
    check_scorer_head_dim,
    check_scoring_inputs,
    check_table_covers,
    query_values,
    scoring_launch,
)
from .framework.checks import (
    as_size,
    check_integer,
    check_rows_and_cache,
    check_writable_rows,
    fail,
)
from .framework.examples import SCORING_KPOOL, Example, ExampleBatch
from .framework.spec import VALIDATE, Backend, CallArgs, Launch, Operand, OpSpec, Option, OutputShape


@dataclass(frozen=True)
class IndexLogitsCall:
    """What the checks learned about a scoring call."""

    num_tokens: int
    heads: int
    head_dim: int
    batch: int
    kpool: int
    pages: int
    block_size: int
    max_pools: int | None  # None: the most pools any token sees, read from the device
    sized_by: str  # what set the width: max_pools, out, or (neither given) cache_lengths: the name an error gives


def check_max_pools(max_pools: Any) -> None:
    check_integer("max_pools", max_pools, 0, MAX_POOLS, or_none=True)


def check_index_logits_fp8_args(a: CallArgs) -> IndexLogitsCall:
    check_kpool(a.kpool)
    num_tokens, heads, head_dim, pages, block_size, batch = check_scoring_inputs(a)
    if a.max_pools is not None:
        check_max_pools(a.max_pools)
    max_pools = None if a.max_pools is None else as_size(a.max_pools)
    if a.out is not None:
        check_rows_of("out", a.out, FLOAT32, 2, "[num_tokens, max_pools]")
        check_writable_rows("out", a.out)
        width = as_size(a.out.shape[1])
        if width > MAX_POOLS:  # as max_pools is, and kpool_index_topk's logits: the kernels' pool ids are int32
            raise fail("out", f"at most {MAX_POOLS} pools a row (pool ids are int32)", f"shape {tuple(a.out.shape)}")
        if a.out.shape[0] != num_tokens or (max_pools is not None and width != max_pools):
            wanted = f"shape [{num_tokens}, {'max_pools' if max_pools is None else max_pools}]"
            raise fail("out", f"{wanted} (q's tokens)", f"shape {tuple(a.out.shape)}")
        max_pools = width
    sized_by = "max_pools" if a.max_pools is not None else "out" if a.out is not None else "cache_lengths"
    return IndexLogitsCall(num_tokens, heads, head_dim, batch, int(a.kpool), pages, block_size, max_pools, sized_by)


def output_shapes(call: IndexLogitsCall, max_pools: int | None) -> dict[str, OutputShape]:
    """``max_pools``: the width the data decided; None where the call fixed it (``call.max_pools``)."""
    return {"out": ((call.num_tokens, call.max_pools if max_pools is None else max_pools), FLOAT32)}


def tokens_per_block(heads: int, head_dim: int, tokens: int, batch: int, mma: int) -> int:
    """Tokens a block scores with one read of its keys: about 16 head tiles a warp, no more than the batch's tokens
    a request on average (decode: next_n), so a decode tile holds one request's tokens and its warps do not fetch
    one request's keys after another's, and no more than the kernel's shared stage holds (``mma``: the path). From
    shapes alone: no host read."""
    by_heads = max(1, min(16, 64 // -(-heads // 16) // 4))
    per_request = max(1, round(tokens / batch)) if batch else 1
    return min(by_heads, per_request, index_stage_tokens(heads, head_dim, mma))


def index_logits_launch(call: IndexLogitsCall, operands: dict[str, Any], max_pools: int, mma: int) -> Launch:
    """The launch of ``kpool_index_logits_fp8``."""
    o = operands
    q, weights, cache, table, out = (o[n] for n in ("q", "weights", "cache", "cache_block_table", "out"))
    per_block = tokens_per_block(call.heads, call.head_dim, call.num_tokens, call.batch, mma)
    block_pools = index_block_pools(call.head_dim, mma)
    geometry, pools_per_block = index_geometry(call.num_tokens, max_pools, per_block, block_pools)
    if geometry.grid > MAX_POOLS:  # ranges shrink as token tiles grow: only the tokens can pass the bound
        raise fail("q", "few enough tokens for one launch (token tiles x pool ranges < 2^31)", call.num_tokens)
    values = query_values(q, call.heads)
    values |= {"weights": weights, "weights_stride": weights.strides[0] // 4}
    values |= {"cache": cache, "page_stride": cache.strides[0], "pages": call.pages, "block_size": call.block_size}
    values |= {"cache_block_table": table, "table_columns": table.shape[1], "table_stride": table.strides[0] // 4}
    values |= {name: o[name] for name in ("input_row_offsets", "cache_lengths")}
    values |= {"batch": call.batch, "num_tokens": call.num_tokens, "kpool": call.kpool}
    values |= {"out": out, "out_stride": out.strides[0] // 4, "max_pools": max_pools}
    values |= {"tokens_per_block": per_block, "token_tiles": geometry.items, "pools_per_block": pools_per_block}
    vector = 0
    if aligned16(cache, cache.strides[0]):
        vector |= INDEX_VECTOR_CACHE
    if aligned16(q, q.strides[0], q.strides[1]):
        vector |= INDEX_VECTOR_Q
    template = {"HEAD_DIM": call.head_dim, "MMA": mma, "VECTOR": vector}
    template |= {"IO": o["input_row_offsets"].dtype, "IC": o["cache_lengths"].dtype}
    shared = index_logits_shared_bytes(call.heads, call.head_dim, per_block, mma)
    return Launch(INDEX_LOGITS_FP8, template, values, replace(geometry, shared_bytes=shared), o)


def run(backend: Backend, call: IndexLogitsCall, a: dict[str, Any], *, validate: bool, **options: Any) -> Any:
    """Validate (one host read of the offsets, lengths and table), find max_pools if not given, launch."""
    max_pools = call.max_pools
    if validate or max_pools is None:
        table = a["cache_block_table"]
        copies = [a["input_row_offsets"], a["cache_lengths"]] + ([table.reshape(-1)] if validate else [])
        host = backend.host_copies(copies)  # one transfer
        offsets, lengths = host[0], host[1]
        if validate:
            check_rows_and_cache(call.num_tokens, offsets, lengths)
        _, _, visible = token_visibility(offsets, lengths, call.num_tokens, call.kpool)  # as the kernel sees
        most = int(visible.max(initial=0))
        t = int(np.argmax(visible)) if visible.size else 0  # the token an error names (none with no tokens)
        if max_pools is None:
            if most > MAX_POOLS:
                wanted = f"lengths under which a token sees at most {MAX_POOLS} pools (pool ids are int32)"
                raise fail("cache_lengths", wanted, f"token {t} seeing {most}")
            max_pools = most
        elif validate and most > max_pools:
            got = max_pools if call.sized_by == "max_pools" else f"shape {tuple(a['out'].shape)}"
            raise fail(call.sized_by, f"at least the {most} pools token {t} sees", got)
        if validate:
            check_table_covers(call, host[2].reshape(table.shape), lengths, offsets)
    if a["out"] is None:
        a["out"] = backend.empty(*output_shapes(call, max_pools)["out"])
    if call.num_tokens and max_pools:
        backend.launch(index_logits_launch(call, a, max_pools, backend.tensor_core()))
    return a["out"]


EMULATE_DOC = """:func:`kpool_cupy.kpool_index_logits_fp8`, running the CUDA kernel on the CPU (host arrays).

The emulated ``mma.sync`` adds each step's 32 exact products in k order in
float32; a GPU's tensor cores add them in their own order and width."""
REFERENCE_DOC = """:func:`kpool_cupy.kpool_index_logits_fp8` in NumPy: exact e4m3 values, float64 sums, one rounding."""
DOCS = {"emulate": EMULATE_DOC, "reference": REFERENCE_DOC}  # the GPU's is the def's (functions.py)

MAX_POOLS_OPTION = Option("max_pools", "int | None", None, kind="size", check=check_max_pools)
# Written whole: a logit where a token sees the pool, -inf past its pools.
LOGITS_OUT = Operand("out", "[num_tokens, max_pools] float32", True, True, rows_of="", dtype="float32", filled="always")
PARAMETERS = (*SCORING_PARAMETERS, MAX_POOLS_OPTION, LOGITS_OUT, VALIDATE)


def most_pools(call: IndexLogitsCall) -> int | None:
    """The widest result a call can have without max_pools (every pool id fits int32); None with max_pools (or
    out): the width is the call's, not the data's."""
    return None if call.max_pools is not None else MAX_POOLS


def example(b: ExampleBatch) -> Example:
    """The scoring batch."""
    return b.scoring, {"kpool": SCORING_KPOOL}


SPEC = OpSpec(
    "kpool_index_logits_fp8",
    PARAMETERS,
    ("logits",),
    check_index_logits_fp8_args,
    run,
    DOCS,
    output_shapes,
    dynamic_sizes={"max_pools": most_pools},
    kernel=INDEX_LOGITS_FP8,
    large_launch=scoring_launch,
    large_dynamic_shared=lambda head_dim, mma: index_logits_shared_bytes(64, head_dim, 1, mma),
    check_head_dim=check_scorer_head_dim,
    example=example,
)
