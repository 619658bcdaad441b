"""The benchmark sweep: every shape, every implementation, the copy roof, host cost and graph replay."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .impls import IMPLEMENTATIONS
from .inputs import make_input_sets
from .lifecycle import run_lifecycle
from .shapes import BenchShape, minimum_bytes
from .stats import MEMORY_BUDGET, bandwidth_gbps, fraction_of, input_sets, summarize_times
from .timing import copy_roof, device_times, graph_replay_milliseconds, host_call_microseconds


def _max_abs_diff(got: Any, want: Any) -> float:
    import cupy

    got = cupy.from_dlpack(got)  # CuPy arrays and torch tensors alike
    if got.size == 0:  # CuPy's max has no initial=
        return 0.0
    return float(cupy.abs(got.astype(cupy.float32) - want.astype(cupy.float32)).max())


def bench_shape(shape: BenchShape, implementations: Iterable[str], samples: int) -> dict[str, Any]:
    import cupy

    nbytes = minimum_bytes(shape)
    l2 = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["l2CacheSize"]
    itemsize = 2 if shape.dtype != "float32" else 4
    per_set = shape.tokens * shape.head_dim * 2 * itemsize + nbytes
    count = input_sets(per_set, l2, MEMORY_BUDGET)
    sets = make_input_sets(shape, count)

    copy = copy_roof(nbytes, count, samples)
    copy_gbps = copy["gbps"]
    record: dict[str, Any] = {
        "name": shape.name,
        "kind": shape.kind,
        "head_dim": shape.head_dim,
        "kpool": shape.kpool,
        "dtype": shape.dtype,
        "requests": shape.requests,
        "tokens": shape.tokens,
        "pools": shape.pools,
        "bytes": nbytes,
        "input_sets": count,
        "copy": copy,
        "implementations": {},
    }
    reference = None
    for name in implementations:
        try:
            runner = IMPLEMENTATIONS[name](shape, sets)
            if isinstance(runner, str):
                record["implementations"][name] = {"skipped": runner}
                continue
            output = runner(0)
            if name == "kpool-cupy":
                reference = cupy.array(output, copy=True)
            times = summarize_times(device_times(runner, count, samples=samples))
        except Exception as error:  # one broken alternative is recorded; the sweep goes on
            record["implementations"][name] = {"failed": f"{type(error).__name__}: {str(error)[:200]}"}
            continue
        gbps = bandwidth_gbps(nbytes, times["median_ms"])
        entry = {**times, "gbps": gbps, "fraction_of_copy": fraction_of(gbps, copy_gbps)}
        if reference is not None and name != "kpool-cupy":
            entry["max_abs_diff_vs_kpool_cupy"] = _max_abs_diff(output, reference)
        record["implementations"][name] = entry
    return record


def host_costs(shape: BenchShape) -> dict[str, float]:
    """Python-side cost of one kpool_compress call, validate on and off, and a CUDA-graph replay."""
    from kpool_cupy import kpool_compress

    (s,) = make_input_sets(shape, 1)
    args = (s.k, s.gate, s.ape, s.input_row_offsets, s.cache_lengths)

    def fast(stream: Any = None) -> Any:
        return kpool_compress(*args, pool_row_offsets=s.pool_row_offsets, out=s.out, validate=False, stream=stream)

    return {
        "shape": shape.name,
        "call_us_validate_on": host_call_microseconds(lambda: kpool_compress(*args, out=s.out, validate=True)),
        "call_us_validate_off": host_call_microseconds(fast),
        "graph_replay_us": graph_replay_milliseconds(fast) * 1e3,
    }


def run_sweep(
    shapes: list[BenchShape],
    implementations: list[str],
    samples: int,
    progress: Callable[[Iterable[BenchShape]], Any],
    quick: bool = False,
    checkpoint: Callable[[dict[str, Any]], None] = lambda partial: None,
) -> dict[str, Any]:
    """Every shape, then the decode side and the host cost; ``checkpoint`` gets the shapes done so far after each."""
    records = []
    with progress(shapes) as bar:
        for shape in bar:
            records.append(bench_shape(shape, implementations, samples))
            checkpoint({"shapes": records, "complete": False})
    return {
        "shapes": records,
        "lifecycle": run_lifecycle(quick, samples),
        "host": host_costs(shapes[0]),
        "numpy": np.__version__,
    }
