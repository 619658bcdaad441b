"""Ampere's asynchronous copies (cp.async) on the emulator, and their device wrappers compiled for sm_80 and sm_90a.

The kernels are tests/kernels/cp_async.cu: a block of 128 threads reads its
tiles through a three-stage ring in shared memory, copying each tile two
ahead (16-byte rows into the dynamic shared memory, 4-byte scales into a
static __shared__ array) and waiting with wait_group 1 and a barrier before
it reads another thread's row. The emulator (kernels/emulator/kpool_cp_async.h)
must give exactly the sums a NumPy model gives, under either fiber order and
whether copies land at their wait or at issue; land zeros and read nothing
for a copy with read false; defer every copy to the wait that completes its
group, so a kernel that reads too early reads poison; and refuse each misuse
with where it happened.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import sanitized
from kernel_text import kernel_code, line_of, probe_build

from kpool_cupy import emulate
from kpool_cupy.emulator.launch import launch_code, recording

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "tests/kernels/cp_async.cu"
THREADS = 128  # the ring's block: one 16-byte row and one scale a thread a tile
STAGES = 3
SHARED = STAGES * THREADS * 16  # the ring's dynamic shared memory: its keys
# tests/kernels/cp_async.cu's Misuse values.
MISUSE = {
    "none": 0,
    "wait_too_little": 1,
    "no_barrier": 2,
    "leave": 3,
    "leave_uncommitted": 4,
    "misaligned_dst": 5,
    "misaligned_src": 6,
    "global_dst": 7,
    "write_dst": 8,
    "write_src": 9,
    "same_dst": 10,
}
# Tiles 3 and 4 are missing (their copies read nothing and land zeros); 7
# tiles turn the ring more than twice, the missing ones in two stages.
PRESENT = (1, 1, 1, 0, 0, 1, 1)
BLOCKS = 3
TIMEOUT_S = 60  # a guard against a hang: a subprocess here runs in 1 to 3 s, its build included
# Copies land at their wait (the emulator's default), under the reversed
# fiber order, or at issue (what a GPU whose copies finish at once shows).
SCHEDULES = {"deferred": "", "reversed": "-DKP_FIBERS_REVERSED", "eager": "-DKP_CP_ASYNC_EAGER"}


def _code() -> str:
    return kernel_code(SOURCE, "kpool_portability.h", "kpool_cp_async.cuh")


def _line(text: str) -> int:
    return line_of(SOURCE, text)


def _inputs(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """keys [blocks][tiles][128][4] and scales [blocks][tiles][128], random uint32 words, and present [tiles]."""
    rng = np.random.default_rng(seed)
    tiles = len(PRESENT)
    keys = rng.integers(0, 2**32, (BLOCKS, tiles, THREADS, 4), dtype=np.uint64).astype(np.uint32)
    scales = rng.integers(0, 2**32, (BLOCKS, tiles, THREADS), dtype=np.uint64).astype(np.uint32)
    return keys, scales, np.array(PRESENT, np.int32)


def _model(keys: np.ndarray, scales: np.ndarray, present: np.ndarray) -> np.ndarray:
    """out[block][t]: over tiles i, acc = acc * 31 + (k0 ^ k1) + k2 + k3 * s in uint32, (k, s) tile i's row and
    scale (t + 1) % 128, zeros where the tile is missing."""
    k, s = keys.astype(np.uint64), scales.astype(np.uint64)
    acc = np.zeros((keys.shape[0], THREADS), np.uint64)
    for i, here in enumerate(present):
        kk = np.roll(k[:, i], -1, axis=1) * np.uint64(here)
        ss = np.roll(s[:, i], -1, axis=1) * np.uint64(here)
        acc = (acc * np.uint64(31) + (kk[..., 0] ^ kk[..., 1]) + kk[..., 2] + kk[..., 3] * ss) & np.uint64(0xFFFFFFFF)
    return acc.astype(np.uint32)


def _ring(keys: np.ndarray, scales: np.ndarray, present: np.ndarray, misuse: str = "none") -> np.ndarray:
    out = np.zeros((keys.shape[0], THREADS), np.uint32)
    args = (keys, scales, present, out, np.int32(len(present)), np.int32(MISUSE[misuse]))
    with recording() as launches:
        launch_code(_code(), "cp_async_ring", keys.shape[0], THREADS, args, SHARED)
    assert [launch.cooperative for launch in launches] == [True], launches
    # Every 16-byte copy that reads counts as a 16-byte access; zero-filled ones read nothing.
    assert launches[0].vector_accesses == keys.shape[0] * THREADS * int(present.sum()), launches
    return out


def _differs(got: np.ndarray, want: np.ndarray) -> str:
    """Empty when equal; else how many sums differ and the first (block, thread), got and want."""
    differ = np.argwhere(got != want)
    if not differ.size:
        return ""
    b, t = differ[0]
    return f"{len(differ)} sums differ, first block {b} thread {t}: got {got[b, t]:#x}, want {want[b, t]:#x}"


@pytest.mark.parametrize("schedule", list(SCHEDULES), ids=list(SCHEDULES))
def test_the_ring_gives_the_sums(monkeypatch, schedule):
    # Each thread reads the row and scale another thread copied, tile after
    # tile, through three stages; three blocks (the copies' state is per
    # block; each finds the dynamic shared memory poisoned again). Exact:
    # integer sums, so a row read from the wrong stage, a tile read before
    # its copies landed (poison) or a missing tile that is not zeros changes
    # a sum. The scales' __shared__ array is a static of an inline function,
    # one process-wide symbol (STB_GNU_UNIQUE) across the three builds: run
    # together, the later builds copy into the first one's thread-local
    # block, which the destination check must take for shared memory.
    flags = os.environ.get(emulate.FLAGS_VARIABLE, "")
    monkeypatch.setenv(emulate.FLAGS_VARIABLE, f"{flags} {SCHEDULES[schedule]}".strip())
    keys, scales, present = _inputs()
    problem = _differs(_ring(keys, scales, present), _model(keys, scales, present))
    assert not problem, problem


@pytest.mark.parametrize("schedule", list(SCHEDULES), ids=list(SCHEDULES))
def test_wait_group_completes_all_but_the_newest_groups(monkeypatch, schedule):
    # Per thread: wait_group N completes the groups older than the N newest,
    # an uncommitted copy is not completed by wait_group 0, and an empty
    # group counts as one. Bit j of each record: slot j holds its row. With
    # copies landing at issue every copy issued so far has landed.
    flags = os.environ.get(emulate.FLAGS_VARIABLE, "")
    monkeypatch.setenv(emulate.FLAGS_VARIABLE, f"{flags} {SCHEDULES[schedule]}".strip())
    rng = np.random.default_rng(1)
    rows = rng.integers(1, 2**32, (32, 5, 4), dtype=np.uint64).astype(np.uint32)
    observed = np.zeros((32, 5), np.uint32)
    launch_code(_code(), "cp_async_groups", 1, 32, (rows, observed))
    want = [0b1111, 0b1111, 0b1111, 0b11111, 0b11111] if schedule == "eager" else [0b1, 0b11, 0b111, 0b1111, 0b11111]
    assert observed.tolist() == [want] * 32, [bin(x) for x in observed[0]]


@pytest.mark.parametrize("schedule", list(SCHEDULES), ids=list(SCHEDULES))
def test_reading_before_the_wait_completes_reads_poison(monkeypatch, schedule):
    # wait_group 2 where 1 is needed: tile i's copies are still in flight
    # when the block reads them. The deferred copies show it in either fiber
    # order; copies that land at issue hide it, as a fast GPU may.
    flags = os.environ.get(emulate.FLAGS_VARIABLE, "")
    monkeypatch.setenv(emulate.FLAGS_VARIABLE, f"{flags} {SCHEDULES[schedule]}".strip())
    keys, scales, present = _inputs()
    problem = _differs(_ring(keys, scales, present, "wait_too_little"), _model(keys, scales, present))
    if schedule == "eager":
        assert not problem, problem
    else:
        assert problem, "reading tiles whose copies are in flight gave the right sums"


@pytest.mark.parametrize("schedule", list(SCHEDULES), ids=list(SCHEDULES))
def test_reading_another_threads_copy_without_the_barrier_fails(monkeypatch, schedule):
    # A thread's wait makes its own copies visible to itself only: without
    # the barrier its neighbour reads the row before the copying thread has
    # waited, in any order and however early copies land.
    flags = os.environ.get(emulate.FLAGS_VARIABLE, "")
    monkeypatch.setenv(emulate.FLAGS_VARIABLE, f"{flags} {SCHEDULES[schedule]}".strip())
    keys, scales, present = _inputs()
    problem = _differs(_ring(keys, scales, present, "no_barrier"), _model(keys, scales, present))
    assert problem, "reading another thread's copies without a barrier gave the right sums"


def _guarded(shape: tuple[int, ...]) -> np.ndarray:
    """A uint32 array whose last byte is the last before a page no one may touch: a read one past its end faults."""
    nbytes = int(np.prod(shape)) * 4
    page = mmap.PAGESIZE
    span = -(-nbytes // page) * page
    region = mmap.mmap(-1, span + page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    if libc.mprotect(base + span, page, 0) != 0:  # PROT_NONE
        raise OSError(ctypes.get_errno(), "mprotect")
    return np.frombuffer(region, np.uint32, nbytes // 4, span - nbytes).reshape(shape)


_GUARDED_RUN = textwrap.dedent(
    """
    import sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    from test_emulator_cp_async import _guarded, _inputs, _model, _ring, _differs
    keys, scales, present = _inputs()
    guarded_keys, guarded_scales = _guarded(keys.shape), _guarded(scales.shape)
    guarded_keys[...] = keys
    guarded_scales[...] = scales
    {body}
    """
)


def _run_guarded(body: str) -> subprocess.CompletedProcess[str]:
    script = _GUARDED_RUN.format(tests=str(ROOT / "tests"), body=body)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_a_copy_with_read_false_reads_nothing():
    # The missing tiles' copies name one past the keys' and the scales' ends,
    # where a page without access begins: any read there faults. In a
    # subprocess, so a read is a failed test, not a crashed run.
    done = _run_guarded(
        "print('problem:', repr(_differs(_ring(guarded_keys, guarded_scales, present), _model(keys, scales, present))))"
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "problem: ''" in done.stdout, done.stdout


def test_the_guard_page_faults():
    # Control: the byte one past the guarded array's end cannot be read.
    done = _run_guarded("import ctypes; ctypes.string_at(guarded_keys.ctypes.data + guarded_keys.nbytes, 1)")
    assert done.returncode == -signal.SIGSEGV, done.stdout + done.stderr[-3000:]


_SANITIZED_RING = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from test_emulator_cp_async import _differs, _inputs, _model, _ring
    keys, scales, present = _inputs()
    print("problem:", repr(_differs(_ring(keys, scales, present), _model(keys, scales, present))))
    """
)


def test_address_sanitizer_sees_no_access_outside_the_arrays():
    # The ring under AddressSanitizer: its missing tiles name one past the
    # ends of two heap arrays, the fibers switch at every barrier, and the
    # copies' bookkeeping (vectors, the thread-local blocks' list) runs on
    # the fibers' stacks.
    libasan = sanitized.libasan()
    if libasan is None:
        pytest.skip("the host compiler has no AddressSanitizer runtime")
    done = sanitized.run(_SANITIZED_RING.format(tests=str(ROOT / "tests")), libasan)
    assert "AddressSanitizer" not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 0 and "problem: ''" in done.stdout, done.stdout + done.stderr[-4000:]
    sanitized.assert_instrumented(done.stdout)


_FAILING = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from test_emulator_cp_async import _inputs, _ring
    keys, scales, present = _inputs()
    _ring(keys[:1], scales[:1], present, {misuse!r})
    print("returned")
    """
)


def _run_failing(misuse: str, flags: str = "") -> str:
    script = _FAILING.format(tests=str(ROOT / "tests"), misuse=misuse)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env[emulate.FLAGS_VARIABLE] = f"{env.get(emulate.FLAGS_VARIABLE, '')} {flags}".strip()
    # A hang would be the bug: the timeout (ten times a normal run) turns it into a failure.
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode != 0 and "returned" not in done.stdout, done.stdout + done.stderr[-3000:]
    return done.stderr


def test_the_misuse_kernel_runs_when_used_right():
    # The refusals below come from the misuse, not from the kernel around it.
    keys, scales, present = _inputs()
    problem = _differs(_ring(keys[:1], scales[:1], present), _model(keys[:1], scales[:1], present))
    assert not problem, problem


# Where tests/kernels/cp_async.cu issues each copy and waits.
ROW_COPY = "kp_cp_async16(dst, src, read);"
SECOND_COPY = "kp_cp_async16(dst, src, read);  // the same bytes, in a second group"
RING_WAIT = "kp_cp_async_wait<kStages - 2>();  // tile i's group has landed"
EXTRA_COPY = "kp_cp_async16(keys_ring + t * kRowWords, keys + t * kRowWords, true);"


@pytest.mark.parametrize(
    ("misuse", "where"),
    [("leave", "committed, its group not waited for"), ("leave_uncommitted", "never committed")],
)
def test_a_thread_that_leaves_with_copies_in_flight_is_refused(misuse, where):
    # Thread 5 issues one more copy and leaves: committed and not waited for,
    # or not committed at all, which the wait_group 0 before its exit does
    # not complete.
    stderr = _run_failing(misuse)
    want = (
        f"thread 5 of block (0, 0, 0) left the kernel with cp.async copies in flight (1, the first issued at "
        f"{SOURCE}:{_line(EXTRA_COPY)}, {where})"
    )
    assert want in stderr, stderr


@pytest.mark.parametrize("misuse", ["misaligned_dst", "misaligned_src"])
def test_a_misaligned_copy_is_refused(misuse):
    stderr = _run_failing(misuse)
    want = rf"{SOURCE}:{_line(ROW_COPY)}: cp\.async\.cg\.shared\.global \(16 bytes\): thread 7 of block \(0, 0, 0\): "
    want += r"destination 0x[0-9a-f]+ and source 0x[0-9a-f]+ must both be aligned to 16 bytes"
    assert re.search(want, stderr), stderr


def test_a_destination_outside_shared_memory_is_refused():
    # Thread 7 copies into out, a global array: on a GPU its generic address
    # converted to a shared one names some other shared bytes.
    stderr = _run_failing("global_dst")
    want = rf"{SOURCE}:{_line(ROW_COPY)}: cp\.async\.cg\.shared\.global \(16 bytes\): thread 7 of block \(0, 0, 0\): "
    want += r"destination 0x[0-9a-f]+ is not in shared memory"
    assert re.search(want, stderr), stderr


@pytest.mark.parametrize("schedule", ["", "-DKP_CP_ASYNC_EAGER"], ids=["deferred", "eager"])
def test_a_destination_written_in_flight_is_refused(schedule):
    # Thread 7 writes the row its copy will land in before waiting: the
    # wait that completes the copy sees it, whether the copy was poison or
    # its bytes until then.
    stderr = _run_failing("write_dst", schedule)
    want = f"{SOURCE}:{_line(RING_WAIT)}: cp.async.wait_group: thread 7 of block (0, 0, 0): the destination "
    assert want in stderr and f"of the copy issued at {SOURCE}:{_line(ROW_COPY)} was written while" in stderr, stderr


def test_two_copies_in_flight_to_the_same_bytes_are_refused():
    # Thread 7 copies its first row twice, in two groups, before waiting:
    # PTX orders neither copy before the other.
    stderr = _run_failing("same_dst")
    want = f"{SOURCE}:{_line(RING_WAIT)}: cp.async.wait_group: thread 7 of block (0, 0, 0): the destination "
    assert want in stderr and f"of the copy issued at {SOURCE}:{_line(SECOND_COPY)} was written while" in stderr, stderr


def test_a_source_changed_in_flight_is_refused():
    # Thread 7 flips a bit of the row its copy reads before waiting: which
    # bytes land is undefined.
    stderr = _run_failing("write_src")
    want = f"{SOURCE}:{_line(RING_WAIT)}: cp.async.wait_group: thread 7 of block (0, 0, 0): the source "
    assert want in stderr and f"of the copy issued at {SOURCE}:{_line(ROW_COPY)} changed while" in stderr, stderr


def test_a_copy_in_a_kernel_that_does_not_cooperate_is_refused():
    # cp_async_alone has no KP_THREADS_COOPERATE: its threads run one after
    # another, where the emulator keeps no copies per thread.
    script = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from test_emulator_cp_async import _code
        from kpool_cupy.emulator.launch import launch_code
        launch_code(_code(), "cp_async_alone", 1, 128, (np.zeros(512, np.uint32), np.zeros(128, np.uint32)))
        print("returned")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode != 0 and "returned" not in done.stdout, done.stdout + done.stderr[-3000:]
    line = _line("kp_cp_async16(rows + t * kRowWords, keys + t * kRowWords, true);")
    want = f"{SOURCE}:{line}: cp.async.cg.shared.global (16 bytes) in a kernel that does not open with "
    assert want + "KP_THREADS_COOPERATE(true)" in done.stderr, done.stderr


def _probe(arch: str) -> tuple[str, str, list[tuple[str, str, str]]]:
    """cp_async_ring_probe built for ``arch``: its PTX, ptxas's report on it, and its SASS instructions as (guard,
    opcode, operands).

    The module holds the other kernels too (an ``extern "C"`` kernel is
    always emitted), so each text is cut to the probe's own function."""
    from kpool_cupy.tools import sass

    probe_ptx, report, probe_sass = probe_build(_code(), "cp_async_ring_probe", "cp_async_ring_probe", arch)
    instructions = [(i.guard, ".".join(i.opcode), i.operands.strip()) for i in sass.parse_instructions(probe_sass)[0]]
    return probe_ptx, report, instructions


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_device_wrappers_give_ldgsts_and_depbar(sass_tools, arch):
    # Each tile's two copies are LDGSTS, global to shared without a
    # register in between: .cg's 16 bytes bypass L1 (BYPASS.128), .ca's 4
    # bytes do not. read becomes LDGSTS's zero-fill predicate operand, not a
    # branch around the copy; a commit is LDGDEPBAR and wait_group N is
    # DEPBAR.LE SB0, N: 1 in the loop, 0 for the drain. Nothing staged
    # through registers (no 16-byte LDG or STS), nothing spilled.
    ptx, report, instructions = _probe(arch)
    for text in (
        "cp.async.cg.shared.global [%r",
        "], 16, %r",
        "cp.async.ca.shared.global [%r",
        "], 4, %r",
        "cp.async.commit_group;",
        "cp.async.wait_group 1;",
        "cp.async.wait_group 0;",
    ):
        assert text in ptx, (text, ptx)
    opcodes = [op for _, op, _ in instructions]
    copies = [(guard, op, operands) for guard, op, operands in instructions if op.startswith("LDGSTS")]
    assert opcodes.count("LDGSTS.E.BYPASS.128") == opcodes.count("LDGSTS.E") > 0, copies
    assert {op for _, op, _ in copies} == {"LDGSTS.E.BYPASS.128", "LDGSTS.E"}, copies
    assert all(re.search(r", !?P[0-6]$", operands) for _, _, operands in copies), copies
    assert "LDGDEPBAR" in opcodes and "BAR.SYNC.DEFER_BLOCKING" in opcodes, opcodes
    waits = {operands for _, op, operands in instructions if op.startswith("DEPBAR")}
    assert waits == {"SB0, 0x1", "SB0, 0x0"}, waits
    assert not [op for op in opcodes if op in ("LDG.E.128", "LDG.E.128.CONSTANT", "STS.128")], opcodes
    assert "0 bytes spill stores, 0 bytes spill loads" in report, report


@pytest.mark.gpu
def test_gpu_ring_gives_the_sums():
    # On a GPU of compute capability 8.0 or newer, the same kernel built by
    # CuPy for the device: copies that land at their own time, missing tiles
    # zero-filled by src-size 0, the same exact sums.
    import cupy

    from kpool_cupy.kernel.sources import NVRTC_OPTIONS

    if int(cupy.cuda.Device().compute_capability) < 80:
        pytest.skip("cp.async needs compute capability 8.0 or newer")
    kernel = cupy.RawModule(code=_code(), options=NVRTC_OPTIONS).get_function("cp_async_ring")
    keys, scales, present = _inputs(seed=2)
    out = cupy.zeros((BLOCKS, THREADS), np.uint32)
    args = (cupy.asarray(keys), cupy.asarray(scales), cupy.asarray(present), out, np.int32(len(PRESENT)), np.int32(0))
    kernel((BLOCKS,), (THREADS,), args, shared_mem=SHARED)
    problem = _differs(cupy.asnumpy(out), _model(keys, scales, present))
    assert not problem, problem
