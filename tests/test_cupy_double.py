"""The CuPy double's streams and graphs behave like CUDA's where the GPU tests depend on it.

tests/test_gpu.py's stream and graph tests can only fail on the double if
the double defers work the way a GPU may: a non-default stream runs its work
when something waits for it, a capture records without running, a replay
reads memory as it is then. Each property is checked here with copies (no
kernel to compile) in a subprocess that imports the double as ``cupy``.
"""

from __future__ import annotations

import textwrap

import pytest
from double import run_on_double

TIMEOUT_S = 60  # a guard against a hang; one script ran in 0.14 to 2.8 s (two busy cores, 2026-12-03)

_PRELUDE = """
import numpy as np
import cupy
from cupy import cuda

assert cupy.__version__.endswith("numpy-double"), cupy.__file__


def copy_pair(n=8):
    source = cupy.arange(n, dtype=cupy.uint8) + 1
    target = cupy.zeros(n, dtype=cupy.uint8)
    return source, target


def copy(target, source, stream=None):
    target.data.copy_from_device_async(source.data, source.nbytes, stream)


def host(array):
    return array.view(np.ndarray).tolist()  # reads memory as it is, waiting for nothing
"""


def _run(body: str) -> None:
    done = run_on_double(_PRELUDE + textwrap.dedent(body) + "\nprint('ok')\n", timeout=TIMEOUT_S)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-3000:]


def test_a_non_default_stream_runs_its_work_when_waited_for():
    _run(
        """
        source, target = copy_pair()
        stream = cuda.Stream(non_blocking=True)
        copy(target, source, stream)
        assert host(target) == [0] * 8 and not stream.done  # queued
        cuda.Stream.null.synchronize()  # the null stream does not wait for a non-blocking one
        (target + 0).sum()  # nor does an array operation on the null stream
        assert host(target) == [0] * 8
        stream.synchronize()
        assert host(target) == list(range(1, 9)) and stream.done
        """
    )


def test_an_event_waits_for_its_stream_up_to_the_event_only():
    _run(
        """
        source, target = copy_pair()
        other = cupy.zeros(8, dtype=cupy.uint8)
        stream = cuda.Stream(non_blocking=True)
        copy(target, source, stream)
        event = stream.record()
        copy(other, source, stream)
        assert not event.done
        event.synchronize()
        assert host(target) == list(range(1, 9)) and host(other) == [0] * 8
        """
    )


def test_null_stream_work_waits_for_blocking_streams():
    _run(
        """
        source, target = copy_pair()
        blocking = cuda.Stream()
        copy(target, source, blocking)
        assert host(target) == [0] * 8
        assert int((target + 0).sum()) == 36  # legacy null-stream semantics: blocking streams drain first
        """
    )


def test_an_array_operation_waits_for_its_current_stream():
    _run(
        """
        source, target = copy_pair()
        stream = cuda.Stream(non_blocking=True)
        copy(target, source, stream)
        with stream:
            assert int(target.sum()) == 36
        """
    )


def test_host_functions_run_in_stream_order():
    _run(
        """
        source, target = copy_pair()
        stream = cuda.Stream(non_blocking=True)
        seen = []
        stream.launch_host_func(lambda _: seen.append(host(target)), None)
        copy(target, source, stream)
        stream.launch_host_func(lambda _: seen.append(host(target)), None)
        assert seen == []
        stream.synchronize()
        assert seen == [[0] * 8, list(range(1, 9))]
        """
    )


def test_a_capture_records_without_running_and_a_replay_reads_memory_as_it_is():
    _run(
        """
        source, target = copy_pair()
        stream = cuda.Stream(non_blocking=True)
        stream.begin_capture()
        assert stream.is_capturing()
        with stream:
            copy(target, source)
        graph = stream.end_capture()
        cuda.Device().synchronize()
        assert host(target) == [0] * 8  # recorded, not run
        graph.launch(stream)
        assert host(target) == [0] * 8  # queued on the stream
        stream.synchronize()
        assert host(target) == list(range(1, 9))
        source[...] = 5
        graph.launch(stream)
        stream.synchronize()
        assert host(target) == [5] * 8
        """
    )


def test_waiting_for_a_capturing_stream_or_computing_on_it_raises():
    _run(
        """
        stream = cuda.Stream(non_blocking=True)
        a = cupy.zeros(4, dtype=cupy.float32)
        stream.begin_capture()
        for name, attempt in [
            ("synchronize", stream.synchronize),
            ("device synchronize", cuda.Device().synchronize),
            ("array operation", lambda: (stream.__enter__(), a + 1)),
        ]:
            try:
                attempt()
            except cuda.CaptureError:
                pass
            else:
                raise AssertionError(f"{name} during a capture was allowed")
            finally:
                if name == "array operation":
                    stream.__exit__(None, None, None)
        stream.end_capture()
        stream.synchronize()
        blocking = cuda.Stream()
        blocking.begin_capture()
        try:
            a + 1  # null-stream work would wait for a capturing blocking stream
        except cuda.CaptureError:
            pass
        else:
            raise AssertionError("null-stream work during a blocking stream's capture was allowed")
        blocking.end_capture()
        """
    )


@pytest.mark.slow
def test_each_device_keeps_its_own_current_stream():
    # CuPy keeps a thread's current streams a device (cupy/cuda/stream.pyx's _ThreadLocal: a list of streams and a
    # stack a device): a stream entered while device 0 is current is not device 1's current stream.
    _run(
        """
        zero = cuda.Stream(non_blocking=True)
        with zero:
            assert cuda.get_current_stream() == zero
            with cuda.Device(1):
                assert cuda.get_current_stream() == cuda.Stream.null
                one = cuda.Stream(non_blocking=True)
                with one:
                    assert cuda.get_current_stream() == one
                    assert cuda.get_current_stream(0) == zero
                assert cuda.get_current_stream() == cuda.Stream.null
            assert cuda.get_current_stream() == zero
            assert cuda.get_current_stream(1) == cuda.Stream.null
        assert cuda.get_current_stream() == cuda.Stream.null
        """
    )


def test_the_launch_log_names_the_stream_each_kernel_went_to():
    _run(
        """
        import sys
        sys.path.insert(0, "tests")
        from model import make_batch, standard_lengths
        import kpool_cupy

        batch = make_batch(*standard_lengths(4), seed=1)
        args = [cupy.asarray(a) for a in batch.args()]
        stream = cuda.Stream(non_blocking=True)
        kpool_cupy.kpool_compress(*args, stream=stream)
        name, ptr, fate = cuda.launch_log[-1]
        assert name.startswith("kpool_compress") and ptr == stream.ptr and fate == "queued", cuda.launch_log[-1]
        kpool_cupy.kpool_compress(*args)
        assert cuda.launch_log[-1][1:] == (0, "ran"), cuda.launch_log[-1]
        """
    )


def test_set_allocator_and_used_bytes():
    _run(
        """
        pool = cupy.get_default_memory_pool()
        cuda.set_allocator(None)
        assert cuda.get_allocator() is None
        used = pool.used_bytes()
        a = cupy.zeros(1000, dtype=cupy.float32)
        assert pool.used_bytes() == used + 4000
        b = a + 1  # an operation's result is an allocation too
        assert pool.used_bytes() == used + 8000
        b[...] = a  # writing into an array is not
        assert pool.used_bytes() == used + 8000
        """
    )
