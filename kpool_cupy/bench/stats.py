"""Statistics of timed runs; pure functions, unit-tested on the CPU."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MEMORY_BUDGET = 8 * 2**30  # input sets of one shape; far below an H100/H200's memory


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


def input_sets(bytes_per_set: int, l2_bytes: int, memory_budget: int) -> int:
    """How many input sets to rotate through so successive calls do not find their inputs in L2.

    Enough sets to span three times the L2 size, at least 2, within the
    memory budget.
    """
    wanted = -(-3 * l2_bytes // max(bytes_per_set, 1))
    affordable = max(memory_budget // max(bytes_per_set, 1), 1)
    return int(max(2, min(wanted, affordable, 64)))
