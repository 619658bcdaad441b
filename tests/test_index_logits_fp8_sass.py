"""The scorer's machine code, read off the SASS of exactly what the GPU path compiles (no GPU needed).

Per warp and 16-head tile the kernel issues NT key tiles x head_dim / 32 mma steps; each step is one QMMA on
sm_89 (e4m3 mma.sync), two HMMA.16816 on sm_80 (the f16 path: two m16n8k16 a step) and two HMMA on sm_90
(f16 mma.sync on e4m3 the hardware converts, a key tile's once: sm_90 has no e4m3 mma.sync, and Hopper's FP8
rate needs wgmma). A lane reads head_dim / 4 bytes of each of its NT keys, head_dim / 64 16-byte loads each,
at three places: the walk's first tile, the load-ahead of the next, and a tile's token of another request than
the lead's. Query rows come from the shared stage, not from global memory.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

from kpool_cupy.cli import main
from kpool_cupy.kernel.declarations import (
    INDEX_LOGITS_FP8,
    INDEX_SELECT_FP8,
    INDEX_VECTOR_CACHE,
    INDEX_VECTOR_Q,
    MMA_E4M3,
    MMA_E4M3_HMMA,
    MMA_F16,
    MMA_WGMMA,
)
from kpool_cupy.kernel.nvrtc import kernel_ptx
from kpool_cupy.kernel.sources import kernel_source, kernels_dir
from kpool_cupy.tools import sass, scorer_paths
from kpool_cupy.tools.load_depth import depth_before_first, load_depth
from kpool_cupy.tools.sass_report import tensor_core_count, tensor_core_opcodes
from kpool_cupy.tools.scorer_paths import engine_path_code

# (path, instructions a step): sm_90 has no e4m3 mma.sync, and takes f16 on converted e4m3 (MMA_E4M3_HMMA)
ARCHES = {"sm_80": (MMA_F16, 2), "sm_89": (MMA_E4M3, 1), "sm_90": (MMA_E4M3_HMMA, 2)}
ARCH_PATHS = {**{arch: mma for arch, (mma, _) in ARCHES.items()}, "sm_90a": MMA_WGMMA}


def key_tiles(head_dim: int, mma: int) -> int:
    return 2 if head_dim > 128 or (mma == MMA_F16 and head_dim == 128) else 4


def scorer_sass(head_dim: int, arch: str, vector: int = INDEX_VECTOR_CACHE | INDEX_VECTOR_Q) -> sass.SassSummary:
    mma = ARCH_PATHS[arch]
    name = INDEX_LOGITS_FP8.instance(HEAD_DIM=head_dim, MMA=mma, VECTOR=vector)
    return sass.summarize_sass(INDEX_LOGITS_FP8.source, name, arch=arch)


def mma_inside_a_loop(text: str) -> bool:
    """Every mma instruction lies between a backward branch and its target: the head-tile loop's body."""
    instructions, labels = sass.parse_instructions(text)
    loops = sass.loop_spans(instructions, labels)
    mmas = [i.address for i in instructions if i.opcode[0] in ("HMMA", "QMMA", "QGMMA")]
    return bool(mmas) and all(any(start <= a <= end for start, end in loops) for a in mmas)


def divisions_in_loops(text: str) -> int:
    """Calls of the 64-bit division and remainder subroutines inside any loop."""
    instructions, labels = sass.parse_instructions(text)
    loops = sass.loop_spans(instructions, labels)
    calls = [
        i.address for i in instructions if i.opcode[0] == "CALL" and ("_div_" in i.operands or "_rem_" in i.operands)
    ]
    return sum(any(start <= a <= end for start, end in loops) for a in calls)


def _check(head_dim: int, arch: str) -> None:
    mma, per_step = ARCHES[arch]
    machine = scorer_sass(head_dim, arch)
    tiles = key_tiles(head_dim, mma)
    assert machine.spill_stores == machine.spill_loads == 0, (head_dim, arch)
    assert tensor_core_count(machine.sass) == tiles * (head_dim // 32) * per_step, (head_dim, arch)
    assert machine.vector_loads >= 3 * tiles * (head_dim // 64), (head_dim, arch)
    assert "LDG.E.U8" not in machine.sass, (head_dim, arch)  # aligned: no byte loads
    assert mma_inside_a_loop(machine.sass), (head_dim, arch)
    assert divisions_in_loops(machine.sass) == 0, (head_dim, arch)


@pytest.mark.usefixtures("sass_tools")
def test_the_engines_shape_scores_on_tensor_cores_with_16_byte_loads_and_no_spills():
    # head_dim 128 on an H200 (sm_90): 4 key tiles x 4 steps x 2 HMMAs, 8 16-byte key loads a lane at each of
    # three places, no 64-bit division in the walk.
    _check(128, "sm_90")


@pytest.mark.slow
@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize("arch", list(ARCHES))
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_every_head_dim_on_every_path(head_dim, arch):
    _check(head_dim, arch)


@pytest.mark.usefixtures("sass_tools")
def test_pages_and_queries_without_16_byte_alignment_take_no_16_byte_loads():
    machine = scorer_sass(128, "sm_90", vector=0)
    assert machine.vector_loads == 0 and machine.spill_stores == 0
    assert tensor_core_count(machine.sass) == 32
    assert "LDG.E.U8" in machine.sass  # the stage reads unaligned query rows byte by byte


def head_tile_loops(text: str) -> list[tuple[list[sass.Instruction], list[sass.Instruction]]]:
    """The loops around tensor-core instructions that hold no other such loop, a token's 16-head tiles (one in
    the scorer, one a call of the fused select's loop, which runs two calls a trip), each with the smallest loop
    around it (the loop over the tokens)."""
    instructions, labels = sass.parse_instructions(text)
    loops = sass.loop_spans(instructions, labels)
    inner = sass.innermost_loops(instructions, labels, ("HMMA", "QMMA"))

    def body(span: tuple[int, int]) -> list[sass.Instruction]:
        return [i for i in instructions if span[0] <= i.address <= span[1]]

    found = []
    for span in inner:
        around = min((o for o in loops if o != span and o[0] <= span[0] and span[1] <= o[1]), key=lambda o: o[1] - o[0])
        found.append((body(span), body(around)))
    return found


@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize("kernel", [INDEX_LOGITS_FP8, INDEX_SELECT_FP8], ids=["scorer", "select"])
@pytest.mark.parametrize("head_dim", [128, pytest.param(64, marks=pytest.mark.slow), 256])
def test_sm90_converts_a_tokens_queries_at_each_head_tile_and_the_keys_once_a_tile(kernel, head_dim):
    # sm_90 has no e4m3 mma.sync: ptxas lowered it to f16 HMMAs, converting both operands (F2FP) at every
    # instruction and adding each step's sum to C apart (FADD). In the head-tile loop at head_dim 128 that was
    # 96 F2FP and 80 FADD of 317 instructions in the scorer and 344 in the select (the e4m3 build for sm_90,
    # 2026-12-06); 185 and 215 on this path (146 and 153 since 2026-12-07). The loop converts only the token's
    # two query rows (8 F2FP a step), and C runs through the HMMAs: the only adds are the weighted terms', each
    # one FFMA after one FMNMX for its relu (4 a key tile: two keys a lane, two heads; until 2026-12-07 an FADD
    # after an FMUL, and a compare and a select for the relu).
    # The rows' and weights' addresses step a tile at a time: no 64-bit multiply (IMAD.WIDE) and no parameter
    # reloaded (LDC) in the loop, where the select's took 25 instructions a tile for them (215 then, 190 now).
    # Around it, the loop over the tokens converts no key (the select) or one tile's keys, for a token of another
    # request than the tile's lead (the scorer, 4 F2FP a key tile and step): a warp's keys are converted when it
    # takes them, not for each token.
    template = {"HEAD_DIM": head_dim, "MMA": MMA_E4M3_HMMA, "VECTOR": INDEX_VECTOR_CACHE | INDEX_VECTOR_Q}
    if kernel is INDEX_SELECT_FP8:
        template |= {"CAP": 512, "IO": np.dtype(np.int32), "IC": np.dtype(np.int32), "PAGED": True, "COMPACT": True}
    machine = sass.summarize_sass(kernel.source, kernel.instance(**template), arch="sm_90")
    loops = head_tile_loops(machine.sass)
    assert len(loops) == (2 if kernel is INDEX_SELECT_FP8 and head_dim < 256 else 1), [len(loop) for loop in loops]
    tiles = key_tiles(head_dim, MMA_E4M3_HMMA)
    for loop, tokens in loops:
        opcodes = [i.opcode[0] for i in loop]
        assert opcodes.count("HMMA") == 2 * tiles * (head_dim // 32)
        assert opcodes.count("F2FP") == 8 * (head_dim // 32), opcodes.count("F2FP")
        assert opcodes.count("FADD") == 0, opcodes.count("FADD")
        assert opcodes.count("FFMA") == opcodes.count("FMNMX") == 4 * tiles, (
            opcodes.count("FFMA"),
            opcodes.count("FMNMX"),
        )
        assert not [i for i in loop if i.opcode[:2] == ("IMAD", "WIDE") or i.opcode[0] == "LDC"]
        reloaded = 4 * tiles * (head_dim // 32) if kernel is INDEX_LOGITS_FP8 else 0
        assert [i.opcode[0] for i in tokens].count("F2FP") - opcodes.count("F2FP") == reloaded
    assert machine.spill_stores == machine.spill_loads == 0


@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize("kernel", [INDEX_LOGITS_FP8, INDEX_SELECT_FP8], ids=["scorer", "select"])
@pytest.mark.parametrize(
    ("arch", "head_dim"), [("sm_90", 128), ("sm_89", 256), pytest.param("sm_89", 64, marks=pytest.mark.slow)]
)
def test_a_tokens_head_sums_leave_each_lane_its_own_tiles_logits(kernel, arch, head_dim):
    # kp::own_tile_sums: a lane writes only tile g's two logits, so the column's 8 lanes halve what they exchange
    # at g's bits below log2 NT and take the butterfly's last steps on two values: 8 shuffles a token at 4 key
    # tiles, 6 at 2, where the butterfly of every value took 24 and 12 (the same sums: each step adds a lane's
    # partial and its partner's of the same tile). The scorer's loop over tokens also holds the 4 NT shuffles of
    # a token of another request than the tile's lead (kp::share_key_scales).
    mma, _ = ARCHES[arch]
    template = {"HEAD_DIM": head_dim, "MMA": mma, "VECTOR": INDEX_VECTOR_CACHE | INDEX_VECTOR_Q}
    if kernel is INDEX_SELECT_FP8:
        template |= {"CAP": 512, "IO": np.dtype(np.int32), "IC": np.dtype(np.int32), "PAGED": True, "COMPACT": True}
    machine = sass.summarize_sass(kernel.source, kernel.instance(**template), arch=arch)
    tiles = key_tiles(head_dim, mma)
    halvings = tiles.bit_length() - 1  # log2 NT of g's 3 bits
    own = 2 * (tiles - 1) + 2 * (3 - halvings)
    want = own + (4 * tiles if kernel is INDEX_LOGITS_FP8 else 0)
    shuffles = [[i.opcode[0] for i in tokens].count("SHFL") for _, tokens in head_tile_loops(machine.sass)]
    assert shuffles and all(count == want for count in shuffles), (shuffles, want)


def _engine_path_sass(
    mma: int = MMA_E4M3_HMMA, arch: str = "sm_90", one_page: bool | None = None, full_chunks: bool | None = None
) -> str:
    """The scorer's SASS at head_dim 128 on the path an engine's step takes (tools/scorer_paths.py: no search step
    past 512 requests, no tile across requests); on sm_90a with ``one_page`` True or False, the walk's tiles
    always or never in one page (else as the page size says), with ``full_chunks`` True or False, its chunks of
    64 heads always or never full (else both ways)."""
    name = INDEX_LOGITS_FP8.instance(HEAD_DIM=128, MMA=mma, VECTOR=INDEX_VECTOR_CACHE | INDEX_VECTOR_Q)
    return sass.summarize_code_sass(engine_path_code(one_page, full_chunks), name, arch=arch).sass


def test_the_engine_path_cut_follows_the_kernel(monkeypatch):
    # Each statement cut is in the kernel once (a changed kernel fails here, not in a silently uncut SASS).
    code = engine_path_code(one_page=True)
    for statement in (*scorer_paths.PAST_THE_TREE, *scorer_paths.ANOTHER_REQUEST, scorer_paths.ONE_PAGE):
        assert statement not in code
    assert code.count("if (false) {") == 2 and "const bool one_page = kVectorCache;" in code
    # The rule for a chunk of heads, fixed either way, in the scorer's text and the fused select's.
    assert scorer_paths.FULL_CHUNK in code
    for full in (True, False):
        fixed = engine_path_code(full_chunks=full)
        assert scorer_paths.FULL_CHUNK not in fixed and f"if ({str(full).lower()})" in fixed
        select = scorer_paths.chunk_rule_code(kernel_source(INDEX_SELECT_FP8.source), full)
        assert scorer_paths.FULL_CHUNK not in select
    monkeypatch.setattr(scorer_paths, "kernel_source", lambda source: "an older kernel")
    with pytest.raises(ValueError, match=r"holds 0 of .*expected 1"):
        engine_path_code()


@pytest.mark.usefixtures("sass_tools")
def test_the_block_reads_its_queries_weights_and_request_tree_in_one_round_trip():
    text = scorer_sass(128, "sm_90").sass
    instructions, _ = sass.parse_instructions(text)
    first_barrier = min(i.address for i in instructions if i.opcode[0] == "BAR")
    depths = load_depth(text).loads
    before = [depth for address, depth in depths.items() if address < first_barrier]
    assert len(before) >= 8 and max(before) == 1, sorted(before)  # tree nodes, weights, 16-byte query pieces


@pytest.mark.usefixtures("sass_tools")
def test_the_first_mma_waits_through_three_round_trips_on_the_decode_path():
    # In-order issue (tools/load_depth.py): the tree with the queries, the pages, the key rows. Each path cut out
    # adds to it: a search step past 512 requests one round trip, a tile across requests two (its token's pages
    # and rows, after the lead's).
    assert depth_before_first(_engine_path_sass()) == 3
    assert depth_before_first(scorer_sass(128, "sm_90").sass) == 6


@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_the_sm90a_build_scores_with_one_qgmma_chain_a_tile(head_dim):
    # head_dim / 32 QGMMA (m64n64k32, one k-step each) in the token loop, no spills, no 64-bit division in a loop.
    # The keys arrive by cp.async (LDGSTS) at three places: the ring's first two tiles and the walk's tile two
    # ahead, each head_dim / 32 pieces and as many scales a thread (a tile is 64 rows); DEPBAR waits for them.
    # Static shared memory is the request tree's and the tokens' alone: the stage and the ring are dynamic.
    machine = scorer_sass(head_dim, "sm_90a")
    instructions = [i.opcode[0] for i in sass.parse_instructions(machine.sass)[0]]
    assert tensor_core_opcodes(machine.sass) == {"QGMMA": head_dim // 32}
    assert machine.spill_stores == machine.spill_loads == 0
    assert mma_inside_a_loop(machine.sass)
    assert divisions_in_loops(machine.sass) == 0
    # Row by row, a thread's pieces and as many scales; a tile in one page, its pieces and one 16-byte copy of 4
    # scales, on each side of the branch on the page's presence (zeros landed without a read where it is missing).
    pieces = head_dim // 32
    row_by_row, one_page = 2 * pieces, 2 * (pieces + 1)
    assert instructions.count("LDGSTS") == 3 * (row_by_row + one_page) and "DEPBAR" in instructions
    # A key's row of the product lies in one warp's 4 threads (the keys on M): its head sum crosses them in a
    # butterfly of 2 shuffles, 4 for a thread's two rows, and no warp waits for another (the sums by halves
    # across 8 threads and then 4 warps through shared memory took 14 shuffles and 2 barriers a token at 128).
    assert instructions.count("SHFL") == 4
    # kp::RequestTree's 8,200 bytes, the tokens' 384 and what ptxas aligns and reserves; a tile would add 8 KB.
    assert machine.shared_bytes < 10 * 1024


@pytest.mark.usefixtures("sass_tools")
def test_every_tile_the_threads_wrote_is_fenced_for_the_wgmma():
    # What the threads store or copy into shared memory (the generic proxy) reaches a wgmma (the async proxy) only
    # after fence.proxy.async: the emulator cannot see a missing one, so the PTX is held to it. The scorer fences
    # its ring's tile (and the staged queries, in the walk's first step) and its spare tile, the fused select each
    # chain's tile (and its staged queries, in the first chain); each fence comes before the next wgmma chain.
    for kernel, name, fences in (
        (INDEX_LOGITS_FP8, INDEX_LOGITS_FP8.instance(HEAD_DIM=128, MMA=MMA_WGMMA, VECTOR=3), 2),
        (INDEX_SELECT_FP8, INDEX_SELECT_FP8.instance(HEAD_DIM=128, MMA=MMA_WGMMA, VECTOR=3, CAP=512), 1),
    ):
        ptx = kernel_ptx(kernel.source, name, "compute_90a")
        lines = [line.strip() for line in ptx.splitlines()]
        fence_lines = [i for i, line in enumerate(lines) if line.startswith("fence.proxy.async.shared::cta")]
        chains = [i for i, line in enumerate(lines) if line.startswith("wgmma.fence.sync.aligned")]
        assert len(fence_lines) == fences, (name, fence_lines)
        assert chains and min(fence_lines) < min(chains), name


def _walk(text: str) -> list[sass.Instruction]:
    """The instructions of the longest loop: the walk's step."""
    instructions, labels = sass.parse_instructions(text)
    spans = sass.loop_spans(instructions, labels)
    start, end = max(spans, key=lambda span: sum(span[0] <= i.address <= span[1] for i in instructions))
    return [i for i in instructions if start <= i.address <= end]


@pytest.mark.usefixtures("sass_tools")
def test_a_tile_in_one_page_is_found_and_copied_once_a_tile():
    # The sm_90a walk on the decode path: where the pages hold a multiple of 64 pools (the engines' 64), a step
    # reads the table once (one LDG for the tile's page where row by row a thread reads it for each of its 4
    # rows) and its copies take one address (4 row copies and one of 4 scales; row by row each row's copy and
    # scale), which leaves a step about 2/3 of the row-by-row one's instructions (seen: 400 and 597, with the
    # engines' 64 heads filling their chunk).
    one_page = _walk(_engine_path_sass(MMA_WGMMA, "sm_90a", one_page=True, full_chunks=True))
    row_by_row = _walk(_engine_path_sass(MMA_WGMMA, "sm_90a", one_page=False, full_chunks=True))
    loads = [sum(i.opcode[0] == "LDG" for i in walk) for walk in (one_page, row_by_row)]
    assert loads == [1, 4], loads
    assert len(one_page) < 0.7 * len(row_by_row), (len(one_page), len(row_by_row))


@pytest.mark.usefixtures("sass_tools")
def test_the_first_qgmma_waits_through_three_round_trips_on_the_decode_path():
    # The same three as the mma.sync path's: the tree with the queries and weights, the pages, the key rows.
    assert depth_before_first(_engine_path_sass(MMA_WGMMA, "sm_90a")) == 3


@pytest.mark.slow
@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize(
    ("arch", "instructions", "registers_at_most", "blocks", "shared"),
    [
        ("sm_80", "16 HMMA", 200, 3, 47288),  # the f16 path: 2 key tiles x 4 steps x 2 m16n8k16
        ("sm_89", "16 QMMA", 200, 2, 47288),  # native e4m3 mma.sync: 4 key tiles x 4 steps
        ("sm_90", "32 HMMA", 240, 2, 47288),  # f16 mma.sync on converted e4m3: two HMMAs a step
        ("sm_90a", "4 QGMMA", 140, 4, 9216),  # wgmma m64n64k32: one chain of 4 k-steps; the stage and ring dynamic
        ("sm_120", "16 QMMA", 200, 2, 47288),
    ],
)
def test_ptx_sass_reports_the_scorers_instructions_registers_and_blocks_at_the_engine_shape(
    arch, instructions, registers_at_most, blocks, shared
):
    # The counts `kpool-cupy ptx --sass` prints for head_dim 128, what the engines run, and no spills. Blocks an
    # SM: on sm_80 the registers and the 164 KiB of shared memory both allow 3; the registers bind sm_90 (its
    # 228 KiB would hold 4 of the 47 KB stages); on sm_90a 128 registers allow 4, and so do its 9 KB static and
    # 42 KiB dynamic shared memory a decode block of 64 heads (the report's line); the stage binds sm_89 and sm_120
    # (100 KiB).
    result = CliRunner().invoke(
        main, ["ptx", "--sass", "--op", "index_logits_fp8", "--head-dim", "128", "--arch", arch]
    )
    assert result.exit_code == 0, result.output
    lines = {line[:42].strip(): line[42:].strip() for line in result.output.splitlines()[1:]}
    assert lines["tensor-core instructions"] == instructions
    assert int(lines["registers"]) <= registers_at_most
    assert lines["spill stores/loads"] == "0 / 0 bytes"
    assert lines["blocks per SM (128-thread blocks)"] == str(blocks)
    assert lines["static shared memory a block"] == f"{shared} bytes"
    dynamic = lines.get("dynamic shared memory a block (h64)")
    assert dynamic == ("43264 bytes" if arch == "sm_90a" else None), dynamic  # 3 + 1 tiles of 8.5 KB, 8.25 KB of q
    # The sm_90a ring's cp.async stages, read off the waits, are the header's; the mma.sync paths have none.
    stages = re.search(r"kWgmmaStages = (\d+);", (kernels_dir() / "kpool_index_wgmma.cuh").read_text()).group(1)
    assert lines.get("cp.async pipeline stages") == (stages if arch == "sm_90a" else None)


@pytest.mark.usefixtures("sass_tools")
def test_a_chunk_the_heads_fill_adds_them_with_no_predicate():
    # The sm_90a path's head sums (kp::add_heads) on the engine path, each rule of a chunk of 64 heads fixed: the
    # loop around a chunk's QGMMA chain adds its 32 weighted relus a thread with 32 FFMA either way; where the
    # heads fill the chunk (the engines' 64) none has a predicate and no head index is compared, where they do
    # not (fewer than 64) each pair of adds waits on a compare (16 ISETP). Seen failing with add_heads calling
    # the predicated adds for a full chunk too.
    loops = {}
    for full in (True, False):
        instructions, labels = sass.parse_instructions(_engine_path_sass(MMA_WGMMA, "sm_90a", True, full))
        (span,) = sass.innermost_loops(instructions, labels, ("QGMMA",))
        loops[full] = [i for i in instructions if span[0] <= i.address <= span[1]]
    for full, loop in loops.items():
        adds = [i for i in loop if i.opcode[0] == "FFMA"]
        compares = sum(i.opcode[0] == "ISETP" for i in loop)
        assert len(adds) == 32 and sum(i.predicated for i in adds) == (0 if full else 32), (full, adds)
        assert compares <= 2 if full else compares >= 16, (full, compares)
    assert len(loops[True]) <= len(loops[False]) - 16, (len(loops[True]), len(loops[False]))
