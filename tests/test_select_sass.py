"""The selection kernels' machine code, read off what the GPU path compiles (no GPU needed): no spill in a loop, static
shared memory inside the 48 KiB every GPU gives a block without opting in (the largest buffer, pool_topk 4096,
included), 16-byte logits loads in kpool_index_topk, and the fused kernel's tensor-core count per call of the
scorer's routine. Each logit is read from global memory once on every architecture: the streaming selection
keeps no second pass (kernels/kpool_select.cuh; kpool_index_topk's sample of a chunk's worth is read first)."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from kpool_cupy.kernel.declarations import (
    INDEX_PAIRED_TOKENS,
    INDEX_SELECT_FP8,
    INDEX_TILE_PAGES,
    INDEX_TOPK,
    MMA_E4M3,
    MMA_F16,
    MMA_WGMMA,
)
from kpool_cupy.kernel.nvrtc import kernel_ptx
from kpool_cupy.tools import sass
from kpool_cupy.tools.load_depth import load_depth, operands_of
from kpool_cupy.tools.sass_report import tensor_core_count, tensor_core_opcodes

STATIC_SHARED_LIMIT = 48 * 1024
I32 = np.dtype(np.int32)
TOPK_GROUPS = 4  # kp::kTopkGroups


def _shared_bytes(source: str, name: str, arch: str) -> int:
    """The static shared memory ptxas reports for the kernel."""
    with tempfile.TemporaryDirectory(prefix="kpool-smem-") as folder:
        ptx = Path(folder, "kernel.ptx")
        ptx.write_text(kernel_ptx(source, name, sass.sm_arch(arch)))
        log = subprocess.run(
            [sass.find_tool("ptxas"), f"-arch={sass.sm_arch(arch)}", "-v", str(ptx), "-o", str(Path(folder, "k"))],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    found = re.search(r"(\d+) bytes smem", log.stdout + log.stderr)
    return int(found.group(1)) if found else 0


def local_accesses_in_loops(text: str) -> list[int]:
    """Addresses of local-memory loads and stores (spills) inside a loop: a spill there costs every chunk."""
    instructions, labels = sass.parse_instructions(text)
    loops = sass.loop_spans(instructions, labels)
    local = [i.address for i in instructions if i.opcode[0] in ("LDL", "STL")]
    return [a for a in local if any(start <= a <= end for start, end in loops)]


def _topk(cap: int) -> str:
    return INDEX_TOPK.instance(CAP=cap, VECTOR=1, IO=I32, IC=I32, PAGED=True, COMPACT=True)


def _select(cap: int, mma: int = MMA_E4M3, vector: int = 3) -> str:
    return INDEX_SELECT_FP8.instance(HEAD_DIM=128, MMA=mma, VECTOR=vector, CAP=cap, IO=I32, IC=I32, PAGED=True,
                                     COMPACT=True)  # fmt: skip


@pytest.mark.usefixtures("sass_tools")
def test_the_selection_reads_logits_16_bytes_at_a_time_and_spills_nothing_in_its_loops():
    # 80 registers (3 blocks an SM, kp::kTopkBlocksPerSm) and nothing in local memory.
    machine = sass.summarize_sass(INDEX_TOPK.source, _topk(512), arch="sm_90")
    assert machine.spill_stores == machine.spill_loads == 0 and machine.registers <= 80, machine.registers
    assert local_accesses_in_loops(machine.sass) == []
    # The range's sample, read first for the threshold (a group of four logits a thread: a chunk's worth), then
    # a tile's kTopkGroups groups of four a thread (kernels/kpool_index_topk.cu), issued together before a vote
    # ranks them, so a block has 16 KB in flight; no load waits behind another's data.
    assert machine.vector_loads == 1 + TOPK_GROUPS
    instructions, _ = sass.parse_instructions(machine.sass)
    opcodes = [i.opcode for i in instructions]
    loads = [n for n, o in enumerate(opcodes) if o[0] == "LDG" and "128" in o]
    votes = [n for n, o in enumerate(opcodes) if o[0] == "VOTE"]
    assert len(loads) == 1 + TOPK_GROUPS and loads[0] < votes[0] < loads[1], (loads, votes[:3])
    assert not any(loads[1] < vote < loads[-1] for vote in votes), (loads, votes)
    # 9 round trips on the longest path; 41 when a partial group's scalar loads each waited for the conversion of
    # the one before (load_tile converts after every load now), 11 while the expansion's request search took a
    # round trip a step (kp::warp_request_rows reads five steps at once).
    assert load_depth(machine.sass).depth <= 9


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100"])
def test_no_topk_build_spills_at_its_register_bound(arch):
    # NVRTC's build for each GPU (what CuPy runs), aligned and unaligned rows, with and without compaction:
    # 80 registers at most (3 blocks an SM) and nothing in local memory. Seen failing on sm_86 and sm_89 (12
    # bytes) with the sampled seed before the radix select over the buffer alone dropped its empty tile; sm_80
    # spilled 24 bytes before the seed; sm_100's unaligned builds 32 with the radix select's tie check holding
    # one AND and one OR over the buffer's keys and the tile's (the buffer's part is added first now). (sm_120's
    # unaligned compacting builds spill 32 bytes, 24 before the tie check: not pinned.)
    from kpool_cupy.kernel.nvrtc import kernel_ptxas_report

    for vector in (0, 1):
        for compact in (False, True):
            name = INDEX_TOPK.instance(CAP=512, VECTOR=vector, IO=I32, IC=I32, PAGED=True, COMPACT=compact)
            report = kernel_ptxas_report(INDEX_TOPK.source, name, arch)
            assert report.registers <= 80 and report.spill_stores == report.spill_loads == 0, (name, report)


@pytest.mark.usefixtures("sass_tools")
def test_the_fused_kernel_scores_on_tensor_cores_without_spills():
    # head_dim 128 on sm_90: score_token inlined in each of a trip's two calls (the call loop unrolled by 2), 4 key
    # tiles x 4 steps x 2 HMMAs each (tests/test_index_logits_fp8_sass.py).
    machine = sass.summarize_sass(INDEX_SELECT_FP8.source, _select(512), arch="sm_90")
    assert machine.spill_stores == machine.spill_loads == 0
    assert tensor_core_count(machine.sass) == 2 * 4 * 4 * 2


def _chain_step(text: str) -> list[sass.Instruction]:
    """The sm_90a path's chain step: the innermost loop around the first QGMMA that meets a barrier."""
    instructions, labels = sass.parse_instructions(text)
    first = next(i.address for i in instructions if i.opcode[0] == "QGMMA")
    spans = sorted(
        (end - start, start, end) for start, end in sass.loop_spans(instructions, labels) if start <= first <= end
    )
    for _, start, end in spans:
        body = [i for i in instructions if start <= i.address <= end]
        if any(i.opcode[0] == "BAR" for i in body):
            return body
    raise AssertionError("no loop around the first QGMMA meets a barrier")


@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize(
    ("cap", "vector"),
    [
        (512, 3),
        (512, 3 | INDEX_TILE_PAGES | INDEX_PAIRED_TOKENS),
        pytest.param(512, 3 | INDEX_TILE_PAGES, marks=pytest.mark.slow),  # 5 s a build
        pytest.param(4096, 3, marks=pytest.mark.slow),
    ],
)
def test_the_fused_kernels_sm90a_path_scores_with_the_scorers_qgmma_chain(cap, vector):
    # head_dim 128 on sm_90a: the scorer's chain of 4 QGMMA (m64n64k32), a token's or a pair's
    # (kp::wgmma_pair_logits, INDEX_PAIRED_TOKENS), no spills; its tiles and the token's queries live in dynamic
    # shared memory, so the static memory is the selection's alone, as on sm_90.
    machine = sass.summarize_sass(INDEX_SELECT_FP8.source, _select(cap, MMA_WGMMA, vector), arch="sm_90a")
    plain = _shared_bytes(INDEX_SELECT_FP8.source, _select(cap), "sm_90")
    assert tensor_core_opcodes(machine.sass) == {"QGMMA": 4}
    assert machine.spill_stores == machine.spill_loads == 0
    assert local_accesses_in_loops(machine.sass) == []
    assert machine.shared_bytes <= plain + 1024, (machine.shared_bytes, plain)  # the select's buffers, not tiles
    # Two blocks an SM by registers (65,536 / 256 threads / 2), which its launch bounds ask of ptxas. With both
    # ways of copying a tile in one kernel ptxas wanted 198 and spilled: the host picks one (INDEX_TILE_PAGES).
    assert machine.registers <= 128
    # Each chain's keys stream through the warpgroup's ring (kernels/kpool_index_select.cu): in a chain step
    # one barrier, one wait for the copies (DEPBAR), the tile's copies issued as cp.async (LDGSTS), and no
    # synchronous load but the table's: one read a tile from one page, else one a row of the thread's 4 (the
    # old step loaded each row's page, bytes and scale, 12 loads, and met two barriers).
    step = [i.opcode[0] for i in _chain_step(machine.sass)]
    assert step.count("BAR") == 1 and step.count("DEPBAR") == 1 and step.count("LDGSTS") >= 5, step
    assert step.count("LDG") == (1 if vector & INDEX_TILE_PAGES else 4), step.count("LDG")


@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize(
    ("arch", "head_dim", "vector"),
    [
        ("sm_120", 64, 1),
        pytest.param("sm_89", 64, 1, marks=pytest.mark.slow),  # 5 s a build: one in the default tier
        pytest.param("sm_120", 64, 3, marks=pytest.mark.slow),
        pytest.param("sm_80", 256, 3, marks=pytest.mark.slow),
    ],
)
def test_no_mma_sync_build_of_the_fused_kernel_spills_in_its_loops(arch, head_dim, vector):
    # With a warp's next key tile waiting in registers, ptxas held these builds to 128 registers and spilled in
    # the chunk loop (15 to 87 local accesses there) while the launch bounds gave no block count; with one block
    # an SM said (the mma.sync paths hold one), it takes what it needs (160 to 255 registers) and spills none.
    mma = MMA_F16 if arch == "sm_80" else MMA_E4M3
    name = INDEX_SELECT_FP8.instance(HEAD_DIM=head_dim, MMA=mma, VECTOR=vector, CAP=512, IO=I32, IC=I32,
                                     PAGED=True, COMPACT=False)  # fmt: skip
    machine = sass.summarize_sass(INDEX_SELECT_FP8.source, name, arch=arch)
    assert local_accesses_in_loops(machine.sass) == [] and machine.spill_stores == 0, machine.registers


@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize("head_dim", [256, pytest.param(64, marks=pytest.mark.slow)])  # 5 s a build
def test_no_sm90a_build_of_the_fused_kernel_reading_keys_row_by_row_spills(head_dim):
    # Two blocks an SM hold the sm_90a path to 128 registers. Head_dim 256 read row by row spilled 16 bytes there
    # (and head_dim 64 and 128 too once a seed took several chunks) while a block's group and split came of a
    # 64-bit division (blockIdx.x / splits, kept in local memory from the kernel's start to its rows' writing);
    # 32-bit now (121 registers at 256; head_dim 128 in the chain test above).
    name = INDEX_SELECT_FP8.instance(HEAD_DIM=head_dim, MMA=MMA_WGMMA, VECTOR=3, CAP=512, IO=I32, IC=I32, PAGED=True,
                                     COMPACT=True)  # fmt: skip
    machine = sass.summarize_sass(INDEX_SELECT_FP8.source, name, arch="sm_90a")
    assert machine.spill_stores == machine.spill_loads == 0, machine.registers
    assert machine.registers <= 128


def _call_loop(text: str) -> list[sass.Instruction]:
    """The mma.sync path's call loop: the largest loop around the first tensor-core instruction that meets no
    barrier (the chunk's loop around it meets the selection's)."""
    instructions, labels = sass.parse_instructions(text)
    first = next(i.address for i in instructions if i.opcode[0] in ("HMMA", "QMMA"))
    best: list[sass.Instruction] = []
    for start, end in sass.loop_spans(instructions, labels):
        body = [i for i in instructions if start <= i.address <= end]
        if start <= first <= end and not any(i.opcode[0] == "BAR" for i in body) and len(body) > len(best):
            best = body
    return best


def _calls(text: str) -> list[list[sass.Instruction]]:
    """The call loop's body cut into its calls: each ends with its token loop (the outermost loops inside the
    call loop around a tensor-core instruction), two a trip where the loop is unrolled by 2."""
    body = _call_loop(text)
    instructions, labels = sass.parse_instructions(text)
    first, last = body[0].address, body[-1].address
    tensor = [i.address for i in body if i.opcode[0] in ("HMMA", "QMMA")]
    inner = [
        (start, end)
        for start, end in sass.loop_spans(instructions, labels)
        if first <= start and end <= last and (start, end) != (first, last) and any(start <= a <= end for a in tensor)
    ]
    tokens = sorted(span for span in inner if not any(o != span and o[0] <= span[0] and span[1] <= o[1] for o in inner))
    calls, begin = [], first
    for _, end in tokens:
        calls.append([i for i in body if begin <= i.address <= end])
        begin = end + 1
    return calls


def _waits_on_its_own_loads(call: list[sass.Instruction], loads: int) -> list[sass.Instruction]:
    """The instructions of a call, up to its ``loads``-th global load, that read (through registers or a guard)
    data a load of the same call brought: issuing in order, the warp would hold every later load behind them."""
    last = [i.address for i in call if i.opcode[0] == "LDG"][loads - 1]
    brought: set[str] = set()
    waits = []
    for instruction in call:
        if instruction.address > last:
            break
        written, read = operands_of(instruction)
        read = [*read, instruction.guard.lstrip("!")] if instruction.guard else read
        if any(register in brought for register in read):
            waits.append(instruction)
            brought |= set(written)
        elif not instruction.guard:  # a guarded write may not happen: what the register held may stay
            brought -= set(written)
        if instruction.opcode[0] == "LDG":
            brought |= set(written)
    return waits


@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize("arch", ["sm_90", pytest.param("sm_89", marks=pytest.mark.slow)])  # 5 s a build
def test_the_fused_kernels_mma_sync_path_loads_its_next_tile_while_it_scores_this_one(arch):
    # Each warp's key rows arrive a tile ahead and their pages two ahead, across chunks (as the scorer's walk):
    # a call's first 16 global loads are its key fetch (4 tiles: the next-but-one tile's page, this tile's two
    # 16-byte row pieces and scale), and none issues after an instruction that waits for the data of another
    # load of the call. Until 2026-12-06 a call found its pages, then loaded their rows, then scored: its loads
    # sat at three depths (tools/load_depth.py). The loop runs two calls a trip, so the tiles' registers
    # alternate with no copy between them. (The fetch's loads may still sit at two depths: ptxas may issue a
    # table read before the check of a page read a call ago, which the in-order rule counts as a wait. After the
    # fetch a call may hold its first token's query rows, whose conversion waits for them, where ptxas peels
    # the token loop's first head tile.)
    machine = sass.summarize_sass(INDEX_SELECT_FP8.source, _select(512), arch=arch)
    calls = _calls(machine.sass)
    assert len(calls) == 2, [len(call) for call in calls]
    for call in calls:
        assert sum(i.opcode[0] == "LDG" for i in call) >= 16
        assert _waits_on_its_own_loads(call, 16) == []
    assert machine.spill_stores == machine.spill_loads == 0


@pytest.mark.slow
@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_largest_buffers_fit_static_shared_memory(arch):
    # pool_topk up to 4096: a buffer of 4096 + 1024 keys and ids (40 KiB). kpool_index_topk holds it in static
    # shared memory. The fused select holds one a token of its group, with the token's chunk of 1024 logits
    # (4 KiB), in dynamic shared memory (kernel.geometry.index_select_shared_bytes); its static memory is the
    # group's requests and visible counts and the merge's scalars.
    mma = MMA_F16 if arch == "sm_80" else MMA_E4M3
    for source, name, least, most in (
        (INDEX_TOPK.source, _topk(4096), 40 * 1024, STATIC_SHARED_LIMIT),
        (INDEX_SELECT_FP8.source, _select(4096, mma), 1, 1024),
    ):
        shared = _shared_bytes(source, name, arch)
        assert least <= shared <= most, (name, arch, shared)
        machine = sass.summarize_sass(source, name, arch=arch)
        assert local_accesses_in_loops(machine.sass) == [], (name, arch)
