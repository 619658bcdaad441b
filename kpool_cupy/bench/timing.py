"""Device and host timing (GPU only).

Device time comes from replaying a CUDA graph that captured one round of
calls, one per input set and at least ``MIN_GRAPH_CALLS``, so no Python runs
inside the timed span; ``WARMUP_MS`` of the timed work run before the first
sample. A call
that cannot be captured (it syncs, or launches on a stream the capture does
not see) is timed with events around its Python loop instead, and every
result says which: ``"timing": "graph"`` or ``"events-around-python"``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .stats import ASSUMED_L2_BYTES, bandwidth_gbps, fraction_of, summarize_times

GRAPH = "graph"
EVENTS = "events-around-python"
# Calls in one captured round at least: a shape with fewer input sets goes round them again (each set still
# waits a whole rotation between its uses), so the graph's own launch cost is spread over 32 calls or more.
MIN_GRAPH_CALLS = 32
# Device time spent on the timed work itself before the first sample, at least: enough to lift the clocks of
# a GPU that sat idle, and WARMUP_REPLAYS replays (or a window of calls) whatever that takes.
WARMUP_MS = 20.0
WARMUP_REPLAYS = 2
# Calls per events sample at most; the rotation carries on from one sample to the next. What events time is
# a Python loop (composites of array operations, about 1 ms a call at decode shapes on the H200), so a sample of
# 128 calls is already long against the events' resolution; 512 cost the GPU run's bench step tens of seconds.
EVENT_WINDOW = 128
WARMUP_CALLS = 10  # uncaptured calls before the events samples, at least (compiles, autotuning, caches)
HOST_CALLS = 200  # per host-cost sample: far below CUDA's launch queue (about 1024), so no call waits for the device
HOST_REPEATS = 5


def describe(error: BaseException) -> str:
    """``Type: first line of the message``, at most 200 characters: how the JSON names an error."""
    lines = str(error).splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:200]


def l2_bytes() -> tuple[int, str]:
    """The current device's L2 size in bytes and where it came from; an H200's 50 MiB when the device does not say."""
    import cupy

    device = cupy.cuda.Device()
    with contextlib.suppress(Exception):  # CuPy raises its own CUDA error types; the next source is tried
        size = int(device.attributes["L2CacheSize"])
        if size > 0:
            return size, "device attribute L2CacheSize"
    with contextlib.suppress(Exception):
        size = int(cupy.cuda.runtime.getDeviceProperties(device.id)["l2CacheSize"])
        if size > 0:
            return size, "device properties l2CacheSize"
    return ASSUMED_L2_BYTES, "assumed: 50 MiB (H200)"


def graph_calls(sets: int) -> int:
    """Calls one captured round makes over ``sets`` input sets: every set once, going round again up to
    ``MIN_GRAPH_CALLS``."""
    return max(sets, MIN_GRAPH_CALLS)


def capture_round(run: Callable[[int], Any], sets: int, stream: Any, calls: int | None = None) -> Any:
    """A CUDA graph of ``calls`` calls ``run(i % sets)`` (``sets`` calls if None) captured on ``stream``.

    Each set is called once on ``stream`` first, outside the capture: the
    first call of a signature compiles, loads and (for kpool_cupy) makes its
    launch plan, none of which may happen inside a capture.
    """
    with stream:
        for i in range(sets):
            run(i)
    stream.synchronize()
    stream.begin_capture()
    try:
        with stream:
            for i in range(sets if calls is None else calls):
                run(i % sets)
    except BaseException:
        # The capture is broken; ending it frees the stream. The error that
        # broke it is the one raised.
        with contextlib.suppress(Exception):
            stream.end_capture()
        raise
    return stream.end_capture()


def replay_refusal(run: Callable[[int], Any], output: Any) -> str | None:
    """None when a replay of a CUDA graph that captured ``run(0)`` writes ``output`` again; else why not.

    A call that launches on a stream the capture does not record runs at once
    and leaves a graph without its launch, whose replays would time nothing.
    ``output`` (contiguous; what ``run(0)`` writes) is filled with 0xFF bytes
    before the call and again before the replay, so each must write it.
    """
    import cupy

    raw = output.view(cupy.uint8)
    if raw.size == 0:
        return None
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        raw.fill(0xFF)
    try:
        graph = capture_round(run, 1, stream)  # run(0) once on the stream, then captured
    except Exception as error:  # any failure to capture is recorded, and the events time the loop instead
        return f"capture failed: {describe(error)}"
    written = cupy.asnumpy(raw)  # capture_round drained the stream before it began capturing
    with stream:
        raw.fill(0xFF)
    graph.launch(stream)
    stream.synchronize()
    if not np.array_equal(cupy.asnumpy(raw), written):
        return "a replay of the captured call did not rewrite its output: it launched on a stream the capture missed"
    return None


def graph_times(run: Callable[[int], Any], sets: int, samples: int) -> list[float]:
    """Per-call device milliseconds: each sample is one replay of the captured round, divided by its calls."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    calls = graph_calls(sets)
    graph = capture_round(run, sets, stream, calls)
    warm_up(lambda: graph.launch(stream), stream, WARMUP_REPLAYS)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(samples):
        start.record(stream)
        graph.launch(stream)
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / calls)
    return times


def warm_up(step: Callable[[], Any], stream: Any, least: int) -> float:
    """Run ``step`` on ``stream`` at least ``least`` times and until ``WARMUP_MS`` of device time have passed;
    returns the milliseconds it took.

    The steps go in batches that double, timed by events around each batch,
    so a short step costs few host syncs.
    """
    import cupy

    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    spent, done, batch = 0.0, 0, max(least, 1)
    while done < least or spent < WARMUP_MS:
        start.record(stream)
        for _ in range(batch):
            step()
        end.record(stream)
        end.synchronize()
        spent += cupy.cuda.get_elapsed_time(start, end)
        done += batch
        batch *= 2
    return spent


def event_times(run: Callable[[int], Any], sets: int, samples: int) -> list[float]:
    """Per-call device milliseconds from events around a Python loop of calls on the current stream.

    Each sample times up to ``EVENT_WINDOW`` calls; the calls go on through
    the input sets in turn from one sample to the next, so every call still
    finds its set a whole rotation after its last use.
    """
    import cupy

    window = min(sets, EVENT_WINDOW)
    position = 0

    def calls(count: int) -> None:
        nonlocal position
        for _ in range(count):
            run(position % sets)
            position += 1

    stream = cupy.cuda.get_current_stream()
    warm_up(lambda: calls(max(window, WARMUP_CALLS)), stream, 1)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(samples):
        start.record(stream)
        calls(window)
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / window)
    return times


def device_times(
    run: Callable[[int], Any], sets: int, samples: int, refusal: str | None = None
) -> tuple[list[float], str, str | None]:
    """Per-call device milliseconds of ``run`` over ``sets`` input sets, the method, and why not a graph if not.

    A graph when ``refusal`` is None and the capture works; otherwise events
    around the Python loop, with ``refusal`` or the capture's error as the note.
    """
    if refusal is None:
        try:
            return graph_times(run, sets, samples), GRAPH, None
        except Exception as error:  # any failure to capture is recorded, and the events time the loop instead
            refusal = f"capture failed: {describe(error)}"
    return event_times(run, sets, samples), EVENTS, refusal


def timed_entry(
    run: Callable[[int], Any], sets: int, samples: int, nbytes: int, copy_gbps: float, refusal: str | None = None
) -> dict[str, Any]:
    """One implementation's JSON entry: time statistics, method, bandwidth and fraction of the copy roof."""
    times, method, note = device_times(run, sets, samples, refusal)
    entry: dict[str, Any] = {**summarize_times(times), "timing": method}
    if note is not None:
        entry["timing_note"] = note
    entry["gbps"] = bandwidth_gbps(nbytes, entry["median_ms"])
    entry["fraction_of_copy"] = fraction_of(entry["gbps"], copy_gbps)
    return entry


def copy_roof(nbytes: int, sets: int, samples: int) -> dict[str, Any]:
    """The roof for ``nbytes`` of traffic: a device-to-device copy of half of them, timed like the kernels.

    A copy of N bytes reads N and writes N; the kernels are credited with the
    bytes they read plus the bytes they write, so the copy that moves the same
    traffic copies ``nbytes / 2``.
    """
    copied = max(nbytes // 2, 1)
    times, method, note = device_times(copy_runner(copied, sets), sets, samples)
    moved = 2 * copied
    entry: dict[str, Any] = {**summarize_times(times), "timing": method}
    if note is not None:
        entry["timing_note"] = note
    return {**entry, "bytes_copied": copied, "bytes_moved": moved, "gbps": bandwidth_gbps(moved, entry["median_ms"])}


def copy_runner(nbytes: int, sets: int) -> Callable[[int], Any]:
    """A device-to-device copy of ``nbytes``, rotating over ``sets`` source/target pairs: the roof.

    The pairs are slices of two buffers, 256-byte aligned like separate
    allocations, so tens of thousands of small pairs cost two allocations.
    """
    import cupy

    stride = -(-nbytes // 256) * 256
    source = cupy.zeros(stride * sets, dtype=cupy.uint8)
    target = cupy.empty(stride * sets, dtype=cupy.uint8)
    pairs = [(target.data + i * stride, source.data + i * stride) for i in range(sets)]

    def run(i: int) -> None:
        to, origin = pairs[i]
        to.copy_from_device_async(origin, nbytes)

    return run


def host_call_microseconds(call: Callable[[], Any], calls: int = HOST_CALLS, repeats: int = HOST_REPEATS) -> float:
    """Host wall time of one call from Python, in microseconds: the median over ``repeats`` loops of ``calls``.

    The device is drained before each loop and not inside it: a loop this
    short never fills CUDA's launch queue, so no call waits for the device and
    the time is the host's own.
    """
    import cupy

    stream = cupy.cuda.get_current_stream()
    call()
    per_call = []
    for _ in range(repeats):
        stream.synchronize()
        began = time.perf_counter()
        for _ in range(calls):
            call()
        per_call.append((time.perf_counter() - began) / calls * 1e6)
    stream.synchronize()
    return float(np.median(per_call))


def graph_replay_milliseconds(call: Callable[[], Any], replays: int = 200) -> float:
    """Device time of one replay of a CUDA graph that captured one ``call()``, per replay."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    graph = capture_round(lambda i: call(), 1, stream)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    graph.launch(stream)
    start.record(stream)
    for _ in range(replays):
        graph.launch(stream)
    end.record(stream)
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / replays
