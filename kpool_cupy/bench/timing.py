"""Device and host timing with CUDA events (GPU only)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .stats import bandwidth_gbps, summarize_times


def device_times(run: Callable[[int], Any], sets: int, warmup: int = 5, samples: int = 30) -> list[float]:
    """Per-call device milliseconds: each sample times one call on every input set in turn.

    Rotating through the sets keeps a call from finding its inputs in L2;
    timing a round of calls between one pair of events keeps microsecond
    kernels above the events' resolution.
    """
    import cupy

    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    for i in range(warmup * sets):
        run(i % sets)
    cupy.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(samples):
        start.record()
        for i in range(sets):
            run(i)
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / sets)
    return times


def copy_roof(nbytes: int, sets: int, samples: int) -> dict[str, Any]:
    """The roof for ``nbytes`` of traffic: a device-to-device copy of half of them, timed like the kernels.

    A copy of N bytes reads N and writes N; the kernels are credited with the
    bytes they read plus the bytes they write, so the copy that moves the same
    traffic copies ``nbytes / 2``.
    """
    copied = max(nbytes // 2, 1)
    times = summarize_times(device_times(copy_runner(copied, sets), sets, samples=samples))
    moved = 2 * copied
    return {**times, "bytes_copied": copied, "bytes_moved": moved, "gbps": bandwidth_gbps(moved, times["median_ms"])}


def copy_runner(nbytes: int, sets: int) -> Callable[[int], Any]:
    """A device-to-device copy of ``nbytes``, rotating over ``sets`` source/target pairs: the roof."""
    import cupy

    pairs = [(cupy.empty(nbytes, dtype=cupy.uint8), cupy.empty(nbytes, dtype=cupy.uint8)) for _ in range(sets)]

    def run(i: int) -> None:
        source, target = pairs[i]
        target.data.copy_from_device_async(source.data, nbytes)

    return run


def host_call_microseconds(call: Callable[[], Any], calls: int = 200) -> float:
    """Wall time of ``calls`` back-to-back calls from Python, per call, device drained after."""
    import cupy

    call()
    cupy.cuda.get_current_stream().synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        call()
    cupy.cuda.get_current_stream().synchronize()
    return (time.perf_counter() - began) / calls * 1e6


def graph_replay_milliseconds(call: Callable[[Any], Any], replays: int = 200) -> float:
    """Device time of one replay of a CUDA graph that captured ``call(stream)``, per replay."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    call(stream)  # compile and load outside the capture
    stream.synchronize()
    stream.begin_capture()
    call(stream)
    graph = stream.end_capture()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    graph.launch(stream)
    start.record(stream)
    for _ in range(replays):
        graph.launch(stream)
    end.record(stream)
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / replays
