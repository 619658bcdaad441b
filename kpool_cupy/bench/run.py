"""The benchmark sweep: host costs, the empty kernel, the decode side, the FP8 epilogue, then every shape and
implementation against the copy roof."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..dtypes import element_dtype
from .backward import run_backward
from .empty import bench_empty_kernel, over_empty
from .fp8 import run_fp8
from .host_step import decode_step_host_costs
from .impls import IMPLEMENTATIONS, capture_refusal, torch_op_call, torch_stream_of_cupy, torch_unavailable
from .index import run_index
from .inputs import InputSet, make_input_sets
from .lifecycle import run_lifecycle
from .plans import plan_launch
from .ring_close_fp8 import run_ring_close_fp8
from .select import run_select
from .shapes import BenchShape, minimum_bytes, sweep
from .stats import ratios_to, rotation
from .tail_fp8 import run_tail_fp8, tail_fp8_host_cost
from .timing import (
    HOST_CALLS,
    HOST_REPEATS,
    copy_roof,
    describe,
    graph_replay_milliseconds,
    host_call_microseconds,
    l2_bytes,
    timed_entry,
)
from .topk import run_topk


def _max_abs_diff(got: Any, want: Any) -> float:
    import cupy

    got = cupy.from_dlpack(got)  # CuPy arrays and torch tensors alike
    if got.size == 0:  # CuPy's max has no initial=
        return 0.0
    return float(cupy.abs(got.astype(cupy.float32) - want.astype(cupy.float32)).max())


def shape_rotation(shape: BenchShape) -> dict[str, Any]:
    """The input sets of ``shape`` (stats.rotation: a round touches three L2 sizes) and the L2 size's source."""
    itemsize = element_dtype(shape.dtype).itemsize
    # k and gate whole, out, and the index arrays: what one set occupies.
    allocated = (2 * shape.tokens + shape.pools) * shape.head_dim * itemsize + 32 * (shape.requests + 1)
    l2, source = l2_bytes()
    return {**rotation(minimum_bytes(shape), allocated, l2), "l2_source": source}


def bench_shape(shape: BenchShape, implementations: Iterable[str], samples: int) -> dict[str, Any]:
    import cupy

    nbytes = minimum_bytes(shape)
    rotated = shape_rotation(shape)
    count = rotated["sets"]
    sets = make_input_sets(shape, count)

    copy = copy_roof(nbytes, count, samples)
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
        "rotation": rotated,
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
            entry = timed_entry(runner, count, samples, nbytes, copy["gbps"], capture_refusal(name, runner))
        except Exception as error:  # one broken alternative is recorded; the sweep goes on
            record["implementations"][name] = {"failed": describe(error)}
            continue
        if reference is not None and name != "kpool-cupy":
            entry["max_abs_diff_vs_kpool_cupy"] = _max_abs_diff(output, reference)
        record["implementations"][name] = entry
    ratios_to(record["implementations"])
    return record


def torch_op_cost(s: InputSet, want: np.ndarray, repeats: int = HOST_REPEATS) -> dict[str, Any]:
    """Host time of the hot call made through ``torch.ops.kpool.compress.out`` on views of ``s``, or why not.

    The same method as the CuPy path's hot call, on the same arrays, with
    torch's current stream set to CuPy's for the whole measurement (so each
    loop is drained as the CuPy path's is). ``want``: the CuPy path's bits in
    ``s.out``, which the torch op must write too.
    """
    import cupy

    why = torch_unavailable()
    if why is not None:
        return {"torch_op": why}
    import torch

    call = torch_op_call(s)
    with torch.cuda.stream(torch_stream_of_cupy({})):
        s.out.fill(0)
        call()  # the plan the CuPy path made serves this signature too
        same = np.array_equal(cupy.asnumpy(s.out).view(np.uint8), want.view(np.uint8))
        microseconds = host_call_microseconds(call, repeats=repeats)
    return {"torch_op_matches": bool(same), "call_us_torch_op": microseconds}


def host_costs(shape: BenchShape, repeats: int = HOST_REPEATS) -> dict[str, Any]:
    """Host time of one kpool_compress call, validate on and off, against the bare CuPy launch it makes, and of
    the same hot call through ``torch.ops.kpool.compress.out`` (skipped with a reason without torch on CUDA).

    Also the device time of one replay of a CUDA graph that captured the call.
    """
    import cupy

    from kpool_cupy import kpool_compress

    from ..ops import COMPRESS

    (s,) = make_input_sets(shape, 1)
    operands = {
        "k": s.k,
        "gate": s.gate,
        "ape": s.ape,
        "input_row_offsets": s.input_row_offsets,
        "cache_lengths": s.cache_lengths,
        "pool_row_offsets": s.pool_row_offsets,
        "out": s.out,
    }
    checked = {name: value for name, value in operands.items() if name != "pool_row_offsets"}

    def hot() -> Any:
        return kpool_compress(**operands, validate=False)

    def validated() -> Any:
        return kpool_compress(**checked, validate=True)

    hot()  # the signature's first call runs the full path and makes the plan
    want = cupy.asnumpy(s.out)
    record: dict[str, Any] = {
        "shape": shape.name,
        "calls_per_sample": HOST_CALLS,
        "call_us_validate_on": host_call_microseconds(validated, repeats=repeats),
        "call_us_validate_off": host_call_microseconds(hot, repeats=repeats),
    }
    bare = plan_launch(COMPRESS, operands, {"validate": False})
    if isinstance(bare, str):
        record["bare_launch"] = bare
    else:
        s.out.fill(0)
        bare()
        # The bare launch is the package's launch only if it writes the same bits.
        record["bare_launch_matches"] = bool(np.array_equal(cupy.asnumpy(s.out).view(np.uint8), want.view(np.uint8)))
        record["bare_launch_us"] = host_call_microseconds(bare, repeats=repeats)
        record["overhead_over_bare_us"] = record["call_us_validate_off"] - record["bare_launch_us"]
    record.update(torch_op_cost(s, want, repeats=repeats))
    if "call_us_torch_op" in record:
        record["torch_op_over_cupy_us"] = record["call_us_torch_op"] - record["call_us_validate_off"]
    record["graph_replay_us"] = graph_replay_milliseconds(hot) * 1e3
    return record


class _WallClock:
    """Stamps each record with ``wall_s``: host seconds since the previous stamp (inputs, compiles, captures
    and timing together), so a run cut at its limit shows where its time went."""

    def __init__(self) -> None:
        self.last = time.perf_counter()

    def stamp(self, record: dict[str, Any]) -> dict[str, Any]:
        now = time.perf_counter()
        record["wall_s"] = round(now - self.last, 3)
        self.last = now
        return record


def run_sweep(
    shapes: list[BenchShape],
    implementations: list[str],
    samples: int,
    progress: Callable[[Iterable[BenchShape]], Any],
    quick: bool = False,
    checkpoint: Callable[[dict[str, Any]], None] = lambda partial: None,
    decode_side: bool = True,
    fp8: bool = True,
    index: bool = True,
    select: bool = True,
    backward: bool = True,
    host: bool = True,
) -> dict[str, Any]:
    """Host costs (``host``), the empty kernel, the decode side, the FP8 and the scorer's records, then every
    shape of the sweep; ``checkpoint`` gets what is done after each record.

    The short records come first, so a run cut short in the long sweep keeps
    them; ``"shapes"`` appears once they are done. The host cost is taken on
    the sweep's smallest decode shape, whatever ``shapes`` holds: its calls
    are short, so the host's time is what shows.
    """
    results: dict[str, Any] = {"numpy": np.__version__, "complete": False}
    repeats = min(samples, HOST_REPEATS)
    clock = _WallClock()
    if host:
        results["host"] = host_costs(sweep()[0], repeats=repeats)
        results["host"]["decode_step"] = decode_step_host_costs(repeats=repeats, quick=quick)
        clock.stamp(results["host"])
        checkpoint(results)
    if decode_side or fp8:
        results["empty_kernel"] = clock.stamp(bench_empty_kernel(samples))
        checkpoint(results)
    if fp8:
        results["host_fp8_decode"] = clock.stamp(tail_fp8_host_cost(repeats=repeats))
        checkpoint(results)
    results["lifecycle"] = []
    for record in run_lifecycle(quick, samples) if decode_side else ():
        over_empty(record, results["empty_kernel"])
        results["lifecycle"].append(clock.stamp(record))
        checkpoint(results)
    results["fp8"] = []
    fp8_records = itertools.chain(
        run_fp8(quick, samples), run_tail_fp8(quick, samples), run_ring_close_fp8(quick, samples)
    )
    for record in fp8_records if fp8 else ():
        over_empty(record, results["empty_kernel"])
        results["fp8"].append(clock.stamp(record))
        checkpoint(results)
    results["index"] = []
    for record in run_index(quick, samples) if index else ():
        results["index"].append(clock.stamp(record))
        checkpoint(results)
    results["select"] = []
    for record in itertools.chain(run_select(quick, samples), run_topk(quick, samples)) if select else ():
        results["select"].append(clock.stamp(record))
        checkpoint(results)
    results["backward"] = []
    for record in run_backward(quick, samples) if backward else ():
        results["backward"].append(clock.stamp(record))
        checkpoint(results)
    results["shapes"] = []
    checkpoint(results)
    with progress(shapes) as bar:
        for shape in bar:
            results["shapes"].append(clock.stamp(bench_shape(shape, implementations, samples)))
            checkpoint(results)
    return results
