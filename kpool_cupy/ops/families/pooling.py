"""Pooling a ragged batch's tokens: the call record, its checks, the pool row offsets, the kernel's values.

    pooled[p, c] = sum_m softmax_m(gate[member m, c] + ape[m, c]) * k[member m, c]

kpool_compress (and its FP8 form), kpool_ring_close and kpool_compress_backward
take these pieces; each adds its own outputs and destination."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...kernel import codes
from ...pool_offsets import pool_row_offsets as compute_pool_row_offsets
from ...pool_offsets import pool_rows
from ..framework.checks import (
    as_size,
    check_ape,
    check_batch_index,
    check_keys,
    check_rows_and_cache,
    fail,
)
from ..framework.operands import APE, CACHE_LENGTHS, INPUT_ROW_OFFSETS, TOKEN_GATE, TOKEN_K
from ..framework.spec import Backend, CallArgs, Operand, Option
from .destinations import Landing
from .fp8_target import check_rotation_head_dim


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
    given_pools: int | None = None  # kpool_compress's total_pools: the result's rows, stated by the caller


def check_pooling_inputs(a: CallArgs) -> tuple[int, int, int]:
    """head_dim, kpool and batch of a call that pools a ragged batch's tokens (k, gate, ape, offsets,
    lengths, the rotation option): compress and ring close."""
    head_dim = check_keys(a.k, a.gate)
    if a.rotate:
        check_rotation_head_dim("k", head_dim)
    return head_dim, check_ape(a.ape, head_dim), check_batch_index(a.input_row_offsets, a.cache_lengths)


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
    offsets, lengths = input_row_offsets.astype(np.int64, copy=False), cache_lengths.astype(np.int64, copy=False)
    pools = pool_rows(offsets, lengths, call.kpool)  # their values checked: pool_row_offsets' checks are done
    if pool_row_offsets is not None:
        given = pool_row_offsets.astype(np.int64, copy=False)
        if not (given == pools).all():  # the same length: check_index held it to batch + 1
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


def pooling_values(call: CompressCall, operands: dict[str, Any], covered: int) -> dict[str, Any]:
    """The pooling inputs compress, its FP8 form and its backward share: tokens, ape, offsets and counts, and
    ``covered`` (``pools_to_cover``, at least 1) as the pool count the kernel guesses each pool's request by."""
    o = operands
    values = codes.rows("k", o["k"]) | codes.rows("gate", o["gate"]) | codes.rows("ape", o["ape"])
    values |= {name: o[name] for name in ("input_row_offsets", "cache_lengths", "pool_row_offsets")}
    return values | {"batch": call.batch, "total_tokens": call.total_tokens, "guess_pools": max(covered, 1)}


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
        if call.given_pools is not None and call.given_pools < total_pools:  # stated, with out or without
            raise fail("total_pools", f"at least the {total_pools} pools the call builds", call.given_pools)
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


POOL_ROW_OFFSETS = Operand("pool_row_offsets", "[batch + 1] int32, uint32 or int64", optional=True)


# The forward's inputs, in its order: what its backward takes after the gradient.
POOLING_INPUTS = (TOKEN_K, TOKEN_GATE, APE, INPUT_ROW_OFFSETS, CACHE_LENGTHS, POOL_ROW_OFFSETS)


ACCUMULATE = Option("accumulate", "str", "float32")  # the reference's alone


def most_pools(call: CompressCall) -> int:
    """The most pools a call can build: every pool takes kpool of its tokens."""
    return call.total_tokens // call.kpool
