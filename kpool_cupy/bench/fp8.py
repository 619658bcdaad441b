"""Benchmarks of the FP8 epilogue: the fused kpool_compress_fp8 into a paged cache against the unfused
sequence, and the query side's hadamard_quant_fp8 (GPU only, but for the host-side helpers).

The unfused sequence is made of this package's own ops and CuPy indexing::

    pooled = kpool_compress(k, gate, ape, ..., out_dtype=bfloat16)        # bf16 [pools, head_dim]
    values, scales = hadamard_quant_fp8(pooled)                            # the same rotation, scale and bytes
    page, entry = slots // block_size, slots % block_size                  # or through the block table
    cache_values[page, entry] = values;  cache_scales[page, entry] = scales

Its cache bytes equal the fused kernel's bit for bit: the fused epilogue
rounds each pooled row to bf16 first, as kpool_compress's bf16 output does.
Each record checks that on its first input set (``same_bytes_as_kpool_cupy``).
Not to be misread: both are credited with the fused kernel's bytes, so their
bandwidths compare as their times do; what the three passes really move is
``bytes_unfused``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import element_dtype
from ..kernel.pages import FP8_PAGES
from ..pool_offsets import pool_row_offsets
from .inputs import make_input_sets
from .lifecycle import composite_refusal, device_rotation
from .shapes import BenchShape, sweep
from .stats import ratios_to
from .timing import copy_roof, timed_entry

CACHE_BLOCK_SIZE = 64  # pooled keys a page of the FP8 cache holds (engines use 64)
QUERY_HEADS = 32  # query heads a decode token brings to the query side
QUERY_BATCHES = (1, 8, 64, 512, 4096)  # the decode side's batches and the compress sweep's larger decode batch
SLOTS, TABLE = "slots", "table"
# The compress sweep's decode and prefill shapes at head_dim 128, kpool 4, each with the way engines address
# its cache: a decode step writes each request's pool into that request's page, found through the block table;
# a prefill writes through a slot mapping made once per step from its block table.
FP8_SHAPES = (("decode-512x4", TABLE), ("decode-4096x4", TABLE), ("prefill-1x4096", SLOTS), ("prefill-4x16384", SLOTS))
QUICK_FP8_SHAPES = (("decode-4096x4", TABLE), ("prefill-1x4096", SLOTS))


def fp8_cases(quick: bool = False) -> list[tuple[BenchShape, str]]:
    """The compress sweep's shapes the FP8 records use, each with its cache target (``"slots"`` or ``"table"``)."""
    by_name = {shape.name: shape for shape in sweep()}
    return [(by_name[name], target) for name, target in (QUICK_FP8_SHAPES if quick else FP8_SHAPES)]


def query_batches(quick: bool = False) -> tuple[int, ...]:
    return (64, 512) if quick else QUERY_BATCHES


def fp8_row_bytes(head_dim: int) -> int:
    """One FP8 row in the cache: head_dim e4m3fn bytes and one float32 scale."""
    return FP8_PAGES.entry_bytes(head_dim)


def compress_fp8_bytes(shape: BenchShape) -> int:
    """The least the fused kernel moves: each member row of k and gate read once, each pool's FP8 row written once.

        bytes = pools * kpool * head_dim * 2 * itemsize + pools * (head_dim + 4)

    As the compress sweep counts (shapes.minimum_bytes): tokens that complete
    no pool, ape (kpool rows, cached after the first pool) and the offsets
    are not counted; nor are the slots or block-table entries (one 8- or
    4-byte entry a pool).
    """
    itemsize = element_dtype(shape.dtype).itemsize
    members = shape.pools * shape.kpool
    return members * shape.head_dim * 2 * itemsize + shape.pools * fp8_row_bytes(shape.head_dim)


def unfused_bytes(shape: BenchShape) -> int:
    """The least the unfused sequence moves: the members read, the bf16 pooled rows written and read back, the FP8
    rows written, read back and written into the cache.

        bytes = pools * kpool * head_dim * 2 * itemsize + 2 * pools * head_dim * 2 + 3 * pools * (head_dim + 4)

    The scatter's index arrays are not counted.
    """
    itemsize = element_dtype(shape.dtype).itemsize
    members = shape.pools * shape.kpool * shape.head_dim * 2 * itemsize
    return members + 2 * shape.pools * shape.head_dim * 2 + 3 * shape.pools * fp8_row_bytes(shape.head_dim)


def hadamard_quant_bytes(rows: int, head_dim: int, itemsize: int = 2) -> int:
    """The least the query side moves: each row of x read once, its FP8 row written once."""
    return rows * head_dim * itemsize + rows * fp8_row_bytes(head_dim)


def pool_owners(shape: BenchShape) -> tuple[np.ndarray, np.ndarray]:
    """Each pool's request and its number q in that request (positions ``[q*kpool, (q+1)*kpool)``), int64
    ``[pools]`` in output order (host)."""
    offsets = np.concatenate([[0], np.cumsum(shape.lengths)]).astype(np.int64)
    cached = np.asarray(shape.cache, dtype=np.int64)
    pools = pool_row_offsets(offsets, cached, shape.kpool)
    counts = np.diff(pools)
    request = np.repeat(np.arange(shape.requests, dtype=np.int64), counts)
    first = -(-cached // shape.kpool)  # the first pool a request completes: its cached prefix rounded up
    return request, first[request] + np.arange(int(pools[-1]), dtype=np.int64) - pools[request]


@dataclass
class Destinations:
    """Where every input set's pools land (host arrays): set i's pages are ``[i * pages, (i + 1) * pages)``.

    Each page some pool of the call reaches gets a page of the set, the set's
    pages shuffled; entries no pool reaches are -1 (the call reads none).
    """

    tables: np.ndarray  # int32 [count, requests, max_blocks]
    slots: np.ndarray  # int64 [count, pools]: the same places as flat slots, a slot mapping
    pages: int  # pages of one set
    request: np.ndarray  # int64 [pools]: each pool's request (the block table's row)
    number: np.ndarray  # int64 [pools]: each pool's number q in its request


def paged_destinations(shape: BenchShape, count: int, block_size: int, rng: np.random.Generator) -> Destinations:
    """Block tables and slot mappings for ``count`` input sets, each set's pages its own and shuffled.

    Request b's pool q lands on ``block_table[b, q // block_size] * block_size + q % block_size``, as the op
    places it; the slots say the same places.
    """
    request, number = pool_owners(shape)
    block = number // block_size
    max_blocks = int(block.max()) + 1 if block.size else 1
    reached = np.unique(request * max_blocks + block)  # each (request, block) some pool lands in, once
    pages = int(reached.size)
    tables = np.full((count, shape.requests * max_blocks), -1, np.int32)
    order = rng.random((count, pages)).argsort(axis=1)  # a permutation per set
    tables[:, reached] = order + (np.arange(count) * pages)[:, None]
    tables = tables.reshape(count, shape.requests, max_blocks)
    slots = tables[:, request, block].astype(np.int64) * block_size + number % block_size
    return Destinations(tables, np.ascontiguousarray(slots), pages, request, number)


def cache_views(xp: Any, cache: Any) -> tuple[Any, Any]:
    """Views of a C-contiguous paged cache uint8 ``[num_blocks, block_size, head_dim + 4]``: its values
    uint8 ``[num_blocks, block_size, head_dim]`` and its scales float32 ``[num_blocks, block_size]``.

    Each page holds ``block_size * head_dim`` value bytes (entry t at byte
    t * head_dim), then ``block_size`` float32 scales; both views write the
    cache's own memory (strided views, no copy).
    """
    pages, block_size, width = (int(n) for n in cache.shape)
    head_dim = width - 4
    if cache.dtype != np.uint8 or not cache.flags.c_contiguous or head_dim % 4:
        raise ValueError(
            f"Invalid cache: expected a C-contiguous uint8 [num_blocks, block_size, head_dim + 4] with head_dim a "
            f"multiple of 4, got {cache.dtype} {tuple(cache.shape)}"
        )
    as_strided = xp.lib.stride_tricks.as_strided
    page = block_size * width
    values = as_strided(cache, (pages, block_size, head_dim), (page, head_dim, 1))
    # The scales start at entry 0's scale offset in each page; a float32 view of the flat cache from there.
    flat = cache.reshape(-1)[FP8_PAGES.scale_offset(block_size, head_dim, 0) :].view(xp.float32)
    scales = as_strided(flat, (pages, block_size), (page, FP8_PAGES.scale_bytes))
    return values, scales


def slot_places(xp: Any, slots: Any, block_size: int) -> tuple[Any, Any]:
    """Each pool's page and entry from its flat slot (every slot >= 0: the benchmark skips no pool)."""
    return slots // block_size, slots % block_size


def table_places(xp: Any, table: Any, request: Any, number: Any, block_size: int) -> tuple[Any, Any]:
    """Each pool's page and entry through the block table: ``table[request, q // block_size]``, ``q % block_size``.

    Right where every pool's entry is a page of the cache (what
    ``validate=True`` demands of the op); a -1 entry would index the last page.
    """
    return table[request, number // block_size].astype(xp.int64), number % block_size


def scatter_fp8(views: tuple[Any, Any], page: Any, entry: Any, values: Any, scales: Any) -> None:
    """Write FP8 rows ``values`` uint8 ``[pools, head_dim]`` and ``scales`` float32 ``[pools]`` into the cache
    behind ``views`` (``cache_views``), pool p at ``(page[p], entry[p])``."""
    cache_values, cache_scales = views
    cache_values[page, entry] = values
    cache_scales[page, entry] = scales


def unfused_compress_fp8(module: Any, s: Any, pooled: Any, values: Any, scales: Any, scatter: Any) -> None:
    """The unfused sequence on one input set ``s`` (an InputSet's fields): kpool_compress into ``pooled`` (bf16),
    hadamard_quant_fp8 into ``values`` and ``scales``, then ``scatter(values, scales)`` into the cache.

    ``module`` is kpool_cupy (device arrays), kpool_cupy.emulate or kpool_cupy.reference (host arrays).
    """
    module.kpool_compress(
        s.k,
        s.gate,
        s.ape,
        s.input_row_offsets,
        s.cache_lengths,
        pool_row_offsets=s.pool_row_offsets,
        out=pooled,
        out_dtype="bfloat16",
        validate=False,
    )
    module.hadamard_quant_fp8(pooled, out=values, out_scale=scales, validate=False)
    scatter(values, scales)


def bench_compress_fp8(shape: BenchShape, target: str, samples: int) -> dict[str, Any]:
    """The fused op against the unfused sequence on the same input sets, writing a paged cache through ``target``.

    Every set has its own pages of one cache, its own slots or block table
    and its own intermediates (the unfused sequence's bf16 rows are the set's
    ``out``). The cache bytes of set 0 after each are compared first.
    """
    import cupy

    import kpool_cupy

    if target not in (SLOTS, TABLE):
        raise ValueError(f"Invalid target: expected {SLOTS!r} or {TABLE!r}, got {target!r}")
    if element_dtype(shape.dtype) != element_dtype("bfloat16"):
        raise ValueError(f"Invalid shape: expected bfloat16 (the unfused sequence pools to bf16), got {shape.dtype}")
    head_dim, size = shape.head_dim, CACHE_BLOCK_SIZE
    nbytes = compress_fp8_bytes(shape)
    layout = paged_destinations(shape, 1, size, np.random.default_rng(0))
    page_bytes = size * fp8_row_bytes(head_dim)
    index_bytes = 8 * shape.pools if target == SLOTS else layout.tables[0].nbytes
    allocated = (
        (2 * shape.tokens + shape.pools) * head_dim * 2  # k, gate and the bf16 pooled rows
        + shape.pools * fp8_row_bytes(head_dim)  # the unfused values and scales
        + layout.pages * page_bytes
        + index_bytes
        + 32 * (shape.requests + 1)
    )
    rotated = device_rotation(nbytes, allocated)
    count = rotated["sets"]
    sets = make_input_sets(shape, count)
    places = paged_destinations(shape, count, size, np.random.default_rng(1))
    pages = places.pages
    cache = cupy.zeros((count * pages, size, FP8_PAGES.entry_bytes(head_dim)), dtype=cupy.uint8)
    views = cache_views(cupy, cache)
    tables = cupy.asarray(places.tables)
    slots = cupy.asarray(places.slots)
    request, number = cupy.asarray(places.request), cupy.asarray(places.number)
    values = cupy.empty((count, shape.pools, head_dim), dtype=cupy.uint8)
    scales = cupy.empty((count, shape.pools), dtype=cupy.float32)
    destination = [{"slots": slots[i]} if target == SLOTS else {"block_table": tables[i]} for i in range(count)]

    def fused(i: int) -> Any:
        s = sets[i]
        kpool_cupy.kpool_compress_fp8(
            s.k,
            s.gate,
            s.ape,
            s.input_row_offsets,
            s.cache_lengths,
            pool_row_offsets=s.pool_row_offsets,
            cache=cache,
            **destination[i],
            validate=False,
        )
        return cache

    def places_of(i: int) -> tuple[Any, Any]:
        if target == SLOTS:
            return slot_places(cupy, slots[i], size)
        return table_places(cupy, tables[i], request, number, size)

    def unfused(i: int) -> Any:
        def scatter(rows: Any, row_scales: Any) -> None:
            scatter_fp8(views, *places_of(i), rows, row_scales)

        unfused_compress_fp8(kpool_cupy, sets[i], sets[i].out, values[i], scales[i], scatter)
        return cache

    same, differing = compare_first_set(cache[:pages], fused, unfused)
    copy = copy_roof(nbytes, count, samples)
    implementations = {
        "kpool-cupy": timed_entry(fused, count, samples, nbytes, copy["gbps"]),
        "unfused": timed_entry(unfused, count, samples, nbytes, copy["gbps"], composite_refusal(count)),
    }
    implementations["unfused"]["same_bytes_as_kpool_cupy"] = same
    implementations["unfused"]["differing_bytes_vs_kpool_cupy"] = differing
    ratios_to(implementations)
    return {
        "name": f"compress-fp8 {shape.name} {target}",
        "kind": shape.kind,
        "head_dim": head_dim,
        "kpool": shape.kpool,
        "dtype": shape.dtype,
        "requests": shape.requests,
        "tokens": shape.tokens,
        "pools": shape.pools,
        "target": target,
        "block_size": size,
        "cache_pages_per_set": pages,
        "bytes": nbytes,
        "bytes_unfused": unfused_bytes(shape),
        "input_sets": count,
        "rotation": rotated,
        "copy": copy,
        "implementations": implementations,
    }


FILL = 0xA5  # what the compared pages hold before each run: bytes neither writes stay so, in both


def compare_first_set(pages: Any, fused: Any, unfused: Any) -> tuple[bool, int]:
    """Run ``fused(0)`` and ``unfused(0)`` on ``pages`` (set 0's pages of the cache), each from the same filled
    pages; whether their bytes are the same, and how many differ."""
    import cupy

    pages.fill(FILL)
    fused(0)
    want = cupy.asnumpy(pages)
    pages.fill(FILL)
    unfused(0)
    got = cupy.asnumpy(pages)
    differing = int(np.count_nonzero(got != want))
    return differing == 0, differing


def bench_hadamard_quant(batch: int, samples: int, heads: int = QUERY_HEADS, head_dim: int = 128) -> dict[str, Any]:
    """The query side on a decode step's queries, x bf16 ``[batch * heads, head_dim]``, against the copy of its
    bytes. The input sets are views of one array per operand."""
    import cupy

    import kpool_cupy

    rows = batch * heads
    nbytes = hadamard_quant_bytes(rows, head_dim)
    rotated = device_rotation(nbytes, nbytes)
    count = rotated["sets"]
    rng = cupy.random.default_rng(3)
    x = rng.standard_normal((count, rows, head_dim), dtype=cupy.float32).astype(element_dtype("bfloat16"))
    values = cupy.empty((count, rows, head_dim), dtype=cupy.uint8)
    scales = cupy.empty((count, rows), dtype=cupy.float32)

    def ours(i: int) -> Any:
        return kpool_cupy.hadamard_quant_fp8(x[i], out=values[i], out_scale=scales[i], validate=False)

    copy = copy_roof(nbytes, count, samples)
    implementations = {"kpool-cupy": timed_entry(ours, count, samples, nbytes, copy["gbps"])}
    ratios_to(implementations)
    return {
        "name": f"hadamard-quant {batch}x{heads}",
        "rows": rows,
        "head_dim": head_dim,
        "dtype": "bfloat16",
        "bytes": nbytes,
        "input_sets": count,
        "rotation": rotated,
        "copy": copy,
        "implementations": implementations,
    }


def run_fp8(quick: bool, samples: int) -> Iterator[dict[str, Any]]:
    """The FP8 records, one at a time (the caller saves each)."""
    for shape, target in fp8_cases(quick):
        yield bench_compress_fp8(shape, target, samples)
    for batch in query_batches(quick):
        yield bench_hadamard_quant(batch, samples)
