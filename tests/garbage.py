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
    token rows that are strided views of a larger buffer.
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
