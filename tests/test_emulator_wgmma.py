"""Hopper's e4m3 warpgroup MMA (wgmma) on the emulator, and its device wrappers compiled for sm_90a.

The kernels are tests/kernels/wgmma.cu: each stages e4m3 tiles of A [64 x K]
and B [N x K] in shared memory in one of the PTX ISA's canonical K-major
layouts (no swizzle, 128-, 64- and 32-byte swizzle), runs K / 32 wgmma
k-steps into float32 accumulators, waits and writes D = A B^T from the
threads' fragments. The emulator (kernels/emulator/kpool_wgmma.h) must give
D within float32 summation error of the exact float64 product, bit for bit
what a NumPy model adding in the documented order gives, refuse each misuse
the PTX ISA leaves undefined with a message, and fail these value tests when
one layout detail is built wrong on purpose.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from kernel_text import kernel_code, line_of, probe_build

from kpool_cupy import emulate
from kpool_cupy.emulator.launch import launch_code, recording

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "tests/kernels/wgmma.cu"
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
NONE, SW128, SW64, SW32 = 0, 1, 2, 3  # the descriptor's swizzle field
SWIZZLES = {"none": NONE, "128B": SW128, "64B": SW64, "32B": SW32}
# tests/kernels/wgmma.cu's Misuse values.
MISUSE = {
    "none": 0,
    "read_in_flight": 1,
    "write_in_flight": 2,
    "no_fence": 3,
    "touch_after_fence": 4,
    "second_group": 5,
    "read_second_early": 6,
    "disagree": 7,
    "leave_in_flight": 8,
    "staggered": 9,
}
U = 2.0**-24  # float32's unit roundoff


def _code() -> str:
    return kernel_code(SOURCE, "kpool_portability.h", "kpool_wgmma.cuh")


def _line(text: str) -> int:
    return line_of(SOURCE, text)


def _e4m3_bytes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Uniform e4m3fn bytes, both signs, zeros and subnormals included, NaN (0x7f, 0xff) left out."""
    x = rng.integers(0, 256, shape).astype(np.uint8)
    x[(x & 0x7F) == 0x7F] ^= 0x01
    return x


def _warpgroups(n: int, kbytes: int) -> int:
    # Two warpgroups a block where B's shared tile holds both (32 KiB, rows of 128-byte blocks).
    return 2 if 2 * n * max(kbytes, 128) <= 32768 else 1


def _run(n: int, ksteps: int, swizzle: int, misuse: str = "none", blocks: int = 2, seed: int = 0):
    rng = np.random.default_rng(seed)
    kbytes = 32 * ksteps
    groups = _warpgroups(n, kbytes)
    a = _e4m3_bytes(rng, (blocks, 64, kbytes))
    b = _e4m3_bytes(rng, (blocks, groups * n, kbytes))
    d = np.full((blocks, 64, groups * n), np.nan, np.float32)
    args = (a, b, d, np.int32(n), np.int32(ksteps), np.int32(swizzle), np.int32(MISUSE[misuse]))
    with recording() as launches:
        launch_code(_code(), "wgmma_product", blocks, 128 * groups, args)
    assert [launch.cooperative for launch in launches] == [True], launches
    return a, b, d


def _model(a: np.ndarray, b: np.ndarray, ksteps: int) -> np.ndarray:
    """D as the emulator documents it: per k-step the 32 products of each D[m][n] added one after another in k
    order, in float32, from the first product; each step's sum then added to the accumulator (the first step's
    is the accumulator: scale_d 0)."""
    av, bv = a.view(E4M3).astype(np.float32), b.view(E4M3).astype(np.float32)
    acc = None
    for s in range(ksteps):
        ks = range(32 * s, 32 * s + 32)
        total = av[..., :, None, ks[0]] * bv[..., None, :, ks[0]]  # each product exact in float32
        for k in ks[1:]:
            total = total + av[..., :, None, k] * bv[..., None, :, k]
        acc = total if acc is None else acc + total
    return acc


def _problems(a: np.ndarray, b: np.ndarray, d: np.ndarray, ksteps: int, relative: float | None = None) -> list[str]:
    """Where D misses the exact product's bound, or the documented order's bits: empty when right.

    ``relative`` replaces the float32 bound by ``relative * sum |a b|`` and
    drops the bits (a GPU's tensor cores add in their own order and width)."""
    av, bv = a.view(E4M3).astype(np.float64), b.view(E4M3).astype(np.float64)
    exact = np.einsum("zmk,znk->zmn", av, bv)  # products of e4m3 values and their sums are exact in float64
    magnitude = np.einsum("zmk,znk->zmn", np.abs(av), np.abs(bv))
    # A product of step s passes through at most 31 additions within its step
    # and ksteps - 1 into the accumulator, each off by at most u relatively:
    # |D - exact| <= gamma_(30 + ksteps) sum |a b|, gamma_j = j u / (1 - j u).
    j = 30 + ksteps
    bound = (j * U / (1 - j * U) if relative is None else relative) * magnitude
    problems = []
    unwritten = np.argwhere(np.isnan(d))
    if unwritten.size:
        problems.append(f"{len(unwritten)} elements of D unwritten, first (block, row, column) {unwritten[0]}")
    off = np.argwhere(np.abs(d - exact) > bound)
    if off.size:
        z, m, n = off[0]
        problems.append(
            f"{len(off)} elements outside the float32 bound, first D[{z}][{m}][{n}]: got {d[z, m, n]!r}, "
            f"want {exact[z, m, n]!r} +- {bound[z, m, n]:.3g}"
        )
    if relative is not None:
        return problems
    model = _model(a, b, ksteps)
    differ = np.argwhere(d.view(np.uint32) != model.view(np.uint32))
    if differ.size:
        z, m, n = differ[0]
        problems.append(
            f"{len(differ)} elements differ from the documented order's bits, first D[{z}][{m}][{n}]: "
            f"got {d[z, m, n]!r}, model {model[z, m, n]!r}"
        )
    return problems


@pytest.mark.parametrize("ksteps", [1, 5])
@pytest.mark.parametrize("swizzle", list(SWIZZLES), ids=list(SWIZZLES))
@pytest.mark.parametrize("n", [8, 16, 32, 64, 128])
def test_wgmma_gives_the_product(n, swizzle, ksteps):
    # Every N the wrapper takes, in every canonical layout; 1 k-step is
    # scale_d 0 alone, 5 k-steps cross a 128-byte swizzle block (K 160) and
    # chain five wgmma on one accumulator in one group. Two blocks (the
    # emulator's state is per block), two warpgroups where B fits (each its
    # own B rows: warpgroup g is threads 128 g..). Random e4m3 bytes spread
    # over the whole range, so any misplaced byte, row or fragment element
    # moves D far outside the rounding bound.
    a, b, d = _run(n, ksteps, SWIZZLES[swizzle], seed=n + ksteps)
    problems = _problems(a, b, d, ksteps)
    assert not problems, problems


def test_wait_group_one_completes_the_older_group():
    # Two groups in flight: wait_group 1 leaves the newer one pending and
    # completes the older, whose accumulator the kernel then reads and writes.
    a, b, d = _run(32, 3, SW128, misuse="second_group")
    problems = _problems(a, b, d, 3)
    assert not problems, problems


def test_warps_that_reach_the_wgmma_in_different_rounds_meet_there():
    # Warps 1-3 wait at a __syncwarp while warp 0 already waits at the fence:
    # the fence must hold warp 0 until all 128 threads are there, not run
    # with what one warp brought.
    a, b, d = _run(16, 2, SW64, misuse="staggered")
    problems = _problems(a, b, d, 2)
    assert not problems, problems


def _descriptor(address: int, leading: int, stride: int, swizzle: int) -> int:
    """The PTX ISA's matrix descriptor: encode(x) = (x & 0x3ffff) >> 4 at bits 0, 16 and 32, swizzle at 62."""
    encode = lambda x: (x & 0x3FFFF) >> 4  # noqa: E731
    return encode(address) | encode(leading) << 16 | encode(stride) << 32 | swizzle << 62


# tests/kernels/wgmma.cu's wgmma_descriptors: (offset into the array, LBO, SBO, swizzle).
DESCRIPTORS = [
    (0, 0, 0, NONE),
    (48, 128, 2048, NONE),
    (1056, 16, 1024, SW128),
    (512, 4080, 512, SW64),
    (3840, 262128, 256, SW32),
]


def test_the_emulated_descriptor_has_the_isa_bits():
    # The emulator decodes its own descriptors, so a field it put in the
    # wrong place consistently would pass the product tests; the bits must
    # be the ISA's, as a kernel that edits a descriptor (advancing the start
    # address along k) relies on.
    out = np.zeros(len(DESCRIPTORS), np.uint64)
    launch_code(_code(), "wgmma_descriptors", 1, 32, (out,))
    address = int(out[0]) << 4  # the array's low 18 bits
    want = [_descriptor(address + offset, *rest) for offset, *rest in DESCRIPTORS]
    assert [int(x) for x in out] == want, [hex(int(x)) for x in out]


# A layout detail built wrong on purpose must fail the value checks above.
@pytest.mark.parametrize(
    ("flag", "swizzle"),
    [
        ("-DKP_WGMMA_MISPLACED_LANE=5", NONE),
        ("-DKP_WGMMA_MISPLACED_SWIZZLE_BIT=0", SW128),
        ("-DKP_WGMMA_MISPLACED_SWIZZLE_BIT=0", SW64),
        ("-DKP_WGMMA_MISPLACED_SWIZZLE_BIT=0", SW32),
    ],
    ids=["lane", "swizzle-128B", "swizzle-64B", "swizzle-32B"],
)
def test_a_misplaced_layout_detail_fails_the_value_test(monkeypatch, flag, swizzle):
    # One thread's fragment rows (the lane hook) or one row bit of the
    # swizzle's XOR: the tests above must see either.
    flags = os.environ.get(emulate.FLAGS_VARIABLE, "")
    monkeypatch.setenv(emulate.FLAGS_VARIABLE, f"{flags} {flag}".strip())
    a, b, d = _run(16, 2, swizzle)
    problems = _problems(a, b, d, 2)
    assert any("outside the float32 bound" in p for p in problems), problems


_FAILING = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from test_emulator_wgmma import _run
    _run({n}, {ksteps}, {swizzle}, {misuse!r}, blocks=1)
    print("returned")
    """
)


def _run_failing(misuse: str, n: int = 16, ksteps: int = 2, swizzle: int = SW128, flags: str = "") -> str:
    script = _FAILING.format(tests=str(ROOT / "tests"), n=n, ksteps=ksteps, swizzle=swizzle, misuse=misuse)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env[emulate.FLAGS_VARIABLE] = f"{env.get(emulate.FLAGS_VARIABLE, '')} {flags}".strip()
    # A hang would be the bug: the timeout (ten times a normal run) turns it into a failure.
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "returned" not in done.stdout, done.stdout + done.stderr[-3000:]
    return done.stderr


def test_the_misuse_kernels_run_when_used_right():
    # The refusals below come from the misuse, not from the kernel around it.
    a, b, d = _run(16, 2, SW128, blocks=1)
    assert not _problems(a, b, d, 2)


# Threads run in rank order between waits, or reversed: a check that held
# only when thread 0 (or the last thread) came first would show here.
SCHEDULES = pytest.mark.parametrize("schedule", ["", "-DKP_FIBERS_REVERSED"], ids=["in-order", "reversed"])


@SCHEDULES
def test_reading_an_accumulator_before_its_wait_is_refused(schedule):
    stderr = _run_failing("read_in_flight", flags=schedule)
    read, issued = (
        _line("if (misuse == kReadInFlight) d[0] = acc[0];"),
        _line("kp_wgmma_e4m3(acc, tile_desc(sa, 64, s, swizzle, true), db, s > 0);"),
    )
    want = (
        f"{SOURCE}:{read}: thread {{}} of block (0, 0, 0) accesses element 0 of an accumulator that the "
        f"wgmma.mma_async issued at {SOURCE}:{issued} is still writing"
    )
    assert re.search(re.escape(want).replace(re.escape("{}"), r"\d+"), stderr), stderr


def test_reading_the_newer_group_after_wait_group_one_is_refused():
    stderr = _run_failing("read_second_early")
    read = _line("if (misuse == kReadSecondEarly) d[0] = other[0];")
    assert re.search(rf"{SOURCE}:{read}: thread \d+ of block \(0, 0, 0\) accesses element 0 of an", stderr), stderr


@SCHEDULES
def test_writing_operand_shared_memory_in_flight_is_refused(schedule):
    # Thread 0 flips a bit of A's first byte of the last k-step after the
    # commit; the wait that completes the group sees the bytes changed.
    stderr = _run_failing("write_in_flight", flags=schedule)
    wait = _line("kp_wgmma_wait<0>();  // completes the k-steps' group")
    assert f"{SOURCE}:{wait}: wgmma.wait_group: A[0][0] (an e4m3 byte in shared memory)" in stderr, stderr
    assert "changed while it was in flight" in stderr, stderr


@pytest.mark.parametrize("misuse", ["no_fence", "touch_after_fence"])
def test_a_wgmma_without_a_fence_after_the_threads_touch_its_accumulator_is_refused(misuse):
    stderr = _run_failing(misuse)
    assert "thread 0 accessed this accumulator after the warpgroup's last wgmma.fence" in stderr, stderr


def test_threads_that_disagree_on_a_descriptor_are_refused():
    stderr = _run_failing("disagree")
    assert "threads 0 and 5 of a warpgroup disagree on B's descriptor" in stderr, stderr


def test_an_accumulator_leaving_scope_in_flight_is_refused():
    stderr = _run_failing("leave_in_flight")
    assert "an accumulator left its scope while the wgmma.mma_async issued at" in stderr, stderr


def test_a_block_without_whole_warpgroups_is_refused():
    # 160 threads: the second warpgroup has 32. A wgmma needs all 128.
    script = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from test_emulator_wgmma import _code
        from kpool_cupy.emulator.launch import launch_code
        a, b, d = np.zeros((64, 32), np.uint8), np.zeros((8, 32), np.uint8), np.zeros((64, 8), np.float32)
        launch_code(_code(), "wgmma_product", 1, 160, (a, b, d, *map(np.int32, (8, 1, 0, 0))))
        print("returned")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "returned" not in done.stdout, done.stdout + done.stderr[-3000:]
    assert "wgmma.fence needs the 128 threads of warpgroup 1 (threads 128-255), but the block has 160" in done.stderr


def _sm90a_probe(n: int) -> tuple[str, str, str]:
    """wgmma_probe<n> built for sm_90a: its PTX, ptxas's report on it and its SASS (nvdisasm).

    The module holds wgmma_product too (an ``extern "C"`` kernel is always
    emitted), so each text is cut to the probe's own function."""
    return probe_build(_code(), f"wgmma_probe<{n}>", f"_Z11wgmma_probeILi{n}EEvPKhS1_Pf", "sm_90a")


@pytest.mark.parametrize("n", [8, 16, 32, 64, 128])
def test_the_device_wrappers_give_qgmma_on_sm_90a(sass_tools, n):
    # Four k-steps unrolled: four wgmma of the wrapper's shape in the PTX and
    # four QGMMA in the SASS, chained on one accumulator (the first with
    # scale-d off), one arrive (wgmma.fence) before them and one wait after,
    # nothing serialized or injected by ptxas, nothing spilled.
    ptx, report, code = _sm90a_probe(n)
    assert ptx.count(f"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3") == 4, ptx
    # The descriptors' constant fields (LBO 16, SBO 1024, 128-byte swizzle),
    # which NVVM folds into one 64-bit or, where the ISA puts them.
    assert f", {_descriptor(0, 16, 1024, SW128)};" in ptx, ptx
    opcodes = [line.split(";")[0].split()[1] for line in code.splitlines() if line.strip().startswith("/*")]
    gmma = [op for op in opcodes if "GMMA" in op]
    assert gmma == [f"QGMMA.64x{n}x32.F32.E4M3.E4M3"] * 4, gmma
    assert opcodes.count("WARPGROUP.ARRIVE") == 1 and opcodes.count("WARPGROUP.DEPBAR.LE") == 1, opcodes
    assert "serialized" not in report and "injected" not in report, report
    assert "0 bytes spill stores, 0 bytes spill loads" in report, report


@pytest.mark.gpu
def test_gpu_wgmma_matches_the_emulator_layouts(tmp_path):
    # On a Hopper GPU, the same kernel built for sm_90a: the layouts the
    # emulator reads are the ones QGMMA reads if D stays near the exact
    # product. Hopper's FP8 tensor cores add with fewer bits than float32
    # (about 14 by public measurements), so the bound is 2^-9 of sum |a b|:
    # a misplaced byte, row or fragment element errs by about sum |a b|.
    import cupy

    from kpool_cupy.kernel.nvrtc import compile_code

    if cupy.__version__.endswith("numpy-double"):
        pytest.skip("loads an sm_90a cubin: tests/cupy_double runs kernels from their source on the emulator")
    if cupy.cuda.Device().compute_capability != "90":
        pytest.skip("needs compute capability 9.0 (sm_90a)")
    cubin, _ = compile_code(_code(), SOURCE, "wgmma_product", ["--gpu-architecture=sm_90a"], "cubin")
    path = tmp_path / "wgmma.cubin"
    path.write_bytes(cubin)
    kernel = cupy.RawModule(path=str(path)).get_function("wgmma_product")
    for n in (8, 64, 128):
        for swizzle in SWIZZLES.values():
            rng = np.random.default_rng(n + swizzle)
            ksteps, blocks = 5, 2
            groups = _warpgroups(n, 32 * ksteps)
            a = _e4m3_bytes(rng, (blocks, 64, 32 * ksteps))
            b = _e4m3_bytes(rng, (blocks, groups * n, 32 * ksteps))
            d = cupy.full((blocks, 64, groups * n), np.nan, np.float32)
            args = (cupy.asarray(a), cupy.asarray(b), d, *map(np.int32, (n, ksteps, swizzle, 0)))
            kernel((blocks,), (128 * groups,), args)
            problems = _problems(a, b, cupy.asnumpy(d), ksteps, relative=2.0**-9)
            assert not problems, (n, swizzle, problems)
