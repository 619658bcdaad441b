"""kpool_index_topk, described once: each token's best pools by their index logits, expanded to positions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import FLOAT32
from ..kernel import codes
from ..kernel.declarations import INDEX_TOPK
from ..kernel.geometry import LARGE_BATCH, select_geometry
from ..pool_offsets import check_kpool
from .families import expansion
from .families.scoring import MAX_POOLS, check_rows_of
from .families.selection import MAX_TOKENS, POOL_TOPK, check_covered, check_pool_topk, select_cap
from .framework.checks import as_size, check_batch_index, check_rows_and_cache, fail
from .framework.examples import Example, ExampleBatch
from .framework.operands import CACHE_LENGTHS, INPUT_ROW_OFFSETS, KPOOL
from .framework.spec import VALIDATE, Backend, CallArgs, Launch, Operand, OpSpec, OutputShape


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
    return IndexTopkCall(**expanded, num_tokens=num_tokens, logits_width=logits_width, batch=batch)


def output_shapes(call: IndexTopkCall) -> dict[str, OutputShape]:
    return expansion.output_shapes(call, call.num_tokens)


def index_topk_launch(call: IndexTopkCall, operands: dict[str, Any]) -> Launch:
    """The launch of ``kpool_index_topk``."""
    o = operands
    logits = o["logits"]
    values, template = expansion.launch_values(call, o)
    values |= {"logits": logits, "logits_stride": logits.strides[0] // 4, "logits_width": call.logits_width}
    values |= {name: o[name] for name in ("input_row_offsets", "cache_lengths")}
    values |= {"batch": call.batch, "num_tokens": call.num_tokens, "kpool": call.kpool, "pool_topk": call.pool_topk}
    vector = int(codes.data_pointer(logits) % 16 == 0 and logits.strides[0] % 16 == 0)
    template |= {"CAP": select_cap(call.pool_topk), "VECTOR": vector, "IO": o["input_row_offsets"].dtype}
    template |= {"IC": o["cache_lengths"].dtype}
    return Launch(INDEX_TOPK, template, values, select_geometry(call.num_tokens), o)


def run(backend: Backend, call: IndexTopkCall, a: dict[str, Any], *, validate: bool, **options: Any) -> Any:
    """Validate (one host read of the offsets and lengths), allocate the outputs, launch."""
    if validate:
        offsets, lengths = backend.host_copies([a["input_row_offsets"], a["cache_lengths"]])
        check_rows_and_cache(call.num_tokens, offsets, lengths)
        check_covered(call, offsets.astype(np.int64), lengths.astype(np.int64), call.tail)

    def launch(positions: Any, counts: Any) -> None:
        operands = {name: a[name] for name in ("logits", "input_row_offsets", "cache_lengths", "block_table")}
        backend.launch(index_topk_launch(call, operands | {"positions": positions, "counts": counts}))

    return expansion.expand_into(backend, call, call.num_tokens, launch)


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
    outputs=output_shapes,
    **expansion.RETURNS,
    kernel=INDEX_TOPK,
    large_launch=lambda head_dim: select_geometry(LARGE_BATCH),
    example=example,
)
