"""The launch floor: an empty kernel timed like the decode side's calls, so their times have a baseline.

A decode step moves a few KiB, so its device time is mostly the cost of a
launch inside a CUDA graph; the empty kernel's time per call, measured by
the same method in the same run, says how much of it. Each decode-side and
FP8 record's kpool-cupy entry then carries ``time_over_empty_kernel``.
"""

from __future__ import annotations

import functools
from typing import Any

from .stats import summarize_times
from .timing import device_times, graph_calls

# The one kernel the package compiles from text of its own: nothing in it to keep in step with the emulator
# or with kernels/ (held in a file there, it would be the only .cu no op uses).
EMPTY_KERNEL = 'extern "C" __global__ void kpool_bench_empty() {}\n'
EMPTY_NAME = "kpool_bench_empty"
EMPTY_CALLS = 4096  # calls per replay: as many as the decode side's middle rounds, so the graph's cost is spread alike
EMPTY_GRID, EMPTY_BLOCK = 1, 32


@functools.cache
def empty_kernel() -> Any:
    """The loaded empty kernel, compiled with the package's NVRTC options (CuPy's disk cache keeps it)."""
    import cupy

    from ..kernel.sources import NVRTC_OPTIONS

    return cupy.RawModule(code=EMPTY_KERNEL, options=NVRTC_OPTIONS).get_function(EMPTY_NAME)


def bench_empty_kernel(samples: int) -> dict[str, Any]:
    """Per-call device time of the empty kernel, one block of one warp, over ``EMPTY_CALLS`` calls a round."""
    kernel = empty_kernel()

    def run(i: int) -> None:
        kernel((EMPTY_GRID,), (EMPTY_BLOCK,), ())

    times, method, note = device_times(run, EMPTY_CALLS, samples)
    record: dict[str, Any] = {
        "name": "empty-kernel",
        "grid": EMPTY_GRID,
        "block": EMPTY_BLOCK,
        "calls_per_replay": graph_calls(EMPTY_CALLS),
        **summarize_times(times),
        "timing": method,
    }
    if note is not None:
        record["timing_note"] = note
    return record


def over_empty(record: dict[str, Any], empty: dict[str, Any]) -> None:
    """Add ``time_over_empty_kernel`` to ``record``'s kpool-cupy entry when both were timed by the same method."""
    entry = record.get("implementations", {}).get("kpool-cupy", {})
    if "median_ms" in entry and entry.get("timing") == empty.get("timing") and empty.get("median_ms", 0) > 0:
        entry["time_over_empty_kernel"] = entry["median_ms"] / empty["median_ms"]
