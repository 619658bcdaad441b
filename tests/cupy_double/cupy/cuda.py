"""cupy.cuda for the double: one device; streams that queue work, graphs that defer it.

The model, a legal CUDA schedule chosen so that a wrong stream shows:

- The legacy null stream (``Stream.null``, the default current stream) runs
  work at once, after draining every blocking stream (legacy semantics).
- Any other stream queues its work (kernel launches, copies, host functions,
  event records, graph launches) and runs it, in order, only when something
  waits for it: ``synchronize()`` on the stream, an event recorded on it,
  the device, an array operation on it as the current stream (``ndarray``
  calls ``_before_array_op``), a ``get()`` on it.
- A stream in capture records the work sent to it into its graph and runs
  none of it; ``Graph.launch`` queues the recorded work on a stream. Waiting
  for a capturing stream, or running an array operation on it (the double
  cannot defer NumPy), raises, as CUDA refuses a sync during capture.

``launch_log`` lists the kernel launches: (kernel name, stream handle, "ran",
"queued" or "captured").
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
import warnings
from types import SimpleNamespace

L2_BYTES = 2**20  # a small L2, so the benchmark's rotation stays small on the CPU

launch_log: collections.deque = collections.deque(maxlen=10000)
_handles = itertools.count(0x1000, 0x10)  # fake cudaStream_t values, never 0
_queues: dict[int, _Queue] = {}
_queues_lock = threading.Lock()
_local = threading.local()  # .stack: the current streams of this thread; .devices: its entered devices;
# .in_work: running queued work
_allocator: object = "memory pool"


class CaptureError(RuntimeError):
    """What CUDA answers to a sync or an implicit dependency on a capturing stream."""


class _Queue:
    def __init__(self, ptr: int, non_blocking: bool) -> None:
        self.ptr = ptr
        self.non_blocking = non_blocking
        self.pending: collections.deque = collections.deque()
        self.issued = 0  # work items ever queued
        self.done = 0  # work items run
        self.graph: list | None = None  # the work recorded while capturing
        self.lock = threading.RLock()  # held while running, so work runs in stream order


def _queue(ptr: int, non_blocking: bool = False) -> _Queue:
    with _queues_lock:
        queue = _queues.get(ptr)
        if queue is None:
            queue = _queues[ptr] = _Queue(ptr, non_blocking)
        return queue


def _run(work) -> None:
    outer = getattr(_local, "in_work", False)
    _local.in_work = True
    try:
        work()
    finally:
        _local.in_work = outer


def _flush(queue: _Queue, upto: int | None = None) -> None:
    """Run ``queue``'s work in order, all of it or until ``upto`` items have run."""
    if queue.graph is not None:
        raise CaptureError(f"cudaErrorStreamCaptureUnsupported: waiting for stream {queue.ptr:#x} while it captures")
    with queue.lock:
        while queue.pending and (upto is None or queue.done < upto):
            work = queue.pending.popleft()
            queue.done += 1
            _run(work)


def _blocking_queues() -> list[_Queue]:
    with _queues_lock:
        return [q for q in _queues.values() if q.ptr != 0 and not q.non_blocking]


def _drain_for_null_stream() -> None:
    """Legacy null-stream work starts after every blocking stream's earlier work."""
    for queue in _blocking_queues():
        if queue.graph is not None:
            raise CaptureError(
                f"cudaErrorStreamCaptureImplicit: null-stream work would wait for capturing stream {queue.ptr:#x}"
            )
        _flush(queue)


def _enqueue(stream: Stream | None, work, name: str | None = None) -> str:
    """Send ``work`` to ``stream`` (None: the current one); returns what became of it."""
    queue = (stream or get_current_stream())._queue
    if queue.graph is not None:
        queue.graph.append(work)
        fate = "captured"
    elif queue.ptr == 0:
        _drain_for_null_stream()
        _run(work)
        fate = "ran"
    else:
        with queue.lock:
            queue.pending.append(work)
            queue.issued += 1
        fate = "queued"
    if name is not None:
        launch_log.append((name, queue.ptr, fate))
    return fate


def _before_array_op() -> None:
    """An array operation runs on the current stream: after that stream's queued work."""
    if getattr(_local, "in_work", False):
        return
    queue = get_current_stream()._queue
    if queue.graph is not None:
        raise CaptureError(
            "cudaErrorStreamCaptureUnsupported: the CuPy double cannot capture array operations "
            "(a GPU would record them); only kernel launches, copies and graph launches are captured"
        )
    if queue.ptr == 0:
        _drain_for_null_stream()
    else:
        _flush(queue)


def _wait_for(stream: Stream | None) -> None:
    """Host waits for ``stream`` (None: the current one), as a blocking device-to-host copy does."""
    queue = (stream or get_current_stream())._queue
    if queue.ptr == 0:
        _drain_for_null_stream()
    else:
        _flush(queue)


def alloc_pinned_memory(size: int) -> bytearray:
    """Host memory a non-blocking copy may target (page-locked in CUDA; plain bytes here)."""
    return bytearray(size)


COMPUTE_CAPABILITY = "90"  # what Device.compute_capability says; tests may set another


def current_device() -> int:
    """The device this thread has entered last (CuPy's current device; 0 until one is entered)."""
    devices = getattr(_local, "devices", None)
    return devices[-1] if devices else 0


class Device:
    def __init__(self, device: int | None = None) -> None:
        self.id = current_device() if device is None else int(device)

    def __enter__(self) -> Device:
        devices = getattr(_local, "devices", None)
        if devices is None:
            devices = _local.devices = []
        devices.append(self.id)
        return self

    def __exit__(self, *exc) -> bool:
        _local.devices.pop()
        return False

    @property
    def attributes(self) -> dict[str, int]:
        return {"L2CacheSize": L2_BYTES, "MultiProcessorCount": 1}

    @property
    def compute_capability(self) -> str:
        """CuPy's spelling ("90" for sm_90); the double is an H200 unless a test says otherwise."""
        return COMPUTE_CAPABILITY

    def synchronize(self) -> None:
        _synchronize_device()


def _synchronize_device() -> None:
    with _queues_lock:
        queues = list(_queues.values())
    for queue in queues:
        _flush(queue)


class Graph:
    """The work a capture recorded; each launch queues all of it on a stream, as one item."""

    def __init__(self, work: list) -> None:
        self.work = work

    def launch(self, stream: Stream | None = None) -> None:
        work = list(self.work)

        def replay() -> None:
            for item in work:
                item()

        _enqueue(stream, replay)


class Stream:
    null: Stream

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False, ptr: int | None = None):
        self.ptr = 0 if null else (next(_handles) if ptr is None else int(ptr))
        self._queue = _queue(self.ptr, non_blocking)
        # As CuPy: a stream belongs to the device current when it is made; the null and per-thread streams
        # say -1, whichever device is current.
        self.device_id = -1 if null or ptds else current_device()

    @classmethod
    def from_external(cls, obj) -> Stream:
        return cls(ptr=int(obj.__cuda_stream__()[1]))

    def __enter__(self) -> Stream:
        if self.device_id >= 0 and self.device_id != current_device():  # CuPy's check_stream_device_match
            raise RuntimeError(
                f"The device that the stream is created on ({self.device_id}) does not match with the current "
                f"device ({current_device()})"
            )
        # As CuPy: each device keeps its own stack of current streams; a stream entered goes on the current
        # device's, and leaves the stack of the device it was entered on.
        device = current_device()
        _stream_stack(device).append(self)
        _entered_devices().append(device)
        return self

    def __exit__(self, *exc) -> bool:
        _stream_stack(_entered_devices().pop()).pop()
        return False

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream) and other.ptr == self.ptr

    def __hash__(self) -> int:
        return hash(self.ptr)

    @property
    def done(self) -> bool:
        return not self._queue.pending

    def synchronize(self) -> None:
        _wait_for(self)

    def launch_host_func(self, callback, arg) -> None:
        _enqueue(self, lambda: callback(arg))

    def record(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        _enqueue(self, event.synchronize)

    def begin_capture(self, mode=None) -> None:
        if self.ptr == 0:
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if self._queue.graph is not None:
            raise CaptureError("cudaErrorIllegalState: the stream is already capturing")
        self._queue.graph = []

    def is_capturing(self) -> bool:
        return self._queue.graph is not None

    def end_capture(self) -> Graph:
        work = self._queue.graph
        if work is None:
            raise CaptureError("cudaErrorIllegalState: the stream is not capturing")
        self._queue.graph = None
        return Graph(work)


Stream.null = Stream(null=True)


class ExternalStream(Stream):
    """A stream handle made elsewhere (torch's), as CuPy wraps one: the handle's queue (0: the legacy null
    stream's), on ``device_id``. Deprecated since CuPy 14, which warns as here (``Stream.from_external``)."""

    def __init__(self, ptr: int, device_id: int = -1) -> None:
        warnings.warn(
            "ExternalStream is deprecated. Use Stream.from_external() instead to interoperate with external "
            "streams that implement the CUDA stream protocol.",
            DeprecationWarning,
            stacklevel=2,
        )
        super().__init__(ptr=ptr)
        self.device_id = device_id


def _stream_stack(device: int) -> list[Stream]:
    """This thread's stack of streams entered on ``device``."""
    stacks = getattr(_local, "streams", None)
    if stacks is None:
        stacks = _local.streams = {}
    return stacks.setdefault(device, [])


def _entered_devices() -> list[int]:
    """The device each stream this thread has entered and not left was entered on, oldest first."""
    devices = getattr(_local, "stream_devices", None)
    if devices is None:
        devices = _local.stream_devices = []
    return devices


def get_current_stream(device_id: int | None = None) -> Stream:
    """The current stream of ``device_id`` (None: the current device), as CuPy keeps one a device."""
    stack = _stream_stack(current_device() if device_id is None else device_id)
    return stack[-1] if stack else Stream.null


class Event:
    """Records the wall time at which its stream reached it."""

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False) -> None:
        self.time: float | None = None
        self._queue: _Queue | None = None
        self._position = 0

    def record(self, stream: Stream | None = None) -> None:
        queue = (stream or get_current_stream())._queue
        if queue.graph is not None:
            raise CaptureError("the CuPy double does not capture event records")
        self.time = None

        def stamp() -> None:
            self.time = time.perf_counter()

        _enqueue(stream, stamp)
        self._queue, self._position = queue, queue.issued

    @property
    def done(self) -> bool:
        return self.time is not None

    def synchronize(self) -> None:
        if self._queue is not None and self._queue.ptr != 0:
            _flush(self._queue, upto=self._position)


def get_elapsed_time(start: Event, end: Event) -> float:
    if start.time is None or end.time is None:
        raise RuntimeError("cudaErrorNotReady: an event has not been reached yet")
    return (end.time - start.time) * 1e3


def set_allocator(allocator=None) -> None:
    """None: no memory pool (CuPy then allocates each array exactly); the double never pools."""
    global _allocator
    _allocator = allocator


def get_allocator():
    return _allocator


def _properties(device: int) -> dict:
    return {"name": b"NumPy double", "major": 0, "minor": 0, "totalGlobalMem": 2**30, "l2CacheSize": L2_BYTES}


runtime = SimpleNamespace(
    getDeviceCount=lambda: 1,
    getDeviceProperties=_properties,
    runtimeGetVersion=lambda: 0,
    driverGetVersion=lambda: 0,
    deviceSynchronize=_synchronize_device,
    pointerGetAttributes=lambda pointer: SimpleNamespace(device=0),
)
