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
MAX_BLOCK_SIZE = 1 << 20  # kpool_cupy.ops.expand_topk.MAX_BLOCK_SIZE: a larger one is a ValueError, validated or not


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
