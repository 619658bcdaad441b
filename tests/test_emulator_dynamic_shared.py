"""A block's dynamic shared memory (KP_DYNAMIC_SHARED), from the geometry to the emulator and the GPU launch.

The kernels are tests/kernels/dynamic_shared.cu. On the emulator each block
must get one buffer of exactly the launch's bytes, 1024-byte aligned, seen by
every thread and every declaration, filled with poison at the block's start;
a launch of none must fault when a thread touches it. On the GPU path the
bytes reach CuPy's ``shared_mem``, a launch above what the function allows
raises its limit first (``backends/cupy_launch.launch_function``), and a
launch plan replays with the same bytes.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import sanitized
from double import run_on_double
from kernel_text import kernel_code

from kpool_cupy import emulate
from kpool_cupy.backends import cupy_plans
from kpool_cupy.backends import emulate as emulate_backend
from kpool_cupy.backends.cupy_launch import DEFAULT_SHARED_BYTES, launch_function
from kpool_cupy.emulator.launch import MAX_SHARED_BYTES, launch_code, recording
from kpool_cupy.kernel.geometry import LaunchGeometry, group_geometry

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "tests/kernels/dynamic_shared.cu"
# Block 0 finds the buffer fresh; blocks 1 and 2 would find what the block before wrote, were it not poisoned again.
BLOCKS = 3
THREADS = 256  # 8 warps; each thread owns 64 of the 16384 words
SHARED = 64 * 1024  # more than the 48 KB a GPU launch gets without opting in
WORDS = SHARED // 4  # the kernels' 32-bit words
ALIGN = 1024  # KP_DYNAMIC_SHARED's alignment: wgmma's 128-byte swizzle reads address bits 7-9
TIMEOUT_S = 60  # a guard against a hang: one subprocess here runs in 1 to 3 s (2 busy cores, 2026-12-05)


def _code() -> str:
    return kernel_code(SOURCE, "kpool_portability.h")


def _want(blocks: int = BLOCKS, words: int = WORDS) -> np.ndarray:
    """What each block's kernel wrote: word w of block b holds b * words + w."""
    return (np.arange(blocks)[:, None] * words + np.arange(words)[None, :]).astype(np.uint32)


def _where_differs(got: np.ndarray, want: np.ndarray) -> str:
    differ = np.argwhere(got != want)
    if not differ.size:
        return ""
    block, word = differ[0]
    first = f"got {got[block, word]:#x}, want {want[block, word]:#x}"
    return f"{len(differ)} words differ, first block {block} word {word}: {first}"


def _exchange(shared: int = SHARED, threads: int = THREADS):
    words = shared // 4
    out = np.zeros((BLOCKS, words), np.uint32)
    unpoisoned = np.full((BLOCKS, threads), 7, np.uint32)  # 7: no thread counted yet
    address = np.zeros((BLOCKS, threads, 2), np.uint64)
    with recording() as launches:
        launch_code(
            _code(), "dynamic_shared_exchange", BLOCKS, threads, (out, unpoisoned, address, np.int32(words)), shared
        )
    return out, unpoisoned, address, launches


# Threads run in rank order between waits, or reversed: what a thread finds
# at its block's start must not depend on which thread ran first.
SCHEDULES = pytest.mark.parametrize("schedule", ["", "-DKP_FIBERS_REVERSED"], ids=["in-order", "reversed"])


@SCHEDULES
def test_64_kib_are_one_buffer_a_block_shared_by_its_threads_and_poisoned_at_its_start(monkeypatch, schedule):
    # Every thread reads back words another thread wrote before the barrier,
    # from a second declaration in a device function: one buffer for the
    # block, wherever it is declared. Each thread first finds its own words
    # poisoned, in blocks 1 and 2 too, where the block before wrote them.
    flags = os.environ.get(emulate.FLAGS_VARIABLE, "")
    monkeypatch.setenv(emulate.FLAGS_VARIABLE, f"{flags} {schedule}".strip())
    out, unpoisoned, address, launches = _exchange()
    assert [(launch.cooperative, launch.shared_bytes) for launch in launches] == [(True, SHARED)], launches
    assert not _where_differs(out, _want()), _where_differs(out, _want())
    found = np.argwhere(unpoisoned != 0)
    assert not found.size, (
        f"block {found[0][0]} thread {found[0][1]} found {unpoisoned[tuple(found[0])]} words unpoisoned"
    )
    for block in range(BLOCKS):
        pointers = set(address[block].ravel().tolist())
        assert len(pointers) == 1, f"block {block}: its threads and declarations see {len(pointers)} addresses"
        assert pointers.pop() % ALIGN == 0, f"block {block}: address {address[block, 0, 0]:#x} not 1024-byte aligned"


@pytest.mark.parametrize("fibers", ["plain", "-DKP_FIBERS_ALWAYS"])
def test_threads_that_never_wait_find_their_words_poisoned_in_every_block(monkeypatch, fibers):
    # A kernel that does not cooperate runs one thread after another (the
    # plain loop) or, forced, as fibers: either way thread t of block 1 must
    # find the words thread t of block 0 wrote poisoned again.
    if fibers != "plain":
        flags = os.environ.get(emulate.FLAGS_VARIABLE, "")
        monkeypatch.setenv(emulate.FLAGS_VARIABLE, f"{flags} {fibers}".strip())
    out = np.zeros((BLOCKS, WORDS), np.uint32)
    unpoisoned = np.full((BLOCKS, THREADS), 7, np.uint32)  # 7: no thread counted yet
    with recording() as launches:
        launch_code(_code(), "dynamic_shared_own_words", BLOCKS, THREADS, (out, unpoisoned, np.int32(WORDS)), SHARED)
    assert [(launch.cooperative, launch.shared_bytes) for launch in launches] == [(fibers != "plain", SHARED)]
    assert not _where_differs(out, _want()), _where_differs(out, _want())
    found = np.argwhere(unpoisoned != 0)
    assert not found.size, (
        f"block {found[0][0]} thread {found[0][1]} found {unpoisoned[tuple(found[0])]} words unpoisoned"
    )


def test_an_odd_size_and_a_one_thread_block_are_exact():
    # 4 bytes (one word, one thread: it reads back its own) and 1028 bytes
    # (257 words over 256 threads, thread 0 owning two): sizes that are no
    # multiple of the alignment get the same buffer rules.
    for shared, threads in ((4, 1), (1028, THREADS)):
        out, unpoisoned, address, _ = _exchange(shared, threads)
        assert not _where_differs(out, _want(BLOCKS, shared // 4)), (
            shared,
            _where_differs(out, _want(BLOCKS, shared // 4)),
        )
        assert not unpoisoned.any() and not (address % ALIGN).any(), shared


_TOUCH = textwrap.dedent(
    """
    import sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    from test_emulator_dynamic_shared import _code
    from kpool_cupy.emulator.launch import launch_code
    out = np.zeros(1, np.uint8)
    launch_code(_code(), "dynamic_shared_touch", 1, 32, (out, np.int32({offset}), np.int32({touch})), {shared})
    print("returned", out[0])
    """
)


def _touch(offset: int, shared: int, touch: int = 1, env: dict[str, str] | None = None):
    script = _TOUCH.format(tests=str(ROOT / "tests"), offset=offset, touch=touch, shared=shared)
    environment = env or {**os.environ, "PYTHONPATH": str(ROOT)}
    # A hang would be the bug: the timeout turns it into a failure.
    return subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=TIMEOUT_S
    )


def test_touching_the_dynamic_shared_memory_of_a_launch_without_any_faults():
    # A launch of 0 bytes: the declaration is fine, as on a GPU, but a read
    # hits a page nobody may touch and the process dies by SIGSEGV (an
    # illegal address on a GPU), in any build.
    declared = _touch(0, 0, touch=0)
    assert declared.returncode == 0 and "returned 0" in declared.stdout, declared.stderr[-3000:]
    touched = _touch(0, 0)
    assert touched.returncode != 0 and "returned" not in touched.stdout, touched.stdout
    assert touched.returncode == -signal.SIGSEGV or "AddressSanitizer: SEGV" in touched.stderr, touched.stderr[-3000:]


def test_the_last_byte_is_there_and_reads_as_poison():
    # 100 bytes (no multiple of the 1024-byte alignment): byte 99 exists and
    # holds the poison byte 0xff (255) at the block's start.
    done = _touch(99, 100)
    assert done.returncode == 0 and "returned 255" in done.stdout, done.stdout + done.stderr[-3000:]


@pytest.mark.parametrize("shared", [-1, MAX_SHARED_BYTES + 1])
def test_a_size_no_gpu_launches_is_refused_before_the_build(shared):
    # 227 KiB is the most any GPU gives a block (sm_90, sm_100); a kernel
    # that needs more would pass here and fail on every GPU.
    with pytest.raises(ValueError, match=rf"Invalid shared_bytes: expected 0 to {MAX_SHARED_BYTES} .* got {shared}"):
        launch_code("not C++: the check comes first", "k", 1, 32, (), shared)


def test_the_largest_size_a_gpu_gives_runs():
    # 227 KiB exactly, the byte at its end read back as poison (255).
    done = _touch(MAX_SHARED_BYTES - 1, MAX_SHARED_BYTES)
    assert done.returncode == 0 and "returned 255" in done.stdout, done.stdout + done.stderr[-3000:]


def test_a_geometry_asks_for_no_dynamic_shared_memory_unless_told():
    # Every kernel before KP_DYNAMIC_SHARED launches with 0 bytes, and the
    # geometry rules still build their geometries without naming it.
    assert LaunchGeometry(grid=2, block=64, items=2).shared_bytes == 0
    assert group_geometry(128, 40).shared_bytes == 0  # head_dim 128, 40 pools
    assert LaunchGeometry(grid=2, block=64, items=2, shared_bytes=SHARED).shared_bytes == SHARED


def test_the_emulate_backend_hands_the_geometrys_bytes_to_the_emulator(monkeypatch):
    calls = []
    monkeypatch.setattr(emulate_backend.emulator, "launch", lambda *args: calls.append(args))
    geometry = LaunchGeometry(grid=3, block=256, items=3, shared_bytes=SHARED)
    launch = SimpleNamespace(kernel=SimpleNamespace(source="k.cu"), instance="k<1>", geometry=geometry, arguments=())
    emulate_backend.EmulateBackend().launch(launch)
    assert calls == [("k.cu", "k<1>", 3, 256, (), SHARED)], calls


class FakeFunction:
    """CuPy's RawKernel as launch_function sees it: the attribute (starting where CUDA starts it: 48 KB less the
    kernel's static shared memory) and the call, each use recorded in order."""

    def __init__(self, static_bytes: int = 0, limit: int | None = None) -> None:
        self._limit = DEFAULT_SHARED_BYTES - static_bytes if limit is None else limit
        self.events: list[tuple] = []

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        self.events.append(("read",))
        return self._limit

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        self.events.append(("set", value))
        self._limit = value

    def __call__(self, grid, block, args, *, shared_mem=0) -> None:  # keyword-only, as RawKernel documents it
        self.events.append(("launch", grid, block, args, shared_mem))


def _launched(function: FakeFunction, shared: int) -> list[tuple]:
    launch_function(function, LaunchGeometry(grid=3, block=256, items=3, shared_bytes=shared), ("a", 1))
    return function.events


@pytest.mark.parametrize(
    ("shared", "static", "limit", "want_set"),
    [
        (0, 0, None, None),  # no dynamic shared memory: the attribute is not even read
        (4096, 0, None, None),  # 4 KB: within the 48 KB every function allows
        (DEFAULT_SHARED_BYTES, 0, None, None),  # 48 KB exactly: still allowed
        (DEFAULT_SHARED_BYTES + 16, 0, None, DEFAULT_SHARED_BYTES + 16),  # 16 bytes over 48 KB: opted in
        (SHARED, 0, None, SHARED),  # 64 KB, the tests' size
        (16 * 1024, 36 * 1024, None, 16 * 1024),  # 16 KB beside 36 KB static (the scorer's stage): over 48 KB
        (SHARED, 0, 100 * 1024, None),  # a function already raised to 100 KB is never lowered to 64 KB
    ],
)
def test_a_launch_raises_the_functions_limit_only_above_what_it_allows(shared, static, limit, want_set):
    # In order: the limit read (only with dynamic shared memory), raised
    # where it must be, and then the one launch with the geometry's bytes.
    want = [("read",)] if shared > 0 else []
    want += [] if want_set is None else [("set", want_set)]
    want += [("launch", (3,), (256,), ("a", 1), shared)]
    assert _launched(FakeFunction(static, limit), shared) == want


class FakeArray:
    """What a plan reads of a CuPy array: its device address, shape, strides and item size."""

    def __init__(self, ptr: int, n: int) -> None:
        self.data = SimpleNamespace(ptr=ptr)
        self.shape, self.strides, self.itemsize, self.ndim = (n,), (4,), 4, 1


def test_a_plan_replays_with_its_launchs_dynamic_shared_memory():
    # The replay launches the function its full call opted in, with the same
    # shared_mem: without it a 64 KB kernel would get no dynamic shared
    # memory at all (an illegal address at its first touch).
    function = FakeFunction()
    made = (FakeArray(0x10000, 64), FakeArray(0x20000, 64))  # 64 words each, 64 KiB apart: no overlap
    geometry = LaunchGeometry(grid=3, block=256, items=3, shared_bytes=SHARED)
    launch = SimpleNamespace(arguments=(made[0], made[1], np.int32(WORDS)), geometry=geometry)
    plan = cupy_plans.make_plan(made, (False, True), launch, function, 0, made[1])
    assert plan is not None and plan.shared_bytes == SHARED
    cupy = SimpleNamespace(cuda=SimpleNamespace(Device=lambda device_id: contextlib.nullcontext()))
    key = ("dynamic shared memory test",)
    cupy_plans.remember(key, plan)
    try:
        again = (FakeArray(0x30000, 64), FakeArray(0x40000, 64))  # new addresses, the same signature
        assert cupy_plans.replay(key, again, cupy) is again[1]
    finally:
        cupy_plans.forget_all()
    assert function.events == [("launch", (3,), (256,), (again[0], again[1], np.int32(WORDS)), SHARED)]


_ON_THE_DOUBLE = textwrap.dedent(
    """
    import sys
    from types import SimpleNamespace
    import numpy as np, cupy
    sys.path.insert(0, "tests")
    from test_emulator_dynamic_shared import BLOCKS, SHARED, THREADS, WORDS, _code, _want
    from kpool_cupy.backends import cupy_plans
    from kpool_cupy.backends.cupy_launch import launch_function
    from kpool_cupy.kernel.geometry import LaunchGeometry

    geometry = LaunchGeometry(grid=BLOCKS, block=THREADS, items=BLOCKS, shared_bytes=SHARED)

    def arrays():
        return (cupy.zeros((BLOCKS, WORDS), np.uint32), cupy.full((BLOCKS, THREADS), 7, np.uint32),
                cupy.zeros((BLOCKS, THREADS, 2), np.uint64))

    # The double fails a 64 KB launch without the opt-in, as CUDA does.
    bare = cupy.RawModule(code=_code()).get_function("dynamic_shared_exchange")
    try:
        bare((BLOCKS,), (THREADS,), (*arrays(), np.int32(WORDS)), shared_mem=SHARED)
    except RuntimeError as error:
        assert "CUDA_ERROR_INVALID_VALUE" in str(error), error
    else:
        raise AssertionError("a 64 KB launch without the opt-in ran")

    function = cupy.RawModule(code=_code()).get_function("dynamic_shared_exchange")
    first = arrays()
    launch_function(function, geometry, (*first, np.int32(WORDS)))
    assert function.max_dynamic_shared_size_bytes == SHARED
    assert (cupy.asnumpy(first[0]) == _want()).all() and not cupy.asnumpy(first[1]).any()

    # The plan of that launch, replayed on new arrays: the same bits.
    launch = SimpleNamespace(arguments=(*first, np.int32(WORDS)), geometry=geometry)
    plan = cupy_plans.make_plan(first, (True, True, True), launch, function, 0, first)
    cupy_plans.remember(("on the double",), plan)
    second = arrays()
    replayed = cupy_plans.replay(("on the double",), second, cupy)
    assert all(got is made for got, made in zip(replayed, second, strict=True))
    assert (cupy.asnumpy(second[0]) == _want()).all() and not cupy.asnumpy(second[1]).any()
    print("ok")
    """
)


def test_on_the_cupy_double_the_launch_helper_and_a_plan_run_a_64_kib_kernel():
    # CuPy's calls, with the double standing in (it runs the kernel on the
    # emulator with shared_mem as its dynamic shared memory and refuses a
    # launch over the function's limit, as CUDA does).
    done = run_on_double(_ON_THE_DOUBLE, timeout=TIMEOUT_S)
    assert done.returncode == 0 and "ok" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]


def test_nvrtc_declares_every_name_extern_shared_1024_byte_aligned():
    # The device spelling: one `.extern .shared .align 1024` array a
    # declaration (the kernel's and its helper's), and ptxas takes it.
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="NVRTC comes with the cuda12 extra")
    from kpool_cupy.kernel.nvrtc import code_ptx, code_ptxas_report

    ptx = code_ptx(_code(), "dynamic_shared_exchange")
    declared = re.findall(r"\.extern \.shared [^;]*;", ptx)
    assert sorted(declared) == [
        ".extern .shared .align 1024 .b8 block_bytes[];",
        ".extern .shared .align 1024 .b8 helper_bytes[];",
    ], declared
    assert code_ptxas_report(_code(), "dynamic_shared_exchange").shared_bytes == 0  # none of it static


@pytest.mark.slow
def test_address_sanitizer_sees_a_read_past_the_launchs_bytes():
    # The buffer is exactly the launch's bytes, so a read one byte past 100
    # is a heap-buffer-overflow; a touch of a 0-byte launch is a SEGV the
    # sanitizer reports; a right kernel runs clean.
    libasan = sanitized.libasan()
    if libasan is None:
        pytest.skip("the host compiler has no AddressSanitizer runtime")
    script = _TOUCH.format(tests=str(ROOT / "tests"), offset=99, touch=1, shared=100)
    inside = sanitized.run(script, libasan, timeout=TIMEOUT_S)
    assert inside.returncode == 0 and "returned 255" in inside.stdout, inside.stdout + inside.stderr[-3000:]
    sanitized.assert_instrumented(inside.stdout)  # control: the kernel that ran carries the sanitizer
    env = sanitized.environment(libasan)
    past = _touch(100, 100, env=env)
    assert "AddressSanitizer: heap-buffer-overflow" in past.stderr, past.stderr[-3000:]
    # Older runtimes say "to the right of", newer ones "after".
    assert re.search(r"0 bytes (to the right of|after) 100-byte region", past.stderr), past.stderr[-3000:]
    none = _touch(0, 0, env=env)
    assert "AddressSanitizer: SEGV" in none.stderr, none.stderr[-3000:]


@pytest.mark.gpu
def test_gpu_64_kib_of_dynamic_shared_memory_after_the_opt_in():
    # On a GPU (or the double): the same kernel and check as on the
    # emulator, launched through launch_function; the same launch on a fresh
    # module without the opt-in fails. What a thread finds at its block's
    # start is undefined there, so unpoisoned is not read.
    import cupy

    from kpool_cupy.kernel.sources import NVRTC_OPTIONS

    function = cupy.RawModule(code=_code(), options=NVRTC_OPTIONS).get_function("dynamic_shared_exchange")
    out = cupy.zeros((BLOCKS, WORDS), np.uint32)
    unpoisoned = cupy.zeros((BLOCKS, THREADS), np.uint32)
    address = cupy.zeros((BLOCKS, THREADS, 2), np.uint64)
    geometry = LaunchGeometry(grid=BLOCKS, block=THREADS, items=BLOCKS, shared_bytes=SHARED)
    launch_function(function, geometry, (out, unpoisoned, address, np.int32(WORDS)))
    got, where = cupy.asnumpy(out), cupy.asnumpy(address)
    assert not _where_differs(got, _want()), _where_differs(got, _want())
    assert all(len(set(where[block].ravel().tolist())) == 1 for block in range(BLOCKS))
    assert not (where % ALIGN).any(), where[:, 0, 0]
    # Another text is another module, whose function has its default limit.
    fresh = cupy.RawModule(code=_code() + "\n// a fresh module\n", options=NVRTC_OPTIONS)
    kernel = fresh.get_function("dynamic_shared_exchange")
    # The launch fails (CuPy's CUDADriverError is a RuntimeError); the module compiled above, so nothing else can.
    with pytest.raises(RuntimeError):
        kernel((BLOCKS,), (THREADS,), (out, unpoisoned, address, np.int32(WORDS)), shared_mem=SHARED)
        cupy.cuda.Device().synchronize()
