"""Random garbage offsets for validate=False: whatever lands in out, nothing may be touched outside the arrays.

Shared by the AddressSanitizer test (emulator) and scripts/gpu_check.sh
(compute-sanitizer on the GPU path), through tests/run_garbage.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import ml_dtypes
import numpy as np

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_INDEX_TYPES = (np.int32, np.uint32, np.int64)


def _values(rng: np.random.Generator, count: int, dtype: type, tokens: int) -> np.ndarray:
    """Plausible, huge, negative and boundary values, mixed, representable in ``dtype``."""
    info = np.iinfo(dtype)
    pools = [
        rng.integers(0, tokens + 2, count),  # near-valid
        rng.integers(info.min, info.max, count, dtype=np.int64, endpoint=True)
        if dtype != np.uint32
        else rng.integers(0, 2**32, count, dtype=np.int64),
        np.full(count, info.max),
        np.full(count, info.min),
        info.max - rng.integers(0, 8, count),
        rng.integers(-8, 8, count).clip(info.min, None),
    ]
    choice = rng.integers(0, len(pools), count)
    values = np.choose(choice, [np.asarray(p, dtype=np.int64) for p in pools])
    return values.astype(dtype)


def garbage_cases(seed: int, count: int) -> Iterator[dict]:
    rng = np.random.default_rng(seed)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    for _ in range(count):
        # Few variants (each is a compile, instrumented ones are slow); the
        # garbage is in the offsets, not in the sizes.
        kpool = int(rng.choice([1, 3, 4]))
        head_dim = 16
        tokens = int(rng.integers(0, 48))
        batch = int(rng.integers(0, 6))
        dtype = rng.choice([bf16, np.dtype(np.float32)])
        offsets_type, cache_type, pools_type = (_INDEX_TYPES[i] for i in rng.integers(0, 3, 3))
        offsets = _values(rng, batch + 1, offsets_type, tokens)
        if rng.random() < 0.3:  # sorted but overshooting: the subtle kind
            offsets = np.sort(offsets)
        case = {
            "k": rng.standard_normal((tokens, head_dim)).astype(dtype),
            "gate": rng.standard_normal((tokens, head_dim)).astype(dtype),
            "ape": rng.standard_normal((kpool, head_dim)).astype(np.float32),
            "input_row_offsets": offsets,
            "cache_lengths": _values(rng, batch, cache_type, 2**32),
            "pool_row_offsets": None,
            "out": None,
        }
        if rng.random() < 0.6:  # claims of any size, e.g. more pools than tokens exist
            case["pool_row_offsets"] = _values(rng, batch + 1, pools_type, 10**6)
        if rng.random() < 0.7:
            case["out"] = np.zeros((int(rng.integers(0, 64)), head_dim), dtype=dtype)
        yield case


def ring_garbage_cases(seed: int, count: int) -> Iterator[tuple[str, dict]]:
    """Garbage offsets, lengths, slots, positions and pool ids for the four lifecycle functions.

    kpool 3, head_dim 16, bfloat16 or float32 (each variant is a compile); the
    garbage is in the indices, with optional out/closed, empty decode steps and
    token rows that are strided views of a larger buffer. ``count`` cases take
    the four functions in turn; then ``count // 2`` expand calls with a block
    table or compacting or both (:func:`expand_garbage_cases`), from a stream
    of their own, so the first ``count`` cases are the same with or without
    them; then ``count // 4`` calls on split rings
    (:func:`split_ring_garbage_cases`), from another.
    """
    rng = np.random.default_rng(seed)
    kpool, head_dim = 3, 16
    ape = rng.standard_normal((kpool, head_dim)).astype(np.float32)

    def rows(shape: tuple[int, ...], dtype) -> np.ndarray:
        if rng.random() < 0.3:  # every other row of a larger buffer
            wide = rng.standard_normal((shape[0] * 2, *shape[1:])).astype(dtype)
            return wide[::2]
        return rng.standard_normal(shape).astype(dtype)

    for i in range(count):
        dtype = (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32))[int(rng.integers(0, 2))]
        tokens, batch, max_slots = int(rng.integers(0, 30)), int(rng.integers(0, 5)), int(rng.integers(0, 4))
        tail = rng.standard_normal((max_slots, 2, kpool, head_dim)).astype(dtype)
        k = rows((tokens, head_dim), dtype)
        offsets = _values(rng, batch + 1, _INDEX_TYPES[int(rng.integers(0, 3))], tokens)
        cache = _values(rng, batch, _INDEX_TYPES[int(rng.integers(0, 3))], 2**32)
        slots = _values(rng, batch, (np.int32, np.uint32)[int(rng.integers(0, 2))], max_slots)
        given = rng.random() < 0.5  # pass out= and closed= or let the call allocate them
        function = ("ring_close", "seed_tail", "tail_update", "expand_topk")[i % 4]
        if function == "ring_close":
            case = {"tail": tail, "k": k, "gate": k.copy(), "ape": ape, "input_row_offsets": offsets,
                    "cache_lengths": cache, "slot_idx": slots}  # fmt: skip
            if given:
                case |= {"out": np.zeros((batch + 2, head_dim), dtype), "closed": np.zeros(batch + 2, np.int32)}
            yield function, case
        elif function == "seed_tail":
            yield function, {"tail": tail, "k": k, "gate": k.copy(), "input_row_offsets": offsets,
                             "cache_lengths": cache, "slot_idx": slots}  # fmt: skip
        elif function == "tail_update":
            next_n = int(rng.integers(0, 5))
            step = rows((batch, next_n, head_dim), dtype)
            positions = _values(rng, batch * next_n, np.int32, 40).reshape(batch, next_n)
            case = {"tail": tail, "k": step, "gate": step.copy(), "ape": ape, "positions": positions,
                    "slot_idx": slots}  # fmt: skip
            if given:
                pools = -(-next_n // kpool)
                case |= {"out": np.zeros((batch, pools, head_dim), dtype), "closed": np.zeros((batch, pools), np.int32)}
            yield function, case
        else:
            pool_ids = _values(rng, tokens * 5, (np.int32, np.int64)[int(rng.integers(0, 2))], 50).reshape(tokens, 5)
            yield function, {"pool_ids": pool_ids, "input_row_offsets": offsets, "cache_lengths": cache,
                             "kpool": kpool, "always_select_tail": bool(rng.integers(0, 2))}  # fmt: skip
    for case in expand_garbage_cases(seed, count // 2):
        yield "expand_topk", case
    yield from split_ring_garbage_cases(seed, count // 4)


def split_ring_garbage_cases(seed: int, count: int) -> Iterator[tuple[str, dict]]:
    """Ring close, seed tail and tail update on split rings ``(key_ring, gate_ring)`` with garbage indices.

    bfloat16 keys beside float32 gate scores or the other way round, rings of
    kpool to kpool + 4 rows, each array contiguous or a view into a buffer
    padded on every dim (its own strides). The index dtypes are fixed (int32
    offsets, int64 lengths, int32 slots and positions): the ring cases above
    try them all, and each variant here is a compile.
    """
    rng = np.random.default_rng([seed, 2])  # a stream of its own: the cases above stay as they were
    kpool, head_dim = 3, 16
    ape = rng.standard_normal((kpool, head_dim)).astype(np.float32)
    bf16, f32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)

    def ring(max_slots: int, rows: int, dtype: np.dtype) -> np.ndarray:
        if rng.random() < 0.5:
            return rng.standard_normal((max_slots, rows, head_dim)).astype(dtype)
        pad = int(rng.integers(1, 4))
        wide = rng.standard_normal((max_slots + 1, rows + pad, head_dim + 8 * pad)).astype(dtype)
        return wide[1:, pad:, :head_dim]

    for i in range(count):
        key_dtype, gate_dtype = ((bf16, f32), (f32, bf16))[int(rng.integers(0, 2))]
        tokens, batch, max_slots = int(rng.integers(0, 30)), int(rng.integers(0, 5)), int(rng.integers(0, 4))
        rows = kpool + int(rng.integers(0, 5))
        tail = (ring(max_slots, rows, key_dtype), ring(max_slots, rows, gate_dtype))
        offsets = _values(rng, batch + 1, np.int32, tokens)
        cache = _values(rng, batch, np.int64, 2**32)
        slots = _values(rng, batch, np.int32, max_slots)
        function = ("ring_close", "seed_tail", "tail_update")[i % 3]
        if function == "tail_update":
            next_n = int(rng.integers(0, 5))
            step_k = rng.standard_normal((batch, next_n, head_dim)).astype(key_dtype)
            step_gate = rng.standard_normal((batch, next_n, head_dim)).astype(gate_dtype)
            positions = _values(rng, batch * next_n, np.int32, 40).reshape(batch, next_n)
            yield function, {"tail": tail, "k": step_k, "gate": step_gate, "ape": ape, "positions": positions,
                             "slot_idx": slots}  # fmt: skip
            continue
        k = rng.standard_normal((tokens, head_dim)).astype(key_dtype)
        gate = rng.standard_normal((tokens, head_dim)).astype(gate_dtype)
        case = {"tail": tail, "k": k, "gate": gate, "input_row_offsets": offsets, "cache_lengths": cache,
                "slot_idx": slots}  # fmt: skip
        if function == "ring_close":
            case["ape"] = ape
        else:
            case["kpool"] = kpool
        yield function, case


# (pool_ids, input_row_offsets, cache_lengths) for the block table and compact
# modes: each index type once in each place. Three variants a mode rather than
# all 27 (each is a compile); the ring cases above try every offsets type
# against every cache type, and the table lookup does not depend on them.
_EXPAND_TYPES = ((np.int32, np.uint32, np.int64), (np.uint32, np.int64, np.int32), (np.int64, np.int32, np.uint32))
MAX_BLOCK_SIZE = 1 << 20  # ops/families/expansion.py's: a larger one is a ValueError, validated or not


def _block_size(rng: np.random.Generator) -> int:
    """Any size the API takes with validate=False: 1, 2, kpool, up to 16, random, the largest two."""
    sizes = (1, 2, 3, int(rng.integers(1, 17)), int(rng.integers(1, MAX_BLOCK_SIZE + 1)), MAX_BLOCK_SIZE - 1)
    return (*sizes, MAX_BLOCK_SIZE)[int(rng.integers(0, len(sizes) + 1))]


def _block_table(rng: np.random.Generator, batch: int, block_size: int) -> np.ndarray:
    """int32 ``[batch, max_blocks]``: 0 columns, fewer than the positions need, or plenty; entries of any value.

    Near-valid pool ids reach position 3 * 52 = 156 and cache lengths near 64
    reach about 100, so ``156 // block_size + 1`` columns cover what a sane
    call selects. Entries: plausible pages, negative, INT32_MIN/MAX, random
    int32, and the edge of the slot check, ``(INT32_MAX - (block_size - 1)) //
    block_size`` and one more, whose slot is past int32. (No entry times a
    block size overflows int64: |entry| <= 2^31 and block_size <= 2^20.)
    """
    needed = 156 // block_size + 1
    max_blocks = (0, 1, int(rng.integers(1, needed + 1)), needed, needed + int(rng.integers(1, 4)))[
        int(rng.integers(0, 5))
    ]
    max_blocks = min(max_blocks, 64)  # a small block size needs 157 columns; fewer keep the past-the-table case
    entries = _values(rng, batch * max_blocks, np.int32, 1000)
    edge = (2**31 - 1 - (block_size - 1)) // block_size
    at_edge = rng.random(entries.size) < 0.2
    entries[at_edge] = (edge + rng.integers(0, 2, entries.size).astype(np.int64))[at_edge].clip(None, 2**31 - 1)
    return entries.reshape(batch, max_blocks)


def expand_garbage_cases(seed: int, count: int) -> Iterator[dict]:
    """Garbage block tables and block sizes for expand top-k, on top of garbage ids, offsets and lengths.

    Cases take three modes in turn: a block table, a block table and compact,
    compact alone (the ring cases above cover neither). kpool 3 as there;
    always_select_tail at random. Whatever lands in the outputs is fine;
    nothing outside the arrays may be touched, and no garbage value may make
    the call raise.
    """
    rng = np.random.default_rng([seed, 11])
    kpool = 3
    for i in range(count):
        paged, compact = ((True, False), (True, True), (False, True))[i % 3]
        ids_type, offsets_type, cache_type = _EXPAND_TYPES[int(rng.integers(0, len(_EXPAND_TYPES)))]
        tokens, batch, pool_topk = int(rng.integers(0, 30)), int(rng.integers(0, 5)), int(rng.integers(0, 6))
        offsets = _values(rng, batch + 1, offsets_type, tokens)
        cache = _values(rng, batch, cache_type, 64)  # near-valid lengths put tail positions in the table
        if rng.random() < 0.3:  # sorted but overshooting
            offsets = np.sort(offsets)
        elif rng.random() < 0.5:  # requests that hold their tokens, so the garbage table is read
            offsets = np.sort(rng.integers(0, tokens + 1, batch + 1))
            offsets[0], offsets[-1] = 0, tokens
            offsets, cache = offsets.astype(offsets_type), rng.integers(0, 64, batch).astype(cache_type)
        case = {
            "pool_ids": _values(rng, tokens * pool_topk, ids_type, 50).reshape(tokens, pool_topk),
            "input_row_offsets": offsets,
            "cache_lengths": cache,
            "kpool": kpool,
            "always_select_tail": bool(rng.integers(0, 2)),
            "compact": compact,
        }
        if paged:
            block_size = _block_size(rng)
            case |= {"block_table": _block_table(rng, batch, block_size), "block_size": block_size}
        yield case


# kpool_compress_fp8 and hadamard_quant_fp8: head_dim from 8 (one lane, no
# shuffle) to 256 (a whole warp), kpool 1 to 4. Each shape fixes the key
# dtype, the offsets' and cache lengths' types and the slots' type, so the
# compiles stay a few per shape (target, aligned values or not); the
# families above try every index type against every other, on the same
# pool lookup. The query's dtype is fixed per shape too.
_FP8_SHAPES = ((8, 3), (16, 1), (64, 4), (128, 3), (256, 2))
_FP8_KINDS = ("slots", "table", "rows", "slots", "table", "hadamard")
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def fp8_garbage_cases(seed: int, count: int) -> Iterator[tuple[str, dict]]:
    """``count`` garbage calls of ``kpool_compress_fp8`` and ``hadamard_quant_fp8``, as (function, keywords).

    Compress calls take slots, a block table or rows in turn (see
    ``_FP8_KINDS``), over the offsets garbage of :func:`garbage_cases` or
    requests that hold their tokens (so the slots and the table are read):

    - slots, int32 or int64, fewer or more than the pools: -1, other
      negatives (INT_MIN, -2^62), past the cache (its capacity, 2^62,
      INT_MAX), and distinct slots inside it;
    - block tables [batch, 0 to enough columns] of entries negative, past the
      cache (INT32_MAX among them) or distinct pages, contiguous, at a padded
      row stride (the padding holds pages a misread would write) or with its
      rows reversed (a negative row stride);
    - caches of 0 to 12 pages of 1 to 16 entries (one page of one entry
      often), contiguous or pages further apart than their bytes;
    - out/out_scale of fewer rows than the pools claimed, padded or reversed
      rows, or none (then the call sizes them).

    Every array the call writes starts as random bytes. Keys are kpool times
    small integers and the gate scores and ape the same row for every member,
    so every weight is exactly 1 and the pooled key is exact on both
    backends (the emulator's ``sum * fl32(1/kpool)`` rounds to the exact
    quotient for kpool 1 to 4): the FP8 bytes then agree bit for bit, and
    tests/test_garbage_agreement.py compares whole buffers. hadamard_quant_fp8
    takes no index: its garbage is in the strides (padded, reversed, x at row
    stride 0) and in the values (infinities, NaN, zero rows).
    """
    rng = np.random.default_rng([seed, 12])  # a stream of its own: the families above stay as they were
    bf16, f16, f32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
    for i in range(count):
        kind = _FP8_KINDS[i % len(_FP8_KINDS)]
        shape = int(rng.integers(0, len(_FP8_SHAPES)))
        head_dim, kpool = _FP8_SHAPES[shape]
        if kind == "hadamard":
            yield "hadamard_quant_fp8", _hadamard_garbage(rng, head_dim, (bf16, f16, f32)[shape % 3])
            continue
        key_dtype, slots_dtype = (bf16, np.int64) if shape % 2 == 0 else (f32, np.int32)
        offsets_type, cache_type, _ = _EXPAND_TYPES[shape % len(_EXPAND_TYPES)]
        case = _compress_fp8_garbage(rng, kind, head_dim, kpool, key_dtype, (offsets_type, cache_type, slots_dtype))
        yield "kpool_compress_fp8", case


def _random_bytes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(0, 256, shape, dtype=np.uint8)


def _fp8_rows(rng: np.random.Generator, rows: int, head_dim: int) -> np.ndarray:
    """uint8 ``[rows, head_dim]``: contiguous, inside wider rows (any byte offset), or with its rows reversed."""
    layout = int(rng.integers(0, 3))
    if layout == 1:
        pad = int(rng.integers(1, 12))
        start = int(rng.integers(0, pad + 1))
        return _random_bytes(rng, (rows, head_dim + pad))[:, start : start + head_dim]
    values = _random_bytes(rng, (rows, head_dim))
    return values[::-1] if layout == 2 else values


def _fp8_cache(rng: np.random.Generator, head_dim: int) -> np.ndarray:
    """uint8 ``[pages, block_size, head_dim + 4]`` of random bytes, contiguous or at a padded page stride.

    A padded cache is a view into a flat buffer (its ``base``) that may end
    where the last page ends, so a write past it is ASan's to see and a write
    into the padding the agreement test's.
    """
    if rng.random() < 0.15:  # the smallest cache: one page of one entry
        pages, block_size = 1, 1
    else:
        pages = (0, 1, 2, int(rng.integers(1, 9)), int(rng.integers(4, 13)))[
            (0, 1, 2, 3, 3, 4, 4)[int(rng.integers(0, 7))]
        ]
        block_size = (1, 2, 3, int(rng.integers(1, 17)))[int(rng.integers(0, 4))]
    width = head_dim + 4
    page = block_size * width
    if pages == 0 or rng.random() < 0.5:
        return _random_bytes(rng, (pages, block_size, width))
    stride = page + 4 * int(rng.integers(1, 4))  # 4-byte aligned scales; pages 8-byte aligned or not
    offset = 4 * int(rng.integers(0, 3))
    tail = (0, 0, 4, 8)[int(rng.integers(0, 4))]
    backing = _random_bytes(rng, (offset + (pages - 1) * stride + page + tail,))
    return np.ndarray((pages, block_size, width), np.uint8, buffer=backing, offset=offset, strides=(stride, width, 1))


def _mixed(rng: np.random.Generator, plausible: np.ndarray, garbage: list[np.ndarray]) -> np.ndarray:
    """``plausible`` with a share of its entries (none, some, most or all, per call) from the ``garbage`` pools."""
    count = plausible.shape[0]
    share = (0.0, 0.3, 0.7, 1.0)[int(rng.integers(0, 4))]
    picked = np.choose(rng.integers(0, len(garbage), count), [np.asarray(g, np.int64) for g in garbage])
    return np.where(rng.random(count) < share, picked, plausible.astype(np.int64)) if count else plausible


def _fp8_slots(rng: np.random.Generator, count: int, capacity: int, dtype: type) -> np.ndarray:
    """Slots of ``dtype``: distinct slots inside the cache, -1, other negatives (INT_MIN, -2^62), past the cache
    (its capacity, 2^62, INT_MAX)."""
    info = np.iinfo(dtype)
    huge = 2**62 if dtype == np.int64 else info.max
    plausible = rng.permutation(max(capacity, count))[:count]  # distinct; past the cache once it is full
    if rng.random() < 0.1:  # near-valid and maybe shared: two pools on one slot (a race, for the sanitizer only)
        plausible = rng.integers(0, capacity + 2, count)
    garbage = [
        np.full(count, -1),
        rng.choice([-2, info.min, -huge, info.min + 1], count),
        rng.integers(info.min, 0, count),
        rng.choice([capacity, capacity + 1, huge, info.max, huge + 1 if dtype == np.int64 else info.max - 1], count),
        rng.integers(capacity, info.max, count, endpoint=True),
    ]
    return _mixed(rng, plausible, garbage).astype(dtype)


def _fp8_block_table(rng: np.random.Generator, reach: np.ndarray, pages: int, block_size: int) -> np.ndarray:
    """int32 ``[batch, 0 .. needed + 3]``: distinct pages, negative entries, past the cache (INT32_MAX, the
    largest entry whose slots fit int32 and one more); contiguous, at a padded row stride (the padding holds
    pages, so reading it would show) or with its rows reversed (a negative row stride).

    ``reach`` (bool ``[batch, needed]``): the columns each request's pools use, where the offsets say so
    (none for garbage offsets); the cache's pages go there first.
    """
    batch, needed = reach.shape
    columns = (0, 1, int(rng.integers(1, needed + 1)), needed, needed + int(rng.integers(1, 4)))[
        int(rng.integers(0, 5))
    ]
    count = batch * columns
    wanted = np.zeros((batch, columns), bool)
    wanted[:, : min(columns, needed)] = reach[:, :columns]
    # Distinct values, the smallest (the cache's pages) on the columns the pools use, then anywhere.
    order = np.concatenate([rng.permutation(np.flatnonzero(wanted)), rng.permutation(np.flatnonzero(~wanted))])
    plausible = np.empty(count, np.int64)
    plausible[order] = np.sort(rng.permutation(max(pages, count))[:count])
    if rng.random() < 0.1:  # near-valid and maybe shared (a race, for the sanitizer only)
        plausible = rng.integers(0, pages + 2, count)
    edge = (INT32_MAX - (block_size - 1)) // block_size
    garbage = [
        rng.choice([-1, -2, INT32_MIN, INT32_MIN + 1], count),
        rng.integers(INT32_MIN, 0, count),
        rng.choice([pages, pages + 1, INT32_MAX, edge, edge + 1], count).clip(None, INT32_MAX),
        rng.integers(pages, INT32_MAX, count, endpoint=True),
    ]
    entries = _mixed(rng, plausible, garbage).astype(np.int32).reshape(batch, columns)
    layout = int(rng.integers(0, 3))
    if layout == 1:
        wide = rng.integers(0, max(pages, 1), (batch, columns + int(rng.integers(1, 4)))).astype(np.int32)
        wide[:, :columns] = entries
        return wide[:, :columns]
    return entries[::-1].copy()[::-1] if layout == 2 else entries


def _compress_fp8_garbage(
    rng: np.random.Generator, kind: str, head_dim: int, kpool: int, dtype: np.dtype, types: tuple[type, ...]
) -> dict:
    """One compress call into ``kind`` (rows, slots or table); ``types``: the offsets', cache lengths' and slots'
    (pool_row_offsets, when given, are int64: the type computed ones have)."""
    tokens, batch = int(rng.integers(0, 48)), int(rng.integers(0, 6))
    offsets_type, cache_type, slots_type = types
    pool_row_offsets = None
    sane = rng.random() >= 0.4
    if not sane:  # the garbage of garbage_cases
        offsets = _values(rng, batch + 1, offsets_type, tokens)
        if rng.random() < 0.3:
            offsets = np.sort(offsets)
        cache_lengths = _values(rng, batch, cache_type, 2**32)
        if rng.random() < 0.6:
            pool_row_offsets = _values(rng, batch + 1, np.int64, 10**6)
    else:  # requests that hold their tokens, and short cached prefixes: the slots and the table are read
        offsets = np.sort(rng.integers(0, tokens + 1, batch + 1))
        offsets[0], offsets[-1] = 0, tokens
        cache_lengths = rng.integers(0, (3 * kpool, 48)[int(rng.integers(0, 2))], batch)
        if rng.random() < 0.5:
            first, end = -(-cache_lengths // kpool), (cache_lengths + np.diff(offsets)) // kpool
            pool_row_offsets = np.concatenate([[0], np.cumsum(end - first)])
        offsets, cache_lengths = offsets.astype(offsets_type), cache_lengths.astype(cache_type)
    # Keys kpool * small integers, one gate row and one ape row for every member: exact pools (the docstring).
    k = (kpool * rng.integers(-8, 9, (tokens, head_dim))).astype(dtype)
    gate = np.tile(rng.standard_normal(head_dim).astype(dtype), (tokens, 1))
    ape = np.tile(rng.standard_normal(head_dim).astype(np.float32), (kpool, 1))
    case = {"k": k, "gate": gate, "ape": ape, "input_row_offsets": offsets, "cache_lengths": cache_lengths,
            "pool_row_offsets": pool_row_offsets, "round_scale": bool(rng.integers(0, 2))}  # fmt: skip
    most = tokens // kpool  # the most pools the call may build
    if kind == "rows":
        if rng.random() < 0.8:
            rows = int(rng.integers(0, most + 3))  # often fewer than the pools claimed
            case |= {"out": _fp8_rows(rng, rows, head_dim), "out_scale": rng.standard_normal(rows).astype(np.float32)}
        return case
    cache = _fp8_cache(rng, head_dim)
    pages, block_size = cache.shape[:2]
    if kind == "slots":
        # None, fewer than the pools or as many and a few more (the slots bound the grid).
        count = (0, int(rng.integers(0, most + 4)), most + int(rng.integers(0, 4)))[
            (0, 1, 1, 2, 2, 2)[int(rng.integers(0, 6))]
        ]
        return case | {"cache": cache, "slots": _fp8_slots(rng, count, pages * block_size, slots_type)}
    # The columns a request that holds its tokens may reach (cached prefixes and tokens under 48 each).
    reach = np.zeros((batch, (48 + 48) // kpool // block_size + 1), bool)
    for b in range(batch if sane else 0):
        n = int(offsets[b + 1]) - int(offsets[b])
        first, end = -(-int(cache_lengths[b]) // kpool), (int(cache_lengths[b]) + n) // kpool
        reach[b, first // block_size : -(-end // block_size)] = first < end
    return case | {"cache": cache, "block_table": _fp8_block_table(rng, reach, pages, block_size)}


def _hadamard_garbage(rng: np.random.Generator, head_dim: int, dtype: np.dtype) -> dict:
    """0 to 39 rows of x, some zero or with an infinity or NaN; x and out contiguous, in wider rows or reversed
    (x also at row stride 0); out/out_scale given or not."""
    rows = int(rng.integers(0, 40))
    x = rng.standard_normal((rows, head_dim)).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-10, 10, (rows, 1)).astype(np.float32)  # inside float16's range
    special = rng.random(rows)
    x[special < 0.1] = 0.0
    picked = (special >= 0.1) & (special < 0.2)
    x[picked, int(rng.integers(0, head_dim))] = rng.choice([np.inf, -np.inf, np.nan])
    x = x.astype(dtype)
    layout = int(rng.integers(0, 4))
    if layout == 1:  # inside wider rows
        pad = int(rng.integers(1, 9))
        wide = np.zeros((rows, head_dim + pad), dtype)
        start = int(rng.integers(0, pad + 1))
        wide[:, start : start + head_dim] = x
        x = wide[:, start : start + head_dim]
    elif layout == 2:
        x = x[::-1].copy()[::-1]
    elif layout == 3 and rows:  # one row read for all: row stride 0
        x = np.broadcast_to(x[0], x.shape)
    case = {"x": x, "round_scale": bool(rng.integers(0, 2))}
    if rng.random() < 0.7:
        case |= {"out": _fp8_rows(rng, rows, head_dim), "out_scale": rng.standard_normal(rows).astype(np.float32)}
    return case


_FP8_RING_SHAPES = ((16, 3), (64, 4), (128, 2))  # (head_dim, kpool): kpool 1 to 4 keeps the pools exact


def fp8_ring_garbage_cases(seed: int, count: int) -> Iterator[tuple[str, dict]]:
    """``count`` garbage calls of ``kpool_ring_close_fp8`` and ``kpool_tail_update_fp8`` in turn, as (function,
    keywords).

    The ring's and the call's garbage of :func:`ring_garbage_cases` (offsets,
    cached lengths, ring slots, positions), or requests that hold their
    tokens at small positions (so pools close and the slots and the table
    are read), written into rows (out/out_scale/closed given or not), or a
    cache through slots (ring close) or a block table, with the slot and
    table garbage of :func:`fp8_garbage_cases`. Rings are one array or a
    split pair (bf16 keys beside float32 gate scores), kpool to kpool + 2
    rows. As there, keys (ring and tokens) are kpool times small integers
    and every gate row, in the ring or not, and every ape row are the same
    row, so the pools are exact on both backends and their bytes agree.
    """
    rng = np.random.default_rng([seed, 13])  # a stream of its own
    bf16, f32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)
    for i in range(count):
        function = ("kpool_ring_close_fp8", "kpool_tail_update_fp8")[i % 2]
        head_dim, kpool = _FP8_RING_SHAPES[int(rng.integers(0, len(_FP8_RING_SHAPES)))]
        split = rng.random() < 0.4
        key_dtype = bf16 if split or rng.random() < 0.5 else f32
        gate_dtype = f32 if split else key_dtype
        batch, max_slots, rows = int(rng.integers(0, 5)), int(rng.integers(0, 4)), kpool + int(rng.integers(0, 3))
        gate_row = rng.standard_normal(head_dim)

        def keys(shape: tuple[int, ...], kpool: int = kpool, dtype: np.dtype = key_dtype) -> np.ndarray:
            return (kpool * rng.integers(-8, 9, shape)).astype(dtype)

        def gates(shape: tuple[int, ...], row: np.ndarray = gate_row, dtype: np.dtype = gate_dtype) -> np.ndarray:
            return np.tile(row.astype(dtype), (*shape[:-1], 1))

        sane = rng.random() < 0.5
        if sane:  # a ring slot for every request: pools close, and the cache is written
            max_slots = batch + int(rng.integers(0, 2))
        ring_shape = (max_slots, rows, head_dim)
        if split:
            tail = (keys(ring_shape), gates(ring_shape))
        else:
            tail = np.stack([keys(ring_shape), gates(ring_shape)], axis=1)
        ape = np.tile(rng.standard_normal(head_dim).astype(np.float32), (kpool, 1))
        slot_idx = _values(rng, batch, np.int32, max_slots)
        if sane:
            slot_idx = rng.permutation(max_slots)[:batch].astype(np.int32)
        case = {"tail": tail, "ape": ape, "slot_idx": slot_idx, "round_scale": bool(rng.integers(0, 2))}
        if function == "kpool_ring_close_fp8":
            tokens = int(rng.integers(0, 30))
            if sane:
                offsets = np.sort(rng.integers(0, tokens + 1, batch + 1))
                offsets[0], offsets[-1] = 0, tokens
                offsets, cached = offsets.astype(np.int32), rng.integers(0, 24, batch).astype(np.int64)
            else:
                offsets, cached = _values(rng, batch + 1, np.int32, tokens), _values(rng, batch, np.int64, 2**32)
            case |= {"k": keys((tokens, head_dim)), "gate": gates((tokens, head_dim)), "input_row_offsets": offsets,
                     "cache_lengths": cached}  # fmt: skip
            out_rows, kinds = batch + int(rng.integers(0, 3)), ("rows", "slots", "table")
        else:
            next_n = int(rng.integers(0, 5))
            if sane:
                start = rng.integers(0, 24, (batch, 1))
                positions = (start + np.arange(next_n)).astype(np.int32)
                positions[rng.random(positions.shape) < 0.2] = -1
            else:
                positions = _values(rng, batch * next_n, np.int32, 40).reshape(batch, next_n)
            case |= {"k": keys((batch, next_n, head_dim)), "gate": gates((batch, next_n, head_dim)),
                     "positions": positions}  # fmt: skip
            out_rows, kinds = None, ("rows", "table")
        kind = kinds[int(rng.integers(0, len(kinds)))]
        pools = -(-int(case["k"].shape[1]) // kpool) if out_rows is None else 0
        if kind == "rows":
            if rng.random() < 0.7:
                if out_rows is None:  # tail update: C-contiguous [R, J, head_dim]
                    case |= {"out": _random_bytes(rng, (batch, pools, head_dim)),
                             "out_scale": rng.standard_normal((batch, pools)).astype(np.float32)}  # fmt: skip
                else:
                    case |= {"out": _fp8_rows(rng, out_rows, head_dim),
                             "out_scale": rng.standard_normal(out_rows).astype(np.float32)}  # fmt: skip
            yield function, case
            continue
        cache = _fp8_cache(rng, head_dim)
        pages, block_size = cache.shape[:2]
        case["cache"] = cache
        if kind == "slots":
            case["slots"] = _fp8_slots(rng, batch, pages * block_size, (np.int32, np.int64)[int(rng.integers(0, 2))])
        else:
            reach = np.ones((batch, 32 // block_size + 1), bool)  # pool ids under 32 at these positions
            case["block_table"] = _fp8_block_table(rng, reach, pages, block_size)
        yield function, case


def index_garbage_cases(seed: int, count: int) -> Iterator[tuple[str, dict]]:
    """``count`` garbage calls of ``kpool_index_logits_fp8``, as (function, keywords): offsets and cache lengths
    of any value, block tables past the cache, negative or at INT32 edges, caches of random bytes (NaN and inf
    scales too) at padded page strides, query rows at odd byte offsets (the narrow path), and a max_pools that
    cuts visible pools off or runs far past them. max_pools is always given: without it the call would size its
    result from the garbage."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        head_dim = (64, 128, 256)[int(rng.integers(0, 3))]
        heads = (1, 3, 17)[int(rng.integers(0, 3))]
        tokens = int(rng.integers(0, 20))
        batch = int(rng.integers(0, 5))
        kpool = int(rng.choice([1, 2, 4, 7]))
        offsets = _values(rng, batch + 1, _INDEX_TYPES[int(rng.integers(0, 3))], tokens)
        if rng.random() < 0.3:
            offsets = np.sort(offsets)
        cache = _fp8_cache(rng, head_dim)
        block_size = cache.shape[1]
        max_blocks = int(rng.integers(0, 6))
        table = _values(rng, batch * max_blocks, np.int32, max(cache.shape[0], 1) + 2).reshape(batch, max_blocks)
        if rng.random() < 0.5:  # rows at a padded stride: a column slice of a wider table
            table = np.concatenate([table, np.zeros((batch, 2), np.int32)], axis=1)[:, :max_blocks]
        shift = int(rng.integers(0, 2))  # 1: q one byte into its buffer, no 16-byte loads
        raw = _random_bytes(rng, (tokens * heads * head_dim + shift,))
        q = raw[shift:].reshape(tokens, heads, head_dim)
        max_pools = (0, 1, int(rng.integers(1, 40)), int(rng.integers(100, 300)))[int(rng.integers(0, 4))]
        case = {
            "q": q,
            "weights": rng.standard_normal((tokens, heads)).astype(np.float32),
            "cache": cache,
            "cache_block_table": table,
            "input_row_offsets": offsets,
            "cache_lengths": _values(rng, batch, _INDEX_TYPES[int(rng.integers(0, 3))], 64 * block_size),
            "kpool": kpool,
            "max_pools": max_pools,
        }
        if rng.random() < 0.3:
            case["out"] = np.zeros((tokens, max_pools), np.float32)
        yield "kpool_index_logits_fp8", case


_SELECT_SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)


def topk_garbage_cases(seed: int, count: int) -> Iterator[tuple[str, dict]]:
    """``count`` garbage calls of ``kpool_index_topk``, as (function, keywords): offsets and cache lengths of any
    value, logits of any width (narrower or wider than what tokens see, rows at an odd float offset: the
    4-byte path) holding ties, NaN of both signs and infinities, pool_topk below and above the candidates, and
    the expand modes in turn (tail, compact, garbage block tables at any block size); every third call rows of
    9,000 to 20,000 logits under contexts as long (split over blocks), every fifth a workspace of random
    bytes."""
    rng = np.random.default_rng([seed, 23])
    wide = np.random.default_rng([seed, 24])
    for i in range(count):
        tokens, batch = int(rng.integers(0, 12)), int(rng.integers(0, 5))
        kpool = int(rng.choice([1, 2, 3, 7]))
        offsets = _values(rng, batch + 1, _INDEX_TYPES[int(rng.integers(0, 3))], tokens)
        if rng.random() < 0.3:
            offsets = np.sort(offsets)
        cache = _values(rng, batch, _INDEX_TYPES[int(rng.integers(0, 3))], 3000)
        if rng.random() < 0.5:  # requests that hold their tokens, so rows are selected from and expanded
            offsets = np.sort(rng.integers(0, tokens + 1, batch + 1))
            offsets[0], offsets[-1] = 0, tokens
            offsets = offsets.astype(_INDEX_TYPES[int(rng.integers(0, 3))])
            cache = rng.integers(0, 3000, batch).astype(_INDEX_TYPES[int(rng.integers(0, 3))])
        width = (0, 1, int(rng.integers(2, 60)), int(rng.integers(1000, 3000)))[int(rng.integers(0, 4))]
        shift = int(rng.integers(0, 2))
        raw = np.round(rng.standard_normal(tokens * width + shift) * 3).astype(np.float32)
        odd = rng.random(raw.shape) < 0.1
        raw[odd] = rng.choice(_SELECT_SPECIAL, int(odd.sum()))
        case = {
            "logits": raw[shift:].reshape(tokens, width),
            "input_row_offsets": offsets,
            "cache_lengths": cache,
            "kpool": kpool,
            "pool_topk": int(rng.choice([1, 3, 40, 600])),
            "always_select_tail": bool(i % 2),
            "compact": bool(i // 2 % 2),
        }
        if i // 4 % 2:
            block_size = _block_size(rng)
            case |= {"block_table": _block_table(rng, batch, block_size), "block_size": block_size}
        # From a stream of their own, so the cases above (and the variants they launch) stay as they were.
        if i % 3 == 2:  # wide rows seen by long contexts: a few tokens' rows split over blocks, the last merges
            # Rows as aligned as before (a zero-width row's stride is 4 bytes: one past a multiple of 4).
            width = 9000 + 4 * int(wide.integers(0, 2750)) + (width % 4 if width else 1)
            raw = np.round(wide.standard_normal(tokens * width + shift) * 3).astype(np.float32)
            case["logits"] = raw[shift:].reshape(tokens, width)
            case["cache_lengths"] = wide.integers(0, 2 * width, batch).astype(case["cache_lengths"].dtype)
        if i % 5 == 4:  # a workspace full of random bytes: wrong rows then, but nothing outside the arrays
            case["workspace"] = wide.integers(0, 256, 4096 * 64 + int(wide.integers(0, 64)), dtype=np.uint8)
        yield "kpool_index_topk", case


def select_garbage_cases(seed: int, count: int) -> Iterator[tuple[str, dict]]:
    """``count`` garbage calls of ``kpool_index_select_fp8``: the scorer's garbage (``index_garbage_cases``:
    offsets, lengths, tables, caches, odd query rows) with pool_topk below and above the candidates, the expand
    modes in turn over garbage token tables, and a workspace that is None, exact or, every fifth call, full of
    random bytes (wrong rows then, but nothing outside the arrays)."""
    rng = np.random.default_rng([seed, 29])
    for i, (_, scoring) in enumerate(index_garbage_cases(seed + 1000, count)):
        case = {name: value for name, value in scoring.items() if name not in ("max_pools", "out")}
        batch, tokens = case["cache_lengths"].shape[0], case["q"].shape[0]
        if rng.random() < 0.5:  # requests that hold their tokens: pools are scored and selected
            offsets = np.sort(rng.integers(0, tokens + 1, batch + 1))
            offsets[0], offsets[-1] = 0, tokens
            case["input_row_offsets"] = offsets.astype(case["input_row_offsets"].dtype)
            lengths = rng.integers(0, 64 * case["cache"].shape[1], batch)
            case["cache_lengths"] = lengths.astype(case["cache_lengths"].dtype)
        case |= {"pool_topk": int(rng.choice([1, 3, 40])), "always_select_tail": bool(i % 2)}
        case["compact"] = bool(i // 2 % 2)
        if i // 4 % 2:
            block_size = _block_size(rng)
            case |= {"block_table": _block_table(rng, batch, block_size), "block_size": block_size}
        if i % 5 == 4:
            size = 4096 * 64 + int(rng.integers(0, 64))
            case["workspace"] = rng.integers(0, 256, size, dtype=np.uint8)
        yield "kpool_index_select_fp8", case


def backward_garbage_cases(seed: int, count: int) -> Iterator[tuple[str, dict]]:
    """``count`` garbage calls of ``kpool_compress_backward``, as (function, keywords).

    The offsets, cache lengths and pool_row_offsets of :func:`garbage_cases`
    (its k, gate and ape too), or in 70% of the cases requests that hold their
    tokens (sorted offsets from 0 to the tokens, cached lengths under 64;
    pool_row_offsets None or garbage), so pools are found and their rows
    written; one case in four with kpool 9 instead (a pool that streams: 9
    members exceed the prefetch for both dtypes); grad_pooled
    of 0 to 63 rows (most often fewer than the pools claimed), in any
    pooled dtype, contiguous, transposed, every other column of a wider
    array, rows reversed or one row at stride 0; grad_k, grad_gate and
    grad_ape given full of NaN or left to the call, at a padded row stride
    or not.
    """
    rng = np.random.default_rng([seed, 31])  # a stream of its own: garbage_cases' cases stay as they were
    dtypes = (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32))
    for compress in garbage_cases(seed, count):
        k, gate, ape = compress["k"], compress["gate"], compress["ape"]
        head_dim = k.shape[1]
        if rng.random() < 0.25:
            ape = rng.standard_normal((9, head_dim)).astype(np.float32)
        offsets, cached, pools = (compress[n] for n in ("input_row_offsets", "cache_lengths", "pool_row_offsets"))
        if rng.random() < 0.7:  # requests that hold their tokens: pools are found
            batch = cached.shape[0] or int(rng.integers(1, 4))  # an empty batch finds nothing: 1 to 3 requests
            held = np.sort(rng.integers(0, k.shape[0] + 1, batch + 1))
            held[-1], held[0] = k.shape[0], 0
            offsets, cached = held.astype(offsets.dtype), rng.integers(0, 64, batch).astype(cached.dtype)
            pools = pools if rng.random() < 0.3 and pools is not None and pools.shape[0] == batch + 1 else None
        rows = int(rng.integers(0, 64))
        grad = rng.standard_normal((rows, head_dim)).astype(dtypes[int(rng.integers(0, 3))])
        layout = int(rng.integers(0, 5))
        if layout == 1:  # column stride rows, row stride 1
            grad = np.ascontiguousarray(grad.T).T
        elif layout == 2:
            wide = np.full((rows, 2 * head_dim), np.nan, grad.dtype)
            wide[:, ::2] = grad
            grad = wide[:, ::2]
        elif layout == 3:
            grad = np.ascontiguousarray(grad[::-1])[::-1]
        elif layout == 4 and rows:
            grad = np.broadcast_to(grad[0], grad.shape)
        case = {"input_row_offsets": offsets, "cache_lengths": cached, "pool_row_offsets": pools}
        case |= {"grad_pooled": grad, "k": k, "gate": gate, "ape": ape}
        for name, like in (("grad_k", k), ("grad_gate", gate), ("grad_ape", ape)):
            if rng.random() < 0.4:
                pad = int(rng.integers(0, 2)) * 8
                given = np.full((like.shape[0], like.shape[1] + pad), np.nan, like.dtype)
                case[name] = given[:, : like.shape[1]]
        yield "kpool_compress_backward", case


# Every garbage family, with the op a case that names none calls: how tests/test_adding_an_op.py sees that
# every op gets garbage. run_garbage.py and run_memcheck.py run the same families, each with its own count.
GARBAGE_FAMILIES = (
    (garbage_cases, "kpool_compress"),
    (ring_garbage_cases, None),
    (expand_garbage_cases, "kpool_expand_topk"),
    (fp8_garbage_cases, None),
    (fp8_ring_garbage_cases, None),
    (index_garbage_cases, None),
    (topk_garbage_cases, None),
    (select_garbage_cases, None),
    (backward_garbage_cases, None),
)


def garbage_ops(seed: int = 0, count: int = 24) -> set[str]:
    """The public names of the ops the families' first ``count`` cases call."""
    called = set()
    for family, op in GARBAGE_FAMILIES:
        for item in family(seed, count):
            name = op if isinstance(item, dict) else item[0]
            called.add(name if name.startswith(("kpool_", "hadamard")) else f"kpool_{name}")
    return called
