"""Where an FP8 op writes: rows of e4m3fn bytes and scales, or a paged cache, checked and passed once.

Every FP8 writer (compress, ring close, tail update) and the query side
share these checks, so a bad cache, slot list or block table gets the same
error from each, and the kernels get the same argument block
(``kp::Fp8Sink`` in kernels/kpool_fp8.cuh)::

    values, values_stride, scales, target_rows, block_size,
    destinations, destination_rows, destination_columns, destination_stride

The cache's pages are ``kernel.pages.FP8_PAGES`` (the layout vLLM and
SGLang share); ``check_cache_layout`` takes any ``PageLayout``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...dtypes import FLOAT8_E4M3FN, FLOAT32, INT32, UINT8, dtype_name, given_dtype
from ...kernel import codes
from ...kernel.pages import FP8_PAGES, PageLayout
from ..framework.checks import (
    as_size,
    check_block_table,
    check_contiguous,
    check_writable,
    dtype_fail,
    fail,
    given_without,
    missing_with,
    require_array,
)
from ..framework.engine_forms import E4M3, PAGED_CACHE
from ..framework.spec import Operand, Option

INT64 = np.dtype(np.int64)
SLOT_DTYPES = (INT32, INT64)
# The rotation runs across one warp's lanes, 8 channels each (kp::group_lanes).
MIN_FP8_HEAD_DIM, MAX_FP8_HEAD_DIM = 8, 256

ROWS, SLOTS, TABLE = (int(d) for d in codes.Fp8Target)

ROUND_SCALE = Option("round_scale", "bool", True)
CACHE = Operand(
    "cache",
    "uint8 [num_blocks, block_size, head_dim + 4] (or DeepGEMM's [num_blocks, block_size, 1, head_dim + 4]): each "
    "page's value bytes, then its float32 scales",
    optional=True,
    written=True,
    replaces=("out", "out_scale"),
    form=PAGED_CACHE,
)
BLOCK_TABLE_IN = Operand("block_table", "[requests, max_blocks] int32: each request's cache pages", optional=True)
VALUES_OUT = Operand(
    "out",
    "uint8 [rows, head_dim]: e4m3fn bytes (or float8_e4m3fn)",
    True,
    True,
    rows_of="k",
    dtype="uint8",
    together="out_scale",
    form=E4M3,
)
SCALES_OUT = Operand("out_scale", "float32 [rows]", True, True, dtype="float32", together="out")


def values_dtype(value: Any) -> np.dtype:
    """The dtype e4m3fn values are returned as: uint8 (None, the default) or float8_e4m3fn (its ml_dtypes dtype
    or name; the same bytes typed as engines take them); a TypeError naming ``out_dtype`` for anything else."""
    if value is None:
        return UINT8
    try:
        resolved = FLOAT8_E4M3FN if isinstance(value, str) and value == "float8_e4m3fn" else np.dtype(value)
    except (TypeError, ValueError):  # not a dtype at all (an array, a tensor)
        resolved = None
    if resolved not in (UINT8, FLOAT8_E4M3FN):
        raise dtype_fail("out_dtype", "uint8 or float8_e4m3fn (e4m3fn bytes either way)", given_dtype(value))
    return resolved


VALUES_DTYPE = Option("out_dtype", "Any", None, kind="dtype", check=values_dtype)


def check_rotation_head_dim(name: str, head_dim: int) -> None:
    """A head_dim the Hadamard rotation takes: a power of two from 8 to 256."""
    if not MIN_FP8_HEAD_DIM <= head_dim <= MAX_FP8_HEAD_DIM or head_dim & (head_dim - 1):
        raise fail(
            name,
            f"head_dim a power of two from {MIN_FP8_HEAD_DIM} to {MAX_FP8_HEAD_DIM} (the Hadamard rotation)",
            head_dim,
        )


@dataclass(frozen=True)
class Fp8Placement:
    """What the checks learned about where an FP8 call writes."""

    kind: int  # ROWS, SLOTS or TABLE
    rows: int  # rows of out (ROWS), pages of the cache otherwise
    block_size: int  # entries per page; 1 for ROWS
    destination_dtype: np.dtype  # slots' or block_table's dtype (int32 for ROWS: no array is read)

    @property
    def to_cache(self) -> bool:
        return self.kind != ROWS


def check_cache_layout(
    cache: Any, head_dim: int, writable: bool = True, layout: PageLayout = FP8_PAGES
) -> tuple[int, int]:
    """The cache's pages and entries per page; ``writable`` for the ops that write it (the scorer reads it).
    ``cache`` is this package's 3-D form or DeepGEMM's 4-D one (``engine_forms.PAGED_CACHE``), checked as
    the caller passed it, so a refusal shows the caller's shape and strides."""
    require_array("cache", cache)
    if np.dtype(cache.dtype) != UINT8:
        raise dtype_fail("cache", "dtype uint8", dtype_name(np.dtype(cache.dtype)))
    entry = layout.entry_bytes(head_dim)
    deep_gemm = cache.ndim == 4 and cache.shape[2] == 1  # the unit axis's stride is any: it is never stepped
    if not (cache.ndim == 3 or deep_gemm) or cache.shape[-1] != entry or cache.shape[1] < 1:
        rule = f"shape [num_blocks, block_size >= 1, {entry}] (head_dim + {entry - head_dim}) or [..., 1, {entry}]"
        raise fail("cache", rule, tuple(cache.shape))
    page = cache.shape[1] * entry
    if cache.size and (cache.strides[-1] != 1 or (cache.shape[1] > 1 and cache.strides[1] != entry)):
        rule = f"strides [page, {entry}, any, 1]" if deep_gemm else f"strides [page, {entry}, 1]"
        raise fail("cache", f"contiguous pages ({rule})", f"byte strides {cache.strides}")
    if cache.shape[0] > 1 and (cache.strides[0] < page or cache.strides[0] % 4):
        raise fail("cache", f"a page stride that is a multiple of 4 and at least {page} bytes", cache.strides[0])
    if cache.size and codes.data_pointer(cache) % 4:
        raise fail("cache", "a 4-byte aligned first byte (the scales are float32)", "an unaligned one")
    if writable:
        check_writable("cache", cache)
    return as_size(cache.shape[0]), as_size(cache.shape[1])


def _check_vector(name: str, array: Any, dtypes: tuple[np.dtype, ...], length: int | None, rule: str) -> None:
    """A contiguous 1-D array of one of ``dtypes``, of ``length`` entries (any when None; ``rule`` says which)."""
    require_array(name, array)
    if np.dtype(array.dtype) not in dtypes:
        allowed = " or ".join(dtype_name(d) for d in dtypes)
        raise dtype_fail(name, f"dtype {allowed}", dtype_name(np.dtype(array.dtype)))
    if array.ndim != 1 or (length is not None and array.shape[0] != length):
        raise fail(name, f"shape [{rule}]", f"shape {tuple(array.shape)}")
    check_contiguous(name, array)


def _check_rows_out(out: Any, out_scale: Any, head_dim: int, leading: tuple[int, ...] | None) -> int:
    """``out`` uint8 ``[rows, head_dim]`` (rows at any stride; ``leading`` None) or C-contiguous
    ``[*leading, head_dim]``, ``out_scale`` float32 of out's leading shape, C-contiguous; returns the rows."""
    require_array("out", out)
    if np.dtype(out.dtype) != UINT8:
        raise dtype_fail("out", "dtype uint8 (e4m3fn bytes) or float8_e4m3fn", dtype_name(np.dtype(out.dtype)))
    rule = f"[rows, {head_dim}]" if leading is None else f"[{', '.join(map(str, (*leading, head_dim)))}]"
    rank = 2 if leading is None else len(leading) + 1
    if out.ndim != rank or out.shape[-1] != head_dim or (leading is not None and tuple(out.shape[:-1]) != leading):
        raise fail("out", f"shape {rule}", f"shape {tuple(out.shape)}")
    if leading is None:
        if out.size and out.shape[1] > 1 and out.strides[1] != 1:
            raise fail("out", "a contiguous last dim", f"byte strides {out.strides}")
        if out.shape[0] > 1 and abs(out.strides[0]) < head_dim:
            raise fail("out", f"rows that do not overlap (|row stride| >= {head_dim} bytes)", out.strides[0])
    else:
        check_contiguous("out", out)
    check_writable("out", out)
    require_array("out_scale", out_scale)
    if np.dtype(out_scale.dtype) != FLOAT32:
        raise dtype_fail("out_scale", "dtype float32", dtype_name(np.dtype(out_scale.dtype)))
    if tuple(out_scale.shape) != tuple(out.shape[:-1]):
        raise fail("out_scale", f"shape {list(out.shape[:-1])} (out's rows)", f"shape {tuple(out_scale.shape)}")
    check_contiguous("out_scale", out_scale)
    check_writable("out_scale", out_scale)
    # A product of sizes, not int(): under torch.compile a symbolic batch stays symbolic (one graph for every size).
    return math.prod(as_size(n) for n in out.shape[:-1])


def check_target(
    head_dim: int,
    *,
    out: Any,
    out_scale: Any,
    cache: Any = None,
    slots: Any = None,
    block_table: Any = None,
    batch: int = 0,
    leading: tuple[int, ...] | None = None,
    slot_rows: int | None = None,
    takes_slots: bool = True,
) -> Fp8Placement:
    """Rows (``out``/``out_scale``, or new ones) or a cache through ``slots`` or ``block_table``, exactly one way.

    ``leading``: out's exact shape but the last dim (C-contiguous), or None
    for ``[rows, head_dim]`` at any row stride, rows checked by the op.
    ``slot_rows``: the entries ``slots`` must have (None: any, checked with
    the values). ``block_table`` has one row per request (``batch``).
    ``takes_slots``: whether the op offers ``slots`` at all.
    """
    if cache is None:
        for name, given in (("slots", slots), ("block_table", block_table)):
            if given is not None:
                raise given_without(name, "cache")
        if (out is None) != (out_scale is None):
            given, missing = ("out", "out_scale") if out is not None else ("out_scale", "out")
            raise fail(missing, f"an array with {given} (the two are written together)", "None")
        if out is None:
            return Fp8Placement(ROWS, 0, 1, INT32)
        return Fp8Placement(ROWS, _check_rows_out(out, out_scale, head_dim, leading), 1, INT32)
    for name, given in (("out", out), ("out_scale", out_scale)):
        if given is not None:
            raise fail(name, "None with cache (the cache holds the values and scales)", "an array")
    pages, block_size = check_cache_layout(cache, head_dim)
    if takes_slots and (slots is None) == (block_table is None):
        given = "both" if slots is not None else "neither"
        raise fail("slots", "exactly one of slots and block_table with cache", given)
    if not takes_slots and block_table is None:
        raise missing_with("block_table", "cache")
    if slots is not None:
        rule = ">= total_pools" if slot_rows is None else str(slot_rows)
        _check_vector("slots", slots, SLOT_DTYPES, slot_rows, rule)
        return Fp8Placement(SLOTS, pages, block_size, np.dtype(slots.dtype))
    check_block_table(block_table, batch)
    return Fp8Placement(TABLE, pages, block_size, INT32)


def check_destinations(
    target: Fp8Placement,
    slots: np.ndarray | None,
    block_table: np.ndarray | None,
    rows: np.ndarray,
    requests: np.ndarray,
    pools: np.ndarray,
) -> None:
    """With validate=True (host arrays): every pool a call writes lands in the cache, each in a slot of its
    own; with ``slots``, -1 skips a pool.

    ``rows`` are the written pools' indices into ``slots`` (output rows, or
    requests for ring close), ``requests`` and ``pools`` their requests and
    pool numbers q, which the block table places.
    """
    capacity = target.rows * target.block_size
    if target.kind == SLOTS:
        assert slots is not None
        found = slots[rows].astype(np.int64)
        bad = (found != -1) & ((found < 0) | (found >= capacity))
        if bad.any():
            i = int(np.argmax(bad))
            wanted = f"-1 or a slot in [0, {capacity}) (num_blocks * block_size) for every pool"
            raise fail("slots", wanted, f"{int(found[i])} at index {int(rows[i])}")
        name = "slots"
    else:
        assert block_table is not None
        size = target.block_size
        block = pools // size
        past = block >= block_table.shape[1]
        if past.any():
            i = int(np.argmax(past))
            wanted = f"a column for every pool's block (pool q in column q // {size})"
            got = f"{block_table.shape[1]} columns for pool {int(pools[i])} of request {int(requests[i])}"
            raise fail("block_table", wanted, got)
        entry = block_table[requests, block].astype(np.int64)
        bad = (entry < 0) | (entry >= target.rows)
        if bad.any():
            i = int(np.argmax(bad))
            wanted = f"pages in [0, {target.rows}) (num_blocks) for every pool written"
            raise fail("block_table", wanted, f"{int(entry[i])} for pool {int(pools[i])} of request {int(requests[i])}")
        found = entry * size + pools % size
        name = "block_table"
    kept = found[found >= 0]
    unique, counts = np.unique(kept, return_counts=True)
    if (counts > 1).any():
        raise fail(name, "a slot of its own for every pool written", f"slot {int(unique[np.argmax(counts > 1)])} twice")


def sink_values(target: Fp8Placement, operands: dict[str, Any]) -> dict[str, Any]:
    """``kp::Fp8Sink``'s parameters by name (``kernel.declarations.FP8_SINK``)."""
    if target.kind == ROWS:
        out, scales = operands["out"], operands["out_scale"]
        rows = int(np.prod(out.shape[:-1]))  # [rows, D], or C-contiguous [R, J, D] as R * J rows
        # No index array is read: any pointer stands in (the scales').
        placed = {"destinations": scales, "destination_rows": 0, "destination_columns": 0, "destination_stride": 0}
        return {"values": out, "values_stride": out.strides[-2], "scales": scales, "target_rows": rows} | {
            "block_size": 1,
            **placed,
        }
    cache = operands["cache"]
    head = {"values": cache, "values_stride": cache.strides[0], "scales": cache, "target_rows": target.rows}
    head["block_size"] = target.block_size
    if target.kind == SLOTS:
        slots = operands["slots"]
        placed = {"destinations": slots, "destination_rows": slots.shape[0], "destination_columns": 1}
        return head | placed | {"destination_stride": 1}
    table = operands["block_table"]
    placed = {"destinations": table, "destination_rows": table.shape[0], "destination_columns": table.shape[1]}
    return head | placed | {"destination_stride": codes.stride(table)}


def sink_template(target: Fp8Placement, operands: dict[str, Any]) -> dict[str, Any]:
    """``kp::Fp8Sink``'s template parameters: where rows go, and the dtype of slots or the block table."""
    return {"TARGET": target.kind, "ID": target.destination_dtype}


def sink_vector(target: Fp8Placement, operands: dict[str, Any]) -> int:
    """The VECTOR bit of the values (``VectorAccess.OUT``) where every row of values the kernel writes starts
    8-byte aligned (one 8-byte store per thread): out's rows, or the cache's pages."""
    if target.kind == ROWS:
        aligned = codes.allows_8byte_rows(operands["out"])
    else:
        cache = operands["cache"]  # entries' values lie head_dim bytes apart in a page: the pages decide
        aligned = codes.data_pointer(cache) % 8 == 0 and (cache.shape[0] <= 1 or cache.strides[0] % 8 == 0)
    return int(codes.VectorAccess.OUT) if aligned else 0
