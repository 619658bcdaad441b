"""scripts/bench_model.py, the prediction table of docs/benchmarks.md: its bounds do what its docstring says,
it models the variant the benchmark launches, and it has a row for every kernel the benchmark launches."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kpool_cupy.kernel.geometry import LaunchGeometry
from kpool_cupy.tools.variants import OP_KERNELS

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def model():
    spec = importlib.util.spec_from_file_location("bench_model", ROOT / "scripts" / "bench_model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_model"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cases(model):
    return model.cases()


def _case(model, grid: int, block: int, nbytes: int):
    launch = SimpleNamespace(geometry=LaunchGeometry(grid=grid, block=block, items=grid * block))
    return model.Case("compress", "synthetic", nbytes, launch)


def test_fewer_blocks_per_sm_lower_the_reachable_bandwidth(model):
    # Little's law: with 16 bytes a thread in flight, a full GPU of 2048-thread SMs holds 4.3 MB, short of
    # 4.8 TB/s * 600 ns; registers that let an SM hold fewer blocks must lower the bandwidth and slow the row.
    case = _case(model, grid=100_000, block=256, nbytes=1 << 30)
    light = model.Variant(instructions=1, loop_body=0, registers=32, depth=1, outstanding=16)
    heavy = model.Variant(instructions=1, loop_body=0, registers=128, depth=1, outstanding=16)
    many, few = model.predict(case, light), model.predict(case, heavy)
    assert few.blocks_per_sm < many.blocks_per_sm, (few.blocks_per_sm, many.blocks_per_sm)
    assert few.reachable < many.reachable <= model.BANDWIDTH, (few.reachable, many.reachable)
    assert few.predicted_us > many.predicted_us, (few.predicted_us, many.predicted_us)


def test_a_small_grid_reaches_less_than_a_full_one(model):
    # Resident blocks are the grid's when it does not fill the SMs: one block cannot keep HBM busy.
    v = model.Variant(instructions=1, loop_body=0, registers=32, depth=1, outstanding=256)
    one = model.predict(_case(model, grid=1, block=32, nbytes=1 << 20), v)
    full = model.predict(_case(model, grid=10_000, block=256, nbytes=1 << 20), v)
    assert one.resident_blocks == 1 and one.reachable < full.reachable == model.BANDWIDTH, (one, full)


def test_the_latency_term_is_the_load_depth_in_dram_round_trips(model):
    # A deeper chain of dependent loads waits one more DRAM latency per level, whatever the bytes.
    case = _case(model, grid=1, block=32, nbytes=64)
    shallow = model.predict(case, model.Variant(1, 0, 32, 1, 16))
    deep = model.predict(case, model.Variant(1, 0, 32, 4, 16))
    assert deep.bound == "latency", deep
    assert deep.predicted_us == pytest.approx(model.LAUNCH_US + 4 * model.DRAM_LATENCY * 1e6)
    assert deep.predicted_us > shallow.predicted_us


def test_every_kernel_the_benchmark_launches_has_a_row(cases):
    # The ops the benchmark calls (kpool_cupy.<op>( in kpool_cupy/bench/), read from its source, so a new
    # benchmark of another op fails here until the model covers it.
    called = set()
    for path in (ROOT / "kpool_cupy" / "bench").glob("*.py"):
        called |= set(re.findall(r"kpool_cupy\.(\w+)\(", path.read_text()))
    benchmarked = {op for op in OP_KERNELS if f"kpool_{op}" in called or op in called}
    families = {case.family for case in cases}
    assert benchmarked, "no op call found in kpool_cupy/bench/"
    assert benchmarked <= families, f"benchmarked ops without a model row: {sorted(benchmarked - families)}"


def test_the_decode_step_has_a_row_at_every_batch_and_next_n(cases):
    # The issue's grid: next_n 1, 2 and 4 at batches 1, 64 and 512, for the plain and the FP8 step.
    want = {f"decode-{r}x{n}" for r in (1, 64, 512) for n in (1, 2, 4)}
    for family in ("tail_update", "tail_update_fp8"):
        got = {case.shape for case in cases if case.family == family}
        assert got == want, (family, sorted(got ^ want))


def test_every_select_record_has_its_two_steps_rows(cases):
    # Issue 34 holds the fused select to its two-step (the scorer, then kpool_index_topk, on the same inputs):
    # each select shape has the fused call and the two-step's scorer on both builds, and its top-k row.
    fused = {case.shape for case in cases if case.family == "index_select_fp8"}
    assert fused, "no select rows"
    for family in ("index_select_fp8 sm_90a", "index_logits_fp8 two-step", "index_logits_fp8 two-step sm_90a"):
        assert {case.shape for case in cases if case.family == family} == fused, family
    assert fused <= {case.shape for case in cases if case.family == "index_topk"}


def test_the_rows_model_the_variant_the_benchmark_launches(cases):
    # The benchmark passes int64 pool offsets (bench.inputs) and int64 slots (bench.fp8): the model must
    # compile those instances, not the tools' all-int32 default.
    for case in cases:
        if case.family == "compress":
            assert case.launch.template["IP"].itemsize == 8, (case.shape, case.launch.instance)
        if case.family == "compress_fp8" and "(slots)" in case.shape:
            assert case.launch.template["ID"].itemsize == 8, (case.shape, case.launch.instance)


@pytest.mark.usefixtures("sass_tools")
def test_the_decode_step_is_predicted_latency_bound(model, cases):
    # A decode step moves a few KiB to a few MiB over two dependent loads: its rows must be bound by
    # load depth x DRAM latency, not by the bytes.
    for case in cases:
        if case.family.startswith("tail_update"):
            v = model.variant(case.launch.kernel.source, case.launch.instance)
            p = model.predict(case, v)
            assert v.depth >= 1, case.launch.instance
            assert p.predicted_us >= v.depth * model.DRAM_LATENCY * 1e6, (case.shape, p)
            assert p.bound == "latency", (case.family, case.shape, p)


@pytest.mark.usefixtures("sass_tools")
def test_a_topk_row_counts_the_cut_backs_its_logits_make(model, cases):
    # kpool_index_topk's rows count select_best's loops as the benchmark's logits run them (topk_traces): a tile
    # not cut back costs the tile loop's path, a cut-back its own code, radix select and compaction, a range
    # offered again its tiles twice. A count of the tile loop's whole body a tile, cut-back and all, made a row
    # that cuts back cost what one that does not costs. The random and rising rows both start from their sample's
    # threshold, cut back only at their end, and so cost the same.
    from dataclasses import replace

    from kpool_cupy.tools.selection_trace import Search, SelectionTrace

    rows = {case.shape: case for case in cases if case.family == "index_topk"}
    random, rising = rows["topk decode-512x1 128K top512"], rows["topk rising decode-512x1 128K top512"]
    assert random.launch.instance == rising.launch.instance
    for trace in random.traces + rising.traces:
        assert trace.seeded and not trace.cuts and trace.finish is not None and trace.tiles == 8, trace
    v = model.variant(random.launch.kernel.source, random.launch.instance)

    def per_thread(traces):
        c = replace(random, traces=traces)
        warps = c.launch.geometry.grid * (c.launch.geometry.block // 32)
        return model.predict(c, v).issue_us * 1e-6 * model.ISSUE_RATE / warps

    offer = v.selection.offer
    plain = SelectionTrace(8, True, (), 850, Search(2))
    cut = offer.cut_straight + offer.radix.issued(1500) + 2 * offer.compaction
    assert per_thread((replace(plain, cuts=(1500,)),)) - per_thread((plain,)) == pytest.approx(cut)
    assert per_thread((replace(plain, tiles=16),)) - per_thread((plain,)) == pytest.approx(8 * offer.path)


@pytest.mark.usefixtures("sass_tools")
def test_a_topk_row_counts_lists_and_a_merge_only_where_it_is_split(model, cases):
    # A row that one block selects returns from gather_splits at once: the model takes the published list and
    # the merge (SelectionLoops.publish and .merge, read off the SASS) out of its count. A row split over blocks
    # counts, averaged over its blocks, each block's select_best and list (SelectionLoops.published: its m-th
    # key's radix select as the trace ran it, or none) and the merge once a row (SelectionLoops.merged). Here
    # a launch of the same variant split in two, each half's select_best the one-block row's trace. The row's
    # writing (a pass of 1,024 columns: two at top 512 and kpool 4, both inside the pool columns with runs of
    # one pool and one page, so SelectionLoops.write_whole's loop) is the last block's: both passes in a block
    # a row, one in each of two on average. Seen failing with the writing's loop counted once a block whatever
    # the passes, and with the merge counted in every block.
    from dataclasses import replace

    from kpool_cupy.tools.selection_trace import Search, SelectionTrace, SplitTrace

    case = next(c for c in cases if c.family == "index_topk" and c.shape == "topk decode-512x1 128K top512")
    geometry = case.launch.geometry
    assert geometry.grid == geometry.items and case.traces and not case.split_traces  # a block a row
    one = replace(case, traces=case.traces[:1])
    merge = SelectionTrace(1, False, (), 562, finish_search=Search(3))
    halves = SplitTrace((one.traces[0],) * 2, (512, 512), (Search(2), None), merge)
    launch = replace(case.launch, geometry=replace(geometry, grid=2 * geometry.grid))
    split = replace(one, launch=launch, traces=(), split_traces=(halves,))
    v = model.variant(case.launch.kernel.source, case.launch.instance)

    def per_thread(c):
        warps = c.launch.geometry.grid * (c.launch.geometry.block // 32)
        return model.predict(c, v).issue_us * 1e-6 * model.ISSUE_RATE / warps

    loops = v.selection
    assert loops.merge > 1000 and loops.publish > 100, loops  # the merge: thousands
    assert case.launch.values["width"] == 2048 and 50 < loops.write_whole < loops.write, loops
    written = loops.write_whole  # a block a row: 2 passes; split in two: 1 a block
    lists = loops.published(512, Search(2)) + loops.published(512, None)
    assert per_thread(split) - per_thread(one) == pytest.approx((lists + loops.merged(merge)) / 2 - written)


@pytest.mark.usefixtures("sass_tools")
def test_the_fused_selects_rows_count_its_offers_as_they_ran(model, cases):
    # kpool_index_select_fp8's rows count each token's offers by a trace of its selection (offer_traces): a
    # chunk's offer that does not cut back costs the offer loop's path, each cut-back its own code, radix
    # select and compaction; without traces every chunk and further token counted the loop's whole body.
    from dataclasses import replace

    from kpool_cupy.tools.selection_trace import SelectionTrace

    case = next(c for c in cases if c.family == "index_select_fp8 sm_90a" and c.shape == "decode-512x2 128K h32")
    v = model.variant(case.launch.kernel.source, case.launch.instance, "sm_90a")
    tiles = 32
    none = SelectionTrace(tiles, True, (), None)
    every = SelectionTrace(tiles, True, (1500,) * tiles, None)

    def per_thread(c):
        warps = c.launch.geometry.grid * (c.launch.geometry.block // 32)
        return model.predict(c, v).issue_us * 1e-6 * model.ISSUE_RATE / warps

    offer = v.offer
    cut = offer.cut_straight + offer.radix.issued(1500) + 2 * offer.compaction
    got = per_thread(replace(case, offer_traces=(every,))) - per_thread(replace(case, offer_traces=(none,)))
    assert got == pytest.approx(case.offer_tokens * tiles * cut)
    assert per_thread(replace(case, offer_traces=(none,))) < per_thread(replace(case, offer_traces=()))
    assert case.offer_tokens == 2 and all(t.seeded for t in case.offer_traces), case.offer_traces


def test_an_expansion_row_charges_its_request_search_to_the_first_warp_alone(model, cases):
    # kpool_expand_topk's request search runs in a block's first warp (kp::block_expand_row), a round of five
    # levels a trip of its loop; the other seven warps branch over it to the block's barrier. The region found
    # in the SASS must be that search (its loop walks the nodes in shared memory), and a row is charged it once a
    # block, a trip of its loop a round past the first; a row without a table or tail, never.
    import dataclasses

    from kpool_cupy.kernel.sources import kernel_source
    from kpool_cupy.tools.expand_paths import whole_runs_code
    from kpool_cupy.tools.sass import parse_instructions, summarize_code_sass

    row = next(c for c in cases if c.family == "expand_topk" and c.shape == "512x512 paged-64")
    v = model.variant(row.launch.kernel.source, row.launch.instance, "sm_90", False, None, model.whole_runs(row))
    region, loop = v.first_warp
    assert 0 < loop < region < v.instructions, v.first_warp
    sass = summarize_code_sass(whole_runs_code(kernel_source(row.launch.kernel.source)), row.launch.instance).sass
    start, end = model.first_warp_span(sass)
    opcodes = {i.opcode[0] for i in parse_instructions(sass)[0] if start < i.address < end}
    assert {"LDG", "STS", "LDS"} <= opcodes, opcodes  # the nodes loaded, left in shared memory, walked
    assert row.first_warp_search == model.search_rounds(512) == 2  # 2 rounds up to 1,024 requests
    assert [model.search_rounds(b) for b in (1, 2, 32, 33, 1024, 1025)] == [0, 1, 1, 2, 2, 3]
    every_warp = model.predict(dataclasses.replace(row, first_warp_search=None), v).issue_us
    one_round = model.predict(dataclasses.replace(row, first_warp_search=1), v).issue_us
    two_rounds = model.predict(row, v).issue_us
    nobody = model.predict(dataclasses.replace(row, first_warp_search=0), v).issue_us
    assert nobody < one_round < two_rounds < every_warp, (nobody, one_round, two_rounds, every_warp)
    warps = row.launch.geometry.grid * row.launch.geometry.block // 32
    per_warp = v.instructions - region + (region + loop) / 8  # the first warp's two rounds, a block's mean
    assert two_rounds == pytest.approx(warps * per_warp / model.ISSUE_RATE * 1e6)


def test_the_request_search_walks_in_32_bits(model, cases):
    # kp::warp_request_rows on int32 offsets (the engines' and the bench's): requests as int, offsets compared as
    # int32 against the clamped token, a node's offset and length one shared load. On sm_90 its region took 217
    # instructions and a round's loop 148 on 2026-12-07; the 64-bit walk took 314 and 242. The bounds leave 5%.
    row = next(c for c in cases if c.family == "expand_topk" and c.shape == "512x512 paged-64")
    v = model.variant(row.launch.kernel.source, row.launch.instance, "sm_90", False, None, model.whole_runs(row))
    region, loop = v.first_warp
    assert region <= 228 and loop <= 156, v.first_warp
