"""cupy.cuda for the double: one device, streams that run (or, capturing, record) launches in order."""

from __future__ import annotations

import time
from types import SimpleNamespace

_recording: list | None = None


def _launch(run) -> None:
    if _recording is not None:
        _recording.append(run)
    else:
        run()


class Device:
    def __init__(self, device: int | None = None) -> None:
        self.id = 0 if device is None else int(device)

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc) -> bool:
        return False


class Graph:
    def __init__(self, launches: list) -> None:
        self.launches = launches

    def launch(self, stream=None) -> None:
        for run in self.launches:
            run()


class Stream:
    null = None

    def __init__(self, null: bool = False, non_blocking: bool = False, ptr: int = 0) -> None:
        self.ptr = ptr or id(self)

    @classmethod
    def from_external(cls, obj) -> Stream:
        return cls(ptr=int(obj.__cuda_stream__()[1]))

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def synchronize(self) -> None:
        pass

    def begin_capture(self, mode=None) -> None:
        global _recording
        _recording = []

    def end_capture(self) -> Graph:
        global _recording
        graph, _recording = Graph(_recording or []), None
        return graph


_current = Stream()


def get_current_stream() -> Stream:
    return _current


class Event:
    def __init__(self, *args, **kwargs) -> None:
        self.time = 0.0

    def record(self, stream=None) -> None:
        self.time = time.perf_counter()

    def synchronize(self) -> None:
        pass


def get_elapsed_time(start: Event, end: Event) -> float:
    return (end.time - start.time) * 1e3


def _properties(device: int) -> dict:
    return {"name": b"NumPy double", "major": 0, "minor": 0, "totalGlobalMem": 2**30, "l2CacheSize": 2**20}


runtime = SimpleNamespace(
    getDeviceCount=lambda: 1,
    getDeviceProperties=_properties,
    runtimeGetVersion=lambda: 0,
    driverGetVersion=lambda: 0,
    pointerGetAttributes=lambda pointer: SimpleNamespace(device=0),
)
