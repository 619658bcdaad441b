"""Statistics of timed runs; pure functions, unit-tested on the CPU."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

ROTATION_OVER_L2 = 3  # input sets span this many L2 sizes, so no call finds its inputs in L2
MAX_ROTATION_BYTES = 4 * 2**30  # the memory the input sets of one shape may take; far below an H200's
MAX_SETS = 65536  # calls in one captured round; reached only by the smallest decode-side calls
ASSUMED_L2_BYTES = 50 * 2**20  # an H200's L2, when the device does not say


def summarize_times(milliseconds: Sequence[float]) -> dict[str, float]:
    """Median and spread of per-call device times in milliseconds."""
    if len(milliseconds) == 0:
        raise ValueError("Invalid milliseconds: expected at least one timed run, got none")
    values = np.asarray(milliseconds, dtype=np.float64)
    return {
        "median_ms": float(np.median(values)),
        "p10_ms": float(np.percentile(values, 10)),
        "p90_ms": float(np.percentile(values, 90)),
        "min_ms": float(values.min()),
        "runs": int(values.size),
    }


def bandwidth_gbps(nbytes: int, milliseconds: float) -> float:
    """Achieved bandwidth in GB/s (10^9 bytes per second)."""
    if milliseconds <= 0:
        raise ValueError(f"Invalid milliseconds: expected a positive time, got {milliseconds}")
    return nbytes / (milliseconds * 1e-3) / 1e9


def fraction_of(value: float, roof: float) -> float:
    """``value`` as a fraction of ``roof`` (the copy's bandwidth in the same run)."""
    if roof <= 0:
        raise ValueError(f"Invalid roof: expected a positive bandwidth, got {roof}")
    return value / roof


def rotation(bytes_per_set: int, allocated_per_set: int, l2_bytes: int) -> dict[str, Any]:
    """How many input sets to rotate through so a call never finds its inputs in L2, and what that gives.

    ``bytes_per_set`` is what one call reads and writes, ``allocated_per_set``
    what one set occupies. Enough sets that one round touches
    ``ROTATION_OVER_L2`` times the L2, at least 2, within ``MAX_SETS`` and
    ``MAX_ROTATION_BYTES`` of memory; ``capped`` names the limit that cut the
    count short ("sets" or "memory"), None when neither did.
    """
    if l2_bytes <= 0:
        raise ValueError(f"Invalid l2_bytes: expected a positive size, got {l2_bytes}")
    touched = max(int(bytes_per_set), 1)
    wanted = -(-ROTATION_OVER_L2 * l2_bytes // touched)
    by_memory = max(MAX_ROTATION_BYTES // max(int(allocated_per_set), 1), 1)
    sets = max(2, min(wanted, MAX_SETS, by_memory))
    capped = None
    if sets < wanted:
        capped = "memory" if by_memory < MAX_SETS else "sets"
    return {
        "sets": int(sets),
        "bytes_per_set": touched,
        "bytes": int(sets) * touched,
        "l2_bytes": int(l2_bytes),
        "over_l2": int(sets) * touched / l2_bytes,
        "capped": capped,
    }


def ratios_to(implementations: dict[str, dict[str, Any]], base: str = "kpool-cupy") -> None:
    """Give every measured entry ``time_over_<base>``: its median time over ``base``'s (above 1: slower than base).

    Nothing is added when ``base`` was not measured; skipped and failed entries
    have no time and get nothing.
    """
    reference = implementations.get(base, {}).get("median_ms")
    if not reference:
        return
    key = "time_over_" + base.replace("-", "_")
    for entry in implementations.values():
        if "median_ms" in entry:
            entry[key] = entry["median_ms"] / reference
