"""The emulator's cooperating threads: warp shuffles, __syncthreads and __shared__, run as fibers.

The kernels are tests/kernels/cooperation.cu, built through the emulator's
own toolchain behind kernels/kpool_portability.h. Each result is compared
with a NumPy model that adds in the kernel's order, so a match is bit for
bit; a divergent kernel must abort with the emulator's message, not hang.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import sanitized
from model import BF16

from kpool_cupy import emulate
from kpool_cupy.emulator.launch import launch_code, recording
from kpool_cupy.kernel.sources import kernel_source

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "tests/kernels/cooperation.cu"


def _code() -> str:
    # kernels/ holds only the package's kernels, so the test prepends the header itself.
    return kernel_source("kpool_portability.h") + f'#line 1 "{SOURCE}"\n' + (ROOT / SOURCE).read_text()


def _launch(kernel: str, grid: int, block: int, *args) -> None:
    with recording() as launches:
        launch_code(_code(), kernel, grid, block, args)
    assert [launch.cooperative for launch in launches] == [True], launches


# The x86-64 stack switch and the portable swapcontext one must agree.
@pytest.fixture(params=["asm", "ucontext"], autouse=True)
def fibers(request, monkeypatch):
    if request.param == "ucontext":
        flags = os.environ.get(emulate.FLAGS_VARIABLE, "")
        monkeypatch.setenv(emulate.FLAGS_VARIABLE, f"{flags} -DKP_FIBERS_UCONTEXT".strip())
    return request.param


def _butterfly(values: np.ndarray, lanes: int = 32) -> np.ndarray:
    """Each group of `lanes` reduced the kernel's way: v += v[lane ^ offset], offsets halving, in float32."""
    groups = values.reshape(-1, lanes).copy()
    offset = lanes // 2
    while offset >= 1:
        groups = groups + groups[:, np.arange(lanes) ^ offset]
        offset //= 2
    return groups.reshape(values.shape)


def test_warp_butterfly_sum_and_max():
    # Every lane must end with its own warp's total: a shuffle that returned
    # the caller's value, or another warp's, changes the sums.
    x = np.random.default_rng(0).standard_normal(3 * 64).astype(np.float32)
    total, peak = np.zeros_like(x), np.zeros_like(x)
    _launch("warp_sum_max", 3, 64, x, total, peak)
    want = _butterfly(x)
    assert np.array_equal(total, want), np.flatnonzero(total != want)
    assert np.array_equal(peak, np.repeat(x.reshape(-1, 32).max(axis=1), 32))
    assert np.allclose(total, np.repeat(x.reshape(-1, 32).astype(np.float64).sum(axis=1), 32), rtol=1e-5, atol=1e-5)


def test_integer_shuffles_down_idx_and_up():
    # __shfl_down_sync: lanes past the warp's end keep their own value, so
    # lane 0 alone holds the total; __shfl_sync broadcasts it; __shfl_up_sync
    # gives lane 0 its own value and every other lane its left neighbour's.
    x = np.random.default_rng(1).integers(-1000, 1000, 2 * 32).astype(np.int32)
    total, left = np.zeros_like(x), np.zeros(x.shape, np.uint32)
    _launch("warp_int_down_idx_up", 1, 64, x, total, left)
    assert np.array_equal(total, np.repeat(x.reshape(-1, 32).sum(axis=1), 32))
    lanes = np.arange(x.size) % 32
    want_left = np.where(lanes == 0, x, np.roll(x, 1)).astype(np.uint32)
    assert np.array_equal(left, want_left), np.flatnonzero(left != want_left)


def test_width_splits_the_warp_into_segments():
    # CUDA's rule: a lane never reads a later segment (xor, down) or an
    # earlier one (up); it keeps its own value there. srcLane wraps.
    out = np.zeros(4 * 32, np.int32)
    _launch("width_segments", 1, 32, out)
    lane = np.arange(32)
    start16, start8 = lane // 16 * 16, lane // 8 * 8
    want_xor = np.where((lane ^ 16) < start16 + 16, lane ^ 16, lane)  # lanes 16-31 read 0-15
    want_idx = start16 + 17 % 16
    want_down = np.where(lane + 3 < start8 + 8, lane + 3, lane)
    want_up = np.where(lane - 3 >= start8, lane - 3, lane)
    want = 10 * np.concatenate([want_xor, want_idx, want_down, want_up])
    assert np.array_equal(out, want), out.reshape(4, 32) - want.reshape(4, 32)


@pytest.mark.parametrize("block", [32, 96, 1024])
def test_block_sum_through_syncthreads_and_shared(block):
    # Warp 0 reads the other warps' sums from __shared__ after the barrier:
    # a barrier that let it through early reads the previous block's sums.
    blocks = 4
    x = np.random.default_rng(block).standard_normal(blocks * block).astype(np.float32)
    out = np.zeros(blocks, np.float32)
    _launch("block_sum", blocks, block, x, out)
    warp_sums = _butterfly(x).reshape(blocks, block // 32, 32)[:, :, 0]
    padded = np.zeros((blocks, 32), np.float32)
    padded[:, : block // 32] = warp_sums
    want = _butterfly(padded.reshape(-1)).reshape(blocks, 32)[:, 0]
    assert np.array_equal(out, want), (out, want)


def _fwht(rows: np.ndarray) -> np.ndarray:
    """Walsh-Hadamard butterflies (a + b, a - b) at strides 1, 2, ..., 64, in float32."""
    y = rows.copy()
    h = 1
    while h < y.shape[1]:
        pairs = y.reshape(y.shape[0], -1, 2, h)
        y = np.concatenate([pairs[:, :, :1] + pairs[:, :, 1:], pairs[:, :, :1] - pairs[:, :, 1:]], axis=2)
        y = y.reshape(rows.shape)
        h *= 2
    return y


def test_walsh_hadamard_over_16_lanes_of_8_values():
    # The D=128 rotation's layout: strides 1..4 in registers, 8..64 across
    # 16 lanes (width 16, two rows per warp). 7 rows leave a surplus row
    # whose lanes shuffle zeros and store nothing.
    rows = 7
    x = np.random.default_rng(2).standard_normal((rows, 128)).astype(np.float32)
    y = x.copy()
    _launch("fwht128", (rows * 16 + 63) // 64, 64, y, np.int32(rows))
    want = _fwht(x)
    assert np.array_equal(y, want), np.argwhere(y != want)[:5]
    hadamard = np.array([[1.0]])
    while hadamard.shape[0] < 128:
        hadamard = np.block([[hadamard, hadamard], [hadamard, -hadamard]])
    assert np.allclose(y, x.astype(np.float64) @ hadamard, atol=1e-4)


@pytest.mark.parametrize("block", [48, 40, 33, 100])
def test_partial_warps_with_the_mask_of_the_lanes_they_have(block):
    # The last warp has 16, 8, 1 or 4 lanes; its mask names exactly those.
    blocks = 2
    x = np.random.default_rng(block).standard_normal(blocks * block).astype(np.float32)
    out = np.zeros_like(x)
    _launch("partial_warp_sum", blocks, block, x, out)
    want = np.empty_like(x)
    for b in range(blocks):
        for base in range(0, block, 32):
            lanes = min(32, block - base)
            start = b * block + base
            want[start : start + lanes] = _butterfly(x[start : start + lanes], lanes)[0]
    assert np.array_equal(out, want), np.flatnonzero(out != want)


_FAILING = textwrap.dedent(
    """
    import sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    from test_emulator_cooperation import _code
    from kpool_cupy.emulator.launch import launch_code
    block = {block}
    launch_code(_code(), {kernel!r}, 1, block, {args})
    print("returned")
    """
)


def _run_failing(kernel: str, block: int, args: str, extra_env: dict[str, str] | None = None):
    script = _FAILING.format(tests=str(ROOT / "tests"), kernel=kernel, block=block, args=args)
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(extra_env or {})}
    # A hang would be the bug: the timeout turns it into a failure.
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "returned" not in done.stdout, done.stdout + done.stderr[-3000:]
    return done.stderr


def _line(text: str) -> int:
    """The 1-based line of tests/kernels/cooperation.cu that reads `text`."""
    return 1 + (ROOT / SOURCE).read_text().splitlines().index(text)


def test_a_thread_that_skips_a_barrier_and_exits_is_a_deadlock(fibers):
    stderr = _run_failing("skip_barrier", 64, "(np.zeros(64, np.float32),)")
    line = _line("__global__ void skip_barrier(float* out) {") + 2
    assert "kpool emulator: deadlock: the threads of block (0, 0, 0) can never all continue" in stderr, stderr
    assert "threads 0-0 have exited" in stderr, stderr
    assert f"threads 1-63 wait at __syncthreads ({SOURCE}:{line})" in stderr, stderr


def test_a_thread_that_skips_one_of_two_barriers_is_refused(fibers):
    # On a GPU thread 0's second barrier would release the others' first.
    stderr = _run_failing("skip_one_of_two_barriers", 64, "(np.zeros(64, np.float32),)")
    first = _line("__global__ void skip_one_of_two_barriers(float* out) {") + 2
    assert "kpool emulator: divergent __syncthreads: the threads of block (0, 0, 0) wait at different" in stderr
    assert f"threads 0-0 wait at __syncthreads ({SOURCE}:{first + 2})" in stderr, stderr
    assert f"threads 1-63 wait at __syncthreads ({SOURCE}:{first})" in stderr, stderr


def test_reading_a_lane_that_left_the_kernel_is_refused(fibers):
    # Lane 0 skips the shuffle and exits: the others' shuffle completes (CUDA
    # waits for the non-exited lanes), but lane 1 reads lane 0's value.
    stderr = _run_failing("skip_shuffle", 64, "(np.zeros(64, np.float32),)")
    line = _line("__global__ void skip_shuffle(float* out) {") + 3
    assert f"{SOURCE}:{line}: __shfl_xor_sync: lane 1 of warp 0 reads lane 0, which has left the kernel" in stderr


def test_a_lane_that_skips_a_shuffle_for_another_is_a_deadlock(fibers):
    # The same mask at two different calls: CUDA needs the same intrinsic.
    stderr = _run_failing("skip_shuffle_then_wait", 64, "(np.zeros(64, np.float32),)")
    first = _line("__global__ void skip_shuffle_then_wait(float* out) {") + 3
    assert "kpool emulator: deadlock" in stderr, stderr
    assert f"threads 0-0 (warp 0) wait at __shfl_xor_sync with mask 0xffffffff ({SOURCE}:{first + 1})" in stderr
    assert f"threads 1-31 (warp 0) wait at __shfl_xor_sync with mask 0xffffffff ({SOURCE}:{first})" in stderr


@pytest.mark.parametrize("width", [4, 8, 16])
def test_groups_that_leave_let_the_others_shuffle_under_the_full_mask(width):
    # Two blocks of 64; every other group (and one whole warp) leaves. A
    # shuffle that waited for the lanes that left would deadlock; one that
    # read across segments would change the sums; a vote (__any_sync,
    # __all_sync, __ballot_sync) that counted a lane that left, or missed one
    # that stayed, would change any_odd, all_odd or odd_lanes.
    rng = np.random.default_rng(width)
    x = rng.integers(-8, 8, 128).astype(np.float32)
    keep = (np.arange(128 // width) % 2 == 0).astype(np.int32)
    keep[32 // width : 64 // width] = 0  # the first block's second warp: every group leaves
    total, any_odd, all_odd = np.full_like(x, -1.0), np.full(128, -1, np.int32), np.full(128, -1, np.int32)
    odd_lanes = np.full(128, 7, np.uint32)
    _launch("groups_leave_full_mask", 2, 64, x, keep, total, any_odd, all_odd, odd_lanes, np.int32(width))
    stays = np.repeat(keep, width).astype(bool)
    want = _butterfly(x, width)
    assert np.array_equal(total[stays], want[stays]) and np.all(total[~stays] == -1.0)
    odd = (x.astype(np.int64) % 2 != 0) & stays
    warp_any = np.repeat(odd.reshape(-1, 32).any(axis=1), 32)
    assert np.array_equal(any_odd[stays], warp_any[stays].astype(np.int32)) and np.all(any_odd[~stays] == -1)
    warp_all = np.repeat((odd | ~stays).reshape(-1, 32).all(axis=1), 32)
    assert np.array_equal(all_odd[stays], warp_all[stays].astype(np.int32)) and np.all(all_odd[~stays] == -1)
    bits = (odd.reshape(-1, 32).astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(axis=1)
    assert np.array_equal(odd_lanes[stays], np.repeat(bits, 32)[stays].astype(np.uint32))
    assert np.all(odd_lanes[~stays] == 7)


def test_a_mask_naming_lanes_past_the_block_is_refused(fibers):
    stderr = _run_failing("partial_warp_full_mask", 48, "(np.zeros(48, np.float32), np.zeros(48, np.float32))")
    assert "__shfl_xor_sync with mask 0xffffffff, but warp 1 of this block has only lanes 0x0000ffff" in stderr


def test_a_barrier_in_a_kernel_not_marked_cooperative_is_refused(fibers):
    stderr = _run_failing("unmarked_barrier", 32, "(np.zeros(32, np.float32),)")
    assert "__syncthreads in a kernel that does not open with KP_THREADS_COOPERATE(true)" in stderr, stderr


def _ring_inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    head_dim, kpool = 16, 3
    lengths, cached = [7, 0, 5, 2, 9], [2, 4, 0, 1, 6]
    k = rng.standard_normal((sum(lengths), head_dim)).astype(BF16)
    gate = (3 * rng.standard_normal((sum(lengths), head_dim))).astype(BF16)
    ape = rng.standard_normal((kpool, head_dim)).astype(np.float32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tail = rng.standard_normal((len(lengths), 2, kpool, head_dim)).astype(BF16)
    slots = np.arange(len(lengths), dtype=np.int32)
    step_k = rng.standard_normal((5, 2, head_dim)).astype(BF16)
    step_gate = rng.standard_normal((5, 2, head_dim)).astype(BF16)
    positions = np.array([[4, 5], [8, -1], [-1, -1], [0, 1], [11, 12]], np.int32)
    return k, gate, ape, offsets, np.asarray(cached, np.int32), tail, slots, step_k, step_gate, positions


def _existing_ops() -> tuple[list[np.ndarray], list[bool]]:
    k, gate, ape, offsets, cached, tail, slots, step_k, step_gate, positions = _ring_inputs()
    with recording() as launches:
        outputs = [emulate.kpool_compress(k, gate, ape, offsets, cached)]
        ring = tail.copy()
        outputs += [*emulate.kpool_ring_close(ring, k, gate, ape, offsets, cached, slots), ring]
        ring = tail.copy()
        emulate.kpool_seed_tail(ring, k, gate, offsets, cached, slots)
        outputs.append(ring)
        ring = tail.copy()
        outputs += [*emulate.kpool_tail_update(ring, step_k, step_gate, ape, positions, slots), ring]
    return outputs, [launch.cooperative for launch in launches]


def test_existing_kernels_run_the_sequential_loop_and_fibers_give_the_same_bits(monkeypatch, fibers):
    # The compress and ring kernels never cooperate: they must keep the plain
    # loop (no fiber costs them anything), and the fiber runner, forced on
    # them with -DKP_FIBERS_ALWAYS, must give their exact bits: every thread
    # and block index, every argument, as the loop gives them.
    plain, cooperative = _existing_ops()
    assert len(cooperative) == 4 and not any(cooperative), cooperative
    flags = os.environ.get(emulate.FLAGS_VARIABLE, "")
    monkeypatch.setenv(emulate.FLAGS_VARIABLE, f"{flags} -DKP_FIBERS_ALWAYS".strip())
    forced, cooperative = _existing_ops()
    assert len(cooperative) == 4 and all(cooperative), cooperative
    for i, (a, b) in enumerate(zip(plain, forced, strict=True)):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"output {i} differs under fibers"


@pytest.mark.slow
def test_cooperation_under_address_sanitizer(fibers):
    # Every test above (the fiber switches annotated for the sanitizer, the
    # aborts included) in a Python with libasan preloaded and kernels built
    # -fsanitize=address; then two planted overruns on fibers must be seen.
    if fibers == "ucontext":
        pytest.skip("runs both fiber kinds itself")
    libasan = sanitized.libasan()
    if libasan is None:
        pytest.skip("the host compiler has no AddressSanitizer runtime")
    env = sanitized.environment(libasan)
    arguments = ["-q", "-p", "no:cacheprovider", "-m", "not slow", __file__]
    tests = f"import sys, pytest\nsys.exit(pytest.main({arguments!r}))"
    # A guard against a hang: 153 s here on a busy machine, cold.
    done = sanitized.run(tests, libasan, timeout=1800)
    assert done.returncode == 0 and "AddressSanitizer" not in done.stdout + done.stderr, done.stdout[-4000:]
    sanitized.assert_instrumented(done.stdout, at_least=11)
    # Controls: a read past a local array on a fiber's stack, a write past an output.
    stderr = _run_failing("overrun_stack", 32, "(np.array([8], np.int32), np.zeros(32, np.float32))", env)
    assert "AddressSanitizer: stack-buffer-overflow" in stderr, stderr[-3000:]
    stderr = _run_failing("overrun_heap", 32, "(np.zeros(32, np.float32), np.zeros(32, np.float32), np.int32(1))", env)
    assert "AddressSanitizer: heap-buffer-overflow" in stderr, stderr[-3000:]
    # An abort on a fiber's stack: without the switches annotated, the
    # sanitizer would not know that stack and warn of false reports to come.
    stderr = _run_failing("partial_warp_full_mask", 48, "(np.zeros(48, np.float32), np.zeros(48, np.float32))", env)
    assert "warp 1 of this block has only lanes 0x0000ffff" in stderr, stderr[-3000:]
    assert "__asan_handle_no_return" not in stderr, stderr[-3000:]


def _mappings() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for _ in maps)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="counts the process's mappings in /proc")
def test_a_cooperating_launch_returns_its_fiber_stacks():
    # Each fiber stack is two mappings (guard page and stack), and every
    # kernel library keeps its own pool: kept from launch to launch, a
    # process running many cooperating variants (the suite does) reached
    # vm.max_map_count and aborted ("cannot map a fiber stack"). A launch of
    # a 256-thread block must leave no more mappings than loading its
    # library takes (a few), not two per thread.
    from kpool_cupy import emulate
    from kpool_cupy.kernel.codes import VectorAccess
    from kpool_cupy.kernel.declarations import HADAMARD_QUANT_FP8

    x = np.ones((40, 64), np.float16)  # 8 lanes a row, 32 rows a 256-thread block
    name = HADAMARD_QUANT_FP8.instance(T=x.dtype, HEAD_DIM=64, VECTOR=VectorAccess.K | VectorAccess.OUT)
    emulate.load_variant(HADAMARD_QUANT_FP8.source, name)  # built and loaded before counting: the call loads nothing
    before = _mappings()
    emulate.hadamard_quant_fp8(x)
    assert _mappings() - before < 16


@pytest.mark.parametrize("synced", [False, True], ids=["plain-loop", "fibers"])
def test_blocks_run_in_ascending_order_or_reversed_for_the_schedule_tests(synced, monkeypatch, fibers):
    # helper-67: blocks always ran in ascending order, so the split selections' merge was always done by a
    # row's highest block; -DKP_BLOCKS_REVERSED runs them the other way (tests/test_index_*: both orders).
    for flag, order in (("", np.arange(7)), ("-DKP_BLOCKS_REVERSED", np.arange(7)[::-1])):
        flags = os.environ.get(emulate.FLAGS_VARIABLE, "").replace("-DKP_BLOCKS_REVERSED", "")
        monkeypatch.setenv(emulate.FLAGS_VARIABLE, f"{flags} {flag}".strip())
        counter, ticket = np.zeros(1, np.uint32), np.full(7, 99, np.uint32)
        with recording() as launches:
            launch_code(_code(), "block_order_synced" if synced else "block_order", 7, 64, (counter, ticket))
        assert [launch.cooperative for launch in launches] == [synced], launches
        np.testing.assert_array_equal(ticket, order.astype(np.uint32))
