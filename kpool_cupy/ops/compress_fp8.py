"""kpool_compress_fp8, described once: kpool_compress with the FP8 epilogue fused, into rows or a paged cache.

Per pool, after kpool_compress's pooling (float32, unrounded)::

    x = bf16(pooled);  y = bf16(B(x) * fl32(1/sqrt(D)));  s = ue8m0(max|y| / 448);  q = e4m3fn(y / s)

(backends/reference_epilogue.py spells out every rounding.) The values
equal that epilogue applied to kpool_compress's own float32 result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import FLOAT32
from ..kernel import codes
from ..kernel.geometry import group_geometry
from ..kernel.names import COMPRESS_SOURCE, compress_fp8_kernel_name
from .checks import check_no_overlap, fail
from .compress import (
    ACCUMULATE,
    POOL_ROW_OFFSETS,
    CompressCall,
    check_compress_args,
    find_pools,
    pools_to_cover,
)
from .fp8_target import (
    BLOCK_TABLE_IN,
    CACHE,
    ROUND_SCALE,
    ROWS,
    SCALES_OUT,
    SLOTS,
    TABLE,
    UINT8,
    VALUES_OUT,
    Fp8Target,
    check_destinations,
    check_rotation_head_dim,
    check_target,
    sink_arguments,
    value_rows_vector,
)
from .operands import APE, CACHE_LENGTHS, INPUT_ROW_OFFSETS, TOKEN_GATE, TOKEN_K
from .spec import VALIDATE, Backend, Launch, Operand, OpSpec, OutputShape


@dataclass(frozen=True)
class CompressFp8Call:
    """What the checks learned about a kpool_compress_fp8 call."""

    pooling: CompressCall
    target: Fp8Target
    round_scale: bool


def check_compress_fp8_args(
    k: Any,
    gate: Any,
    ape: Any,
    input_row_offsets: Any,
    cache_lengths: Any,
    pool_row_offsets: Any,
    cache: Any,
    slots: Any,
    block_table: Any,
    out: Any,
    out_scale: Any,
    round_scale: Any,
) -> CompressFp8Call:
    """Check everything about a call that needs no array contents."""
    pooling = check_compress_args(k, gate, ape, input_row_offsets, cache_lengths, pool_row_offsets, None)
    check_rotation_head_dim("k", pooling.head_dim)
    target = check_target(
        pooling.head_dim,
        out=out,
        out_scale=out_scale,
        cache=cache,
        slots=slots,
        block_table=block_table,
        batch=pooling.batch,
    )
    return CompressFp8Call(pooling, target, bool(round_scale))


def output_shapes(call: CompressFp8Call, total_pools: int) -> dict[str, OutputShape]:
    if call.target.to_cache:
        return {}
    return {"out": ((total_pools, call.pooling.head_dim), UINT8), "out_scale": ((total_pools,), FLOAT32)}


def _pool_owners(offsets: np.ndarray, lengths: np.ndarray, pools: np.ndarray, kpool: int):
    """Each pool's request and number q in it (host int64 arrays), in output row order."""
    counts = np.diff(pools)
    requests = np.repeat(np.arange(counts.shape[0]), counts)
    first = -(-lengths // kpool)  # the first pool a request completes here: its cached prefix rounded up
    numbers = first[requests] + np.arange(int(pools[-1])) - pools[requests]
    return requests, numbers


def check_pool_destinations(
    backend: Backend, call: CompressFp8Call, slots: Any, block_table: Any, owners: tuple[np.ndarray, np.ndarray]
) -> None:
    """With validate=True: every pool the call builds lands in the cache, each in a slot of its own."""
    target = call.target
    total = owners[0].shape[0]
    if target.kind == SLOTS:
        if slots.shape[0] < total:
            raise fail("slots", f"at least {total} entries (total_pools)", f"{slots.shape[0]} entries")
        host = backend.host_copies([slots[:total]])[0]
        check_destinations(target, host, None, np.arange(total), *owners)
    elif target.kind == TABLE:
        table = backend.host_copies([block_table.reshape(-1)])[0].reshape(block_table.shape)
        check_destinations(target, None, table, np.arange(total), *owners)


def compress_fp8_launch(call: CompressFp8Call, pools: int, operands: dict[str, Any]) -> Launch:
    """The launch of ``kpool_compress_fp8`` over ``pools`` pools, arguments in kernels/kpool_compress.cu's order."""
    o, pooling = operands, call.pooling
    arguments = (
        *codes.rows(o["k"]),
        *codes.rows(o["gate"]),
        *codes.rows(o["ape"]),
        o["input_row_offsets"],
        o["cache_lengths"],
        o["pool_row_offsets"],
        np.int64(pooling.batch),
        np.int64(pooling.total_tokens),
        *sink_arguments(call.target, o),
        np.int32(call.round_scale),
    )
    vector = codes.vector_mask(k=o["k"], gate=o["gate"], ape=o["ape"])
    if value_rows_vector(call.target, o):
        vector |= codes.VectorAccess.OUT
    indexes = codes.index_dtypes(o["input_row_offsets"], o["cache_lengths"], o["pool_row_offsets"])
    name = compress_fp8_kernel_name(
        pooling.k_dtype,
        pooling.gate_dtype,
        pooling.head_dim,
        pooling.kpool,
        vector,
        call.target.kind,
        (*indexes, call.target.destination_dtype),
    )
    geometry = group_geometry(pooling.head_dim, pools)
    return Launch("kpool_compress_fp8", COMPRESS_SOURCE, name, geometry, arguments, call, operands)


def _rows_bound(call: CompressFp8Call, slots: Any, out: Any) -> int:
    """The most pools the outputs have room for: out's rows, slots' entries, or any (a block table)."""
    if call.target.kind == ROWS:
        return int(out.shape[0])
    if call.target.kind == SLOTS:
        return int(slots.shape[0])
    return most_pools(call)


def run(backend: Backend, arrays: tuple[Any, ...], *, round_scale: Any, validate: bool) -> Any:
    """Validate (offsets, and where pools land), size the outputs, cover the pools, launch."""
    k, gate, ape, input_row_offsets, cache_lengths, pool_row_offsets, cache, slots, block_table, out, out_scale = arrays
    call = check_compress_fp8_args(*arrays, round_scale)
    pooling = call.pooling
    check_no_overlap(PARAMETERS, arrays)
    pools, total_pools, checked = find_pools(
        backend,
        pooling,
        input_row_offsets,
        cache_lengths,
        pool_row_offsets,
        out,
        validate=validate,
        sized=out is None and not call.target.to_cache,
    )
    if checked is not None:
        offsets, lengths, pools_host = checked
        owners = _pool_owners(offsets, lengths, pools_host, pooling.kpool)
        check_pool_destinations(backend, call, slots, block_table, owners)
    if out is None and not call.target.to_cache:
        shapes = output_shapes(call, total_pools or 0)
        out, out_scale = backend.empty(*shapes["out"]), backend.empty(*shapes["out_scale"])
    covered = pools_to_cover(total_pools, pooling.total_tokens, pooling.kpool, _rows_bound(call, slots, out))
    if covered > 0:
        operands = {"k": k, "gate": gate, "ape": ape, "input_row_offsets": input_row_offsets}
        operands |= {"cache_lengths": cache_lengths, "pool_row_offsets": pools}
        operands |= {"cache": cache, "slots": slots, "block_table": block_table, "out": out, "out_scale": out_scale}
        backend.launch(compress_fp8_launch(call, covered, operands))
    return None if call.target.to_cache else (out, out_scale)


GPU_DOC = """Pool each complete k-pool into an FP8 key: rotated, scaled, e4m3fn, into rows or a paged cache.

One fused kernel: the pooling of :func:`kpool_compress` (float32), then
per pool::

    x = bf16(pooled)
    y = bf16(B(x) * fl32(1/sqrt(D)))         B: Walsh-Hadamard butterflies (a+b, a-b), strides 1 .. D/2
    v = fl32(max(max_c |y_c|, 1e-4) * fl32(1/448))
    s = the smallest power of two >= v       (round_scale=True; s = v when False)
    q = e4m3fn(clamp(fl32(y / s), -448, 448))

Only q's bytes and s are written. head_dim must be a power of two from 8
to 256. The values are bit for bit the epilogue applied to
``kpool_compress``'s own float32 result.

Parameters
----------
k, gate, ape, input_row_offsets, cache_lengths, pool_row_offsets
    As :func:`kpool_compress`.
round_scale
    Round each scale up to a power of two (ue8m0), exactly (default).
cache
    uint8 ``[num_blocks, block_size, head_dim + 4]``: each page holds its
    ``block_size * head_dim`` value bytes (entry t at byte t * head_dim),
    then ``block_size`` float32 scales (entry t at byte
    ``block_size * head_dim + 4 * t``); pages at any stride (a multiple of
    4 bytes), 4-byte aligned. Flat slot s is page s // block_size, entry
    s % block_size. Nothing else in the cache changes.
slots
    With ``cache``: int64 or int32 ``[>= total_pools]``, output pool p's flat
    slot; -1 skips the pool.
block_table
    With ``cache``, instead of ``slots``: int32 ``[batch, max_blocks]``;
    request b's pool q (positions ``[q*kpool, (q+1)*kpool)``) goes to slot
    ``block_table[b, q // block_size] * block_size + q % block_size``.
out, out_scale
    Without ``cache``: uint8 ``[>= total_pools, head_dim]`` (e4m3fn bit
    patterns) and float32 ``[out rows]``, given together; new ones
    otherwise.
validate
    Check offsets and that every pool lands in the cache in a slot of its
    own (device-to-host copies). With ``validate=False`` garbage slots and
    block tables write nothing outside the cache.
stream
    As :func:`kpool_compress`.

Returns
-------
tuple of cupy.ndarray, or None
    ``(values, scales)`` without ``cache``; None when writing the cache.
"""

EMULATE_DOC = """:func:`kpool_cupy.kpool_compress_fp8`, running the CUDA kernel on the CPU (host arrays)."""

REFERENCE_DOC = """:func:`kpool_cupy.kpool_compress_fp8` in NumPy (host arrays).

Parameters
----------
accumulate
    ``"float32"`` (the kernel's arithmetic) or ``"float64"`` for the pooling.
"""

SLOTS_IN = Operand("slots", "[>= total_pools] int64 or int32: each pool's cache slot, -1 to skip", optional=True)
PARAMETERS = (
    TOKEN_K,
    TOKEN_GATE,
    APE,
    INPUT_ROW_OFFSETS,
    CACHE_LENGTHS,
    POOL_ROW_OFFSETS,
    ROUND_SCALE,
    CACHE,
    SLOTS_IN,
    BLOCK_TABLE_IN,
    VALUES_OUT,
    SCALES_OUT,
    VALIDATE,
)
DOCS = {"cupy": GPU_DOC, "emulate": EMULATE_DOC, "reference": REFERENCE_DOC}


def describe(arrays: tuple[Any, ...], options: Mapping[str, Any]) -> CompressFp8Call:
    return check_compress_fp8_args(*arrays, options["round_scale"])


def most_pools(call: CompressFp8Call) -> int:
    """The most pools a call can build: every pool takes kpool of its tokens."""
    return call.pooling.total_tokens // call.pooling.kpool


SPEC = OpSpec(
    "kpool_compress_fp8",
    PARAMETERS,
    ("values", "scales"),
    run,
    DOCS,
    output_shapes,
    describe,
    extras={"reference": (ACCUMULATE,)},
    dynamic_sizes={"total_pools": most_pools},
)
