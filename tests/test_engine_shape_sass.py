"""Issue 21's targets at the engines' shape (bfloat16, head_dim 128, kpool 4), read by `kpool-cupy ptx --sass`'s
own report (tools/sass_report.op_sass) off the sm_90 SASS of each op's variant, and the launch shape that
report assumes checked against the blocks the ops really launch."""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16

from kpool_cupy import reference
from kpool_cupy.backends.reference import ReferenceBackend
from kpool_cupy.tools import sass
from kpool_cupy.tools.load_depth import load_depth
from kpool_cupy.tools.sass_report import blocks_per_sm, launch_geometry, op_sass


@pytest.fixture(scope="module")
def report():
    try:
        sass.find_tool("ptxas")
        sass.find_tool("nvdisasm")
    except RuntimeError as error:
        pytest.skip(str(error))
    cache = {}

    def get(op: str):
        if op not in cache:
            cache[op] = op_sass(op, 128, 4, "bfloat16")
        return cache[op]

    return get


def test_compress_fits_three_blocks_in_80_registers_and_732_instructions(report):
    r = report("compress")
    assert r.machine.registers <= 80 and r.blocks_per_sm == 3, (r.machine.registers, r.blocks_per_sm)
    assert r.machine.instructions <= 732, r.machine.instructions


@pytest.mark.parametrize(("op", "most"), [("compress_fp8", 1400), ("hadamard_quant_fp8", 700)])
def test_the_fp8_epilogue_is_lean(report, op, most):
    # Before issue 21: 2,526 and 1,628 (a shuffle mask built at run time, a branch per value for
    # subnormals, round_scale at run time).
    assert report(op).machine.instructions <= most, report(op).machine.instructions


@pytest.mark.parametrize("op", ["tail_update", "tail_update_fp8"])
def test_the_decode_step_waits_on_two_dependent_loads(report, op):
    # Dependence alone (issue 21): 2. In order (the report's count) 2 as well since issue 35; it was 3 (the
    # slot used before the token loop issued its loads: tests/test_load_depth.decode_step_depths).
    r = report(op)
    assert load_depth(r.machine.sass, in_order=False).depth <= 2, r.kernel
    assert r.load_depth <= 2, (r.kernel, r.load_depth)


@pytest.mark.parametrize(
    "op", ["compress", "compress_fp8", "hadamard_quant_fp8", "tail_update", "tail_update_fp8", "ring_close_fp8"]
)
def test_no_spills(report, op):
    assert report(op).machine.spill_stores == report(op).machine.spill_loads == 0


def test_blocks_per_sm_follows_registers_threads_shared_memory_and_the_block_limit():
    assert blocks_per_sm(80, 256) == 3 and blocks_per_sm(83, 256) == 2  # 88 allocated: 2 blocks
    assert blocks_per_sm(32, 256) == 8  # the thread limit (2048) before the registers (65536 / 8192 = 8)
    assert blocks_per_sm(16, 32) == 32  # the block limit
    assert blocks_per_sm(80, 256, "sm_89") == 3 and blocks_per_sm(32, 256, "sm_89") == 6  # 1536 threads
    # The scorer's 47,288 bytes of shared memory and 1 KiB reserved a block: 228 KiB hold 4 on sm_90, 100 KiB 2.
    assert blocks_per_sm(32, 128, "sm_90", shared_bytes=47288) == 4
    assert blocks_per_sm(32, 128, "sm_89", shared_bytes=47288) == 2
    assert blocks_per_sm(32, 128, "sm_120", shared_bytes=47288) == 2
    assert blocks_per_sm(80, 256, "sm_90a") == blocks_per_sm(80, 256, "sm_90")  # an "a" target is its base's
    assert blocks_per_sm(80, 256, "sm_75") is None


def _launched_blocks(monkeypatch, call) -> set[int]:
    seen: set[int] = set()
    original = ReferenceBackend.launch

    def launch(self, launch):
        seen.add(launch.geometry.block)
        return original(self, launch)

    monkeypatch.setattr(ReferenceBackend, "launch", launch)
    call()
    return seen


def test_the_report_sizes_each_launch_as_the_ops_do(monkeypatch):
    # A batch large enough that a block is full: the report's launch shape is the ops' own.
    rng = np.random.default_rng(0)
    requests, head_dim = 4096, 128
    k = rng.standard_normal((requests, 2, head_dim)).astype(BF16)
    positions = np.arange(requests * 2, dtype=np.int32).reshape(requests, 2) % 7
    tail = np.zeros((requests, 2, 4, head_dim), BF16)
    ape = rng.standard_normal((4, head_dim)).astype(np.float32)
    slots = np.arange(requests, dtype=np.int32)
    decode = _launched_blocks(monkeypatch, lambda: reference.kpool_tail_update_fp8(tail, k, k, ape, positions, slots))
    assert decode == {launch_geometry("tail_update_fp8", head_dim).block}, decode
    flat = k.reshape(-1, head_dim)  # 8,192 tokens: 2,048 pools fill 128 blocks (fewer spread over about 128)
    offsets = np.array([0, 8192], np.int32)
    prefill = _launched_blocks(monkeypatch, lambda: reference.kpool_compress(flat, flat, ape, offsets, offsets[:1]))
    assert prefill == {launch_geometry("compress", head_dim).block}, prefill


def test_a_short_prefill_spreads_its_pools_over_about_128_blocks(monkeypatch):
    # prefill-1x4096 (1,024 pools) took 64 blocks of 256 threads: half an H200's SMs idle, and MAX's geometry (a
    # block a pool) 1.17x faster in the same record. It now takes 128 blocks of 128 threads, whole warps.
    seen = []
    original = ReferenceBackend.launch

    def launch(self, launch):
        seen.append((launch.geometry.grid, launch.geometry.block))
        return original(self, launch)

    monkeypatch.setattr(ReferenceBackend, "launch", launch)
    rng = np.random.default_rng(1)
    k = rng.standard_normal((4096, 128)).astype(BF16)
    ape = rng.standard_normal((4, 128)).astype(np.float32)
    reference.kpool_compress(k, k, ape, np.array([0, 4096], np.int32), np.array([0], np.int32))
    assert seen == [(128, 128)], seen
