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
