"""kpool_compress, described once: operands, checks, call flow and launch, plus its public docstrings.

    logits[m, c] = gate[member m, c] + ape[m, c]
    w[:, c]      = softmax over m of logits[:, c]     # per channel, not per member
    pooled[p, c] = sum_m w[m, c] * k[member m, c]

``SPEC`` is what kpool_cupy, kpool_cupy.emulate and kpool_cupy.reference bind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kernel import codes
from ..kernel.declarations import COMPRESS
from ..kernel.geometry import group_geometry
from ..pool_offsets import pool_row_offsets as compute_pool_row_offsets
from .checks import (
    as_size,
    check_ape,
    check_batch_index,
    check_index,
    check_keys,
    check_out,
    check_out_dtype,
    check_rows_and_cache,
    fail,
)
from .destinations import Destination, Landing, into_pooled_rows, launch_template, returned
from .fp8_target import check_rotation_head_dim
from .operands import APE, CACHE_LENGTHS, INPUT_ROW_OFFSETS, OUT_DTYPE, ROTATE, TOKEN_GATE, TOKEN_K
from .spec import VALIDATE, Backend, CallArgs, Gradient, Launch, Operand, OpSpec, Option, OutputShape


@dataclass(frozen=True)
class CompressCall:
    """What the checks learned about a kpool_compress call: everything but array contents and addresses."""

    head_dim: int
    kpool: int
    batch: int
    total_tokens: int
    k_dtype: np.dtype
    gate_dtype: np.dtype
    out_dtype: np.dtype
    rotate: bool = False


def check_pooling_inputs(a: CallArgs) -> tuple[int, int, int]:
    """head_dim, kpool and batch of a call that pools a ragged batch's tokens (k, gate, ape, offsets,
    lengths, the rotation option): compress and ring close."""
    head_dim = check_keys(a.k, a.gate)
    if a.rotate:
        check_rotation_head_dim("k", head_dim)
    return head_dim, check_ape(a.ape, head_dim), check_batch_index(a.input_row_offsets, a.cache_lengths)


def check_compress_args(a: CallArgs) -> CompressCall:
    """Check everything about a call that needs no array contents."""
    head_dim, kpool, batch = check_pooling_inputs(a)
    if a.pool_row_offsets is not None:
        check_index("pool_row_offsets", a.pool_row_offsets, batch + 1)
    check_out(a.out, head_dim, ">= total_pools")
    return CompressCall(
        **token_fields(a, head_dim, kpool, batch),
        out_dtype=check_out_dtype(a.out_dtype, a.out, np.dtype(a.k.dtype)),
        rotate=bool(a.rotate),
    )


def token_fields(a: CallArgs, head_dim: int, kpool: int, batch: int) -> dict[str, Any]:
    """The call record's fields of a call that pools a ragged batch's token rows ``a.k`` and ``a.gate``."""
    return {
        "head_dim": head_dim,
        "kpool": kpool,
        "batch": batch,
        "total_tokens": as_size(a.k.shape[0]),
        "k_dtype": np.dtype(a.k.dtype),
        "gate_dtype": np.dtype(a.gate.dtype),
    }


def check_offset_values(
    call: CompressCall,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    pool_row_offsets: np.ndarray | None,
) -> np.ndarray:
    """Check offset contents (host arrays) and return the pool row offsets as int64."""
    check_rows_and_cache(call.total_tokens, input_row_offsets, cache_lengths)
    pools = compute_pool_row_offsets(input_row_offsets.astype(np.int64), cache_lengths.astype(np.int64), call.kpool)
    if pool_row_offsets is not None:
        given = pool_row_offsets.astype(np.int64)
        if not np.array_equal(given, pools):
            b = int(np.argmax(given != pools))
            raise fail(
                "pool_row_offsets",
                f"the offsets computed from input_row_offsets and cache_lengths ({int(pools[b])} at index {b})",
                f"{int(given[b])}",
            )
    return pools


def pools_to_cover(total_pools: int | None, total_tokens: int, kpool: int, out_rows: int) -> int:
    """How many pools the grid covers.

    The exact count when the host knows it; otherwise the bound every request
    obeys (a request of n tokens completes at most n // kpool pools, so the
    batch at most total_tokens // kpool), capped by the rows of ``out``.
    """
    bound = min(total_tokens // kpool, out_rows)
    return bound if total_pools is None else min(total_pools, bound)


def output_shapes(call: CompressCall, total_pools: int) -> dict[str, OutputShape]:
    return {"out": ((total_pools, call.head_dim), call.out_dtype)}


def pooling_values(call: CompressCall, operands: dict[str, Any]) -> dict[str, Any]:
    """The pooling inputs compress and its FP8 form share: tokens, ape, offsets and counts."""
    o = operands
    values = codes.rows("k", o["k"]) | codes.rows("gate", o["gate"]) | codes.rows("ape", o["ape"])
    values |= {name: o[name] for name in ("input_row_offsets", "cache_lengths", "pool_row_offsets")}
    return values | {"batch": call.batch, "total_tokens": call.total_tokens}


def pooling_template(call: CompressCall, operands: dict[str, Any]) -> dict[str, Any]:
    """The template parameters compress and its FP8 form share: element types, sizes, index types."""
    o = operands
    template = {"KT": call.k_dtype, "GT": call.gate_dtype, "HEAD_DIM": call.head_dim, "KPOOL": call.kpool}
    indexes = {"IO": o["input_row_offsets"].dtype, "IC": o["cache_lengths"].dtype}
    vector = codes.vector_mask(k=o["k"], gate=o["gate"], ape=o["ape"])
    return template | indexes | {"IP": o["pool_row_offsets"].dtype, "VECTOR": vector}


def find_pools(
    backend: Backend,
    call: CompressCall,
    input_row_offsets: Any,
    cache_lengths: Any,
    pool_row_offsets: Any,
    out: Any,
    *,
    validate: bool,
    sized: bool,
) -> tuple[Any, int | None, tuple[np.ndarray, np.ndarray, np.ndarray] | None]:
    """The pool row offsets on the backend, the pool count where the host learns it, and with ``validate`` the
    checked host copies (offsets, lengths, pool offsets) for further checks.

    ``validate`` checks the offsets' contents and that ``out`` has a row for
    every pool. Without it the count stays on the device (no sync) unless
    ``sized`` (an output is to be allocated): then the claimed count is read,
    and bounded, since unvalidated offsets may claim any count but no batch
    completes more than total_tokens // kpool pools.
    """
    if validate:
        given = [input_row_offsets, cache_lengths] + ([pool_row_offsets] if pool_row_offsets is not None else [])
        host = backend.host_copies(given)
        pools_host = check_offset_values(call, host[0], host[1], host[2] if len(host) > 2 else None)
        total_pools = int(pools_host[-1])
        if out is not None and out.shape[0] < total_pools:
            raise fail("out", f"at least {total_pools} rows (total_pools)", f"{out.shape[0]} rows")
        pools = pool_row_offsets if pool_row_offsets is not None else backend.from_host(pools_host)
        return pools, total_pools, (host[0], host[1], pools_host)
    pools = (
        pool_row_offsets
        if pool_row_offsets is not None
        else compute_pool_row_offsets(input_row_offsets, cache_lengths, call.kpool)
    )
    if not sized:
        return pools, None, None
    claimed = int(backend.host_copies([pools[-1:]])[0][0])
    return pools, min(max(claimed, 0), most_pools(call)), None


def pool_owners(offsets: np.ndarray, lengths: np.ndarray, pools: np.ndarray, kpool: int) -> Landing:
    """Which pools a validated call writes (host int64 arrays): each one's output row, request and number q,
    in output row order (what a destination checks of where they land)."""
    counts = np.diff(pools)
    requests = np.repeat(np.arange(counts.shape[0]), counts)
    first = -(-lengths // kpool)  # the first pool a request completes here: its cached prefix rounded up
    numbers = first[requests] + np.arange(int(pools[-1])) - pools[requests]
    return np.arange(int(pools[-1])), requests, numbers


def pool_into(backend: Backend, call: CompressCall, a: dict[str, Any], *, validate: bool, to: Destination) -> Any:
    """Validate, find the pool row offsets, size the outputs, cover the pools, launch the family's kernel that
    writes to ``to``; what kpool_compress and kpool_compress_fp8 both run."""
    pools, total_pools, checked = find_pools(
        backend,
        call,
        a["input_row_offsets"],
        a["cache_lengths"],
        a["pool_row_offsets"],
        a["out"],
        validate=validate,
        sized=to.allocates(a),
    )
    if checked is not None:
        to.check_landing(backend, a, lambda: pool_owners(*checked, call.kpool))
    to.allocate(backend, a, (total_pools or 0, call.head_dim), zeroed=False)
    room = to.room(a)
    covered = pools_to_cover(total_pools, call.total_tokens, call.kpool, most_pools(call) if room is None else room)
    if covered > 0:
        a = a | {"pool_row_offsets": pools}
        values = pooling_values(call, a) | to.launch_values(a)
        template = launch_template(pooling_template(call, a), to, a)
        backend.launch(Launch(to.kernel, template, values, group_geometry(call.head_dim, covered), a))
    return returned(to, a)


EMULATE_DOC = """Pool each complete k-pool of a ragged batch by running the CUDA kernel on the CPU.

Same arguments and result as :func:`kpool_cupy.kpool_compress`, on host
arrays (bfloat16 as ``ml_dtypes.bfloat16``).

Raises
------
CompilerNotFoundError
    When no host C++ compiler is found.
"""

REFERENCE_DOC = """Pool each complete k-pool of a ragged batch into one key, in NumPy.

Same arguments and result as :func:`kpool_cupy.kpool_compress`, on host
arrays (bfloat16 as ``ml_dtypes.bfloat16``).

Parameters
----------
accumulate
    ``"float32"`` (the kernel's arithmetic) or ``"float64"``.
"""

POOL_ROW_OFFSETS = Operand("pool_row_offsets", "[batch + 1] int32, uint32 or int64", optional=True)
OUT = Operand("out", "[>= total_pools, head_dim] bfloat16, float16 or float32", True, True, rows_of="k")
# The forward's inputs, in its order: what its backward takes after the gradient.
POOLING_INPUTS = (TOKEN_K, TOKEN_GATE, APE, INPUT_ROW_OFFSETS, CACHE_LENGTHS, POOL_ROW_OFFSETS)
PARAMETERS = (*POOLING_INPUTS, OUT, VALIDATE, OUT_DTYPE, ROTATE)
DOCS = {"emulate": EMULATE_DOC, "reference": REFERENCE_DOC}  # the GPU's is the def's (functions.py)
ACCUMULATE = Option("accumulate", "str", "float32")  # the reference's alone


def most_pools(call: CompressCall) -> int:
    """The most pools a call can build: every pool takes kpool of its tokens."""
    return call.total_tokens // call.kpool


SPEC = OpSpec(
    "kpool_compress",
    PARAMETERS,
    ("pooled",),
    check_compress_args,
    into_pooled_rows(COMPRESS, pool_into),
    DOCS,
    output_shapes,
    extras={"reference": (ACCUMULATE,)},
    dynamic_sizes={"total_pools": most_pools},
    kernel=COMPRESS,
    # Named, not imported: compress_backward imports this module.
    gradient=Gradient("kpool_compress_backward", ("k", "gate", "ape"), ("grad_pooled",), refused=("rotate",)),
)
