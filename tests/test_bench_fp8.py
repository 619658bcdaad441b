"""The benchmark's FP8 records on the CPU: their shapes, byte counts and cache layout, and the unfused sequence
(kpool_compress to bf16, hadamard_quant_fp8, a scatter into the paged cache) against the fused op, bit for bit.

On a GPU the records time kpool_compress_fp8 into a paged cache against that
sequence, and hadamard_quant_fp8 on a decode step's queries. Here the
sequence runs with NumPy on the emulated kernels and the reference, and the
records' orchestration through the CuPy double. No test here times anything
or asserts a speed.
"""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner
from double import ROOT, run_on_double
from model import BF16, F32, make_batch

from kpool_cupy import emulate, pool_row_offsets, reference
from kpool_cupy.backends.cupy import gpu_status
from kpool_cupy.bench import fp8
from kpool_cupy.bench.lifecycle import decode_shapes
from kpool_cupy.bench.report import table
from kpool_cupy.bench.shapes import BenchShape, minimum_bytes, sweep
from kpool_cupy.cli import main

FP8_ROW = 128 + 4  # one FP8 row of head_dim 128: its bytes and a float32 scale


def test_the_fused_kernel_is_credited_with_k_and_gate_read_and_fp8_rows_written():
    # 2 requests: 9 tokens from position 0 (2 pools), 6 from position 3 (1 pool). ape is not counted,
    # as the compress sweep does not count it.
    shape = BenchShape("t", "mixed", (9, 6), (0, 3), head_dim=128, kpool=4)
    assert shape.pools == 3
    members = 3 * 4 * 128 * 2 * 2
    assert fp8.compress_fp8_bytes(shape) == members + 3 * FP8_ROW
    # The members as the compress sweep counts them; only the written row changes.
    assert fp8.compress_fp8_bytes(shape) == minimum_bytes(shape) - 3 * 128 * 2 + 3 * FP8_ROW
    wide = BenchShape("f", "mixed", (9, 6), (0, 3), 128, 4, "float32")
    assert fp8.compress_fp8_bytes(wide) == 2 * members + 3 * FP8_ROW
    # The unfused sequence: the bf16 rows written and read back, the FP8 rows written, read back and scattered.
    assert fp8.unfused_bytes(shape) == members + 2 * 3 * 128 * 2 + 3 * 3 * FP8_ROW


def test_the_query_side_is_credited_with_x_read_and_fp8_rows_written():
    rows = 64 * fp8.QUERY_HEADS
    assert fp8.hadamard_quant_bytes(rows, 128) == rows * 128 * 2 + rows * FP8_ROW
    assert fp8.hadamard_quant_bytes(rows, 128, itemsize=4) == rows * 128 * 4 + rows * FP8_ROW


def test_the_records_use_the_sweeps_decode_and_prefill_shapes_and_decode_batches():
    cases = fp8.fp8_cases()
    swept = {s.name: s for s in sweep()}
    assert all(swept[shape.name] == shape for shape, _ in cases)
    # Decode steps write through the block table, prefills through a slot mapping; both kinds, both targets.
    assert {(shape.kind, target) for shape, target in cases} == {("decode", fp8.TABLE), ("prefill", fp8.SLOTS)}
    assert all(shape.dtype == "bfloat16" and (shape.head_dim, shape.kpool) == (128, 4) for shape, _ in cases)
    quick = fp8.fp8_cases(quick=True)
    assert set(quick) < set(cases) and {target for _, target in quick} == {fp8.SLOTS, fp8.TABLE}
    # The query side at the batch sizes the decode records use: the decode side's and the compress sweep's.
    batches = {s.requests for s in decode_shapes()} | {s.requests for s in sweep() if s.kind == "decode"}
    assert set(fp8.query_batches()) == batches
    assert set(fp8.query_batches(quick=True)) < batches


def _pools_by_request(shape: BenchShape) -> list[tuple[int, int]]:
    """(request, q) of every pool in output order, written plainly: request b completes pools
    ceil(cache / kpool) .. (cache + length) // kpool - 1."""
    owners = []
    for b, (length, cached) in enumerate(zip(shape.lengths, shape.cache, strict=True)):
        first, last = -(-cached // shape.kpool), (cached + length) // shape.kpool
        owners += [(b, q) for q in range(first, last)]
    return owners


# Several pools per request, an empty request, cached prefixes at every phase mod kpool.
MIXED = BenchShape("m", "mixed", (13, 0, 7, 9, 4, 30), (0, 3, 2, 5, 4, 61), 64, 4)


def test_pool_owners_follow_the_ops_numbering():
    request, number = fp8.pool_owners(MIXED)
    assert request.dtype == number.dtype == np.int64
    assert list(zip(request.tolist(), number.tolist(), strict=True)) == _pools_by_request(MIXED)


def test_every_set_has_its_own_shuffled_pages_and_each_pool_its_own_slot():
    # Block size 4 so that a request's pools span several pages and the 61-token prefix starts mid-page.
    count, size = 3, 4
    places = fp8.paged_destinations(MIXED, count, size, np.random.default_rng(0))
    assert places.tables.dtype == np.int32 and places.slots.dtype == np.int64
    assert places.tables.shape[:2] == (count, MIXED.requests) and places.slots.shape == (count, MIXED.pools)
    owners = _pools_by_request(MIXED)
    reached = sorted({(b, q // size) for b, q in owners})
    assert places.pages == len(reached)
    for i in range(count):
        table = places.tables[i]
        # The pages the pools reach are set i's own pages, each once; no other entry is set.
        pages = [int(table[b, block]) for b, block in reached]
        assert sorted(pages) == list(range(i * places.pages, (i + 1) * places.pages))
        assert (table >= 0).sum() == len(reached)
        # The slots say what the block table says (the op's formula, written plainly).
        want = [table[b, q // size] * size + q % size for b, q in owners]
        assert places.slots[i].tolist() == want
        assert len(set(want)) == len(want)
    # Shuffled: not the pages in request order, and not the same order in every set.
    firsts = [places.tables[i][tuple(zip(*reached, strict=True))] - i * places.pages for i in range(count)]
    assert not np.array_equal(firsts[0], np.arange(places.pages))
    assert not all(np.array_equal(firsts[0], f) for f in firsts[1:])


def test_the_cache_views_write_each_pages_values_then_its_scales():
    pages, size, head_dim = 3, 4, 8
    cache = np.zeros((pages, size, head_dim + 4), np.uint8)
    values, scales = fp8.cache_views(np, cache)
    assert values.shape == (pages, size, head_dim) and scales.shape == (pages, size)
    values[2, 1] = np.arange(1, head_dim + 1)
    scales[2, 1] = np.float32(1.5)
    page = cache[2].reshape(-1)
    assert page[head_dim : 2 * head_dim].tolist() == list(range(1, head_dim + 1))
    assert page[size * head_dim + 4 : size * head_dim + 8].view(np.float32)[0] == 1.5
    # Nothing else written: 1.5 is 0x3fc00000, two non-zero bytes.
    assert np.count_nonzero(cache) == head_dim + 2
    with pytest.raises(ValueError, match="Invalid cache"):
        fp8.cache_views(np, cache[:, :, ::-1])


def _host_set(shape: BenchShape, dtype=BF16, seed: int = 0) -> SimpleNamespace:
    batch = make_batch(list(shape.lengths), list(shape.cache), head_dim=shape.head_dim, kpool=shape.kpool,
                       dtype=dtype, seed=seed)  # fmt: skip
    pools = pool_row_offsets(batch.input_row_offsets.astype(np.int64), batch.cache_lengths.astype(np.int64),
                             shape.kpool)  # fmt: skip
    return SimpleNamespace(**vars(batch), pool_row_offsets=pools)


def _unfused(module, s, shape: BenchShape, cache: np.ndarray, places, target: str, size: int) -> None:
    """The benchmark's unfused runner, with NumPy: set 0's slots or block table."""
    views = fp8.cache_views(np, cache)
    if target == fp8.SLOTS:
        page, entry = fp8.slot_places(np, places.slots[0], size)
    else:
        page, entry = fp8.table_places(np, places.tables[0], places.request, places.number, size)
    pooled = np.empty((shape.pools, shape.head_dim), BF16)
    values = np.empty((shape.pools, shape.head_dim), np.uint8)
    scales = np.empty(shape.pools, np.float32)
    fp8.unfused_compress_fp8(module, s, pooled, values, scales, lambda v, q: fp8.scatter_fp8(views, page, entry, v, q))


DECODE = BenchShape("d", "decode", (4,) * 6, (36, 4, 100, 8, 0, 252), 128, 4)  # one aligned pool per request
PREFILL = BenchShape("p", "prefill", (64, 23), (0, 0), 128, 4)


@pytest.mark.parametrize("target", [fp8.SLOTS, fp8.TABLE])
@pytest.mark.parametrize("shape", [DECODE, PREFILL, MIXED], ids=["decode", "prefill", "mixed"])
@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_the_unfused_sequence_writes_the_fused_ops_cache_bytes(module, shape, target):
    # The baseline the benchmark times must write what the fused op writes,
    # every byte of the cache: the values and scales where the pools land,
    # and nothing anywhere else (the cache starts as random bytes).
    size = 4
    places = fp8.paged_destinations(shape, 1, size, np.random.default_rng(2))
    s = _host_set(shape)
    rng = np.random.default_rng(3)
    before = rng.integers(0, 256, (places.pages, size, shape.head_dim + 4), dtype=np.uint8)
    fused, unfused = before.copy(), before.copy()
    where = {"slots": places.slots[0]} if target == fp8.SLOTS else {"block_table": places.tables[0]}
    args = (s.k, s.gate, s.ape, s.input_row_offsets, s.cache_lengths)
    assert module.kpool_compress_fp8(*args, pool_row_offsets=s.pool_row_offsets, cache=fused, **where) is None
    _unfused(module, s, shape, unfused, places, target, size)
    assert not np.array_equal(fused, before)  # the comparison below covers written bytes
    differ = np.argwhere(fused != unfused)
    assert differ.size == 0, f"{len(differ)} bytes differ, first at page, entry, byte {differ[:1].tolist()}"


def test_the_unfused_sequence_rounds_float32_keys_to_bf16_as_the_fused_op_does():
    # The key side rounds each pooled row to bf16 before the rotation, so
    # kpool_compress to bf16 then hadamard_quant_fp8 is the fused op for any k.
    shape = BenchShape("f", "mixed", MIXED.lengths, MIXED.cache, 64, 4, "float32")
    size = 4
    places = fp8.paged_destinations(shape, 1, size, np.random.default_rng(5))
    s = _host_set(shape, dtype=F32, seed=4)
    fused = np.zeros((places.pages, size, shape.head_dim + 4), np.uint8)
    unfused = fused.copy()
    args = (s.k, s.gate, s.ape, s.input_row_offsets, s.cache_lengths)
    emulate.kpool_compress_fp8(*args, pool_row_offsets=s.pool_row_offsets, cache=fused, slots=places.slots[0])
    _unfused(emulate, s, shape, unfused, places, fp8.SLOTS, size)
    np.testing.assert_array_equal(unfused, fused)


# The records' orchestration through the CuPy double: the fused op and the
# unfused sequence run on the emulator, the equality check on set 0 is the
# record's own.
_PRELUDE = """
import numpy as np
import cupy

assert cupy.__version__.endswith("numpy-double"), cupy.__file__
from kpool_cupy.bench import fp8
from kpool_cupy.bench.shapes import BenchShape

DECODE = BenchShape("tiny-decode", "decode", (4,) * 6, (36, 4, 100, 8, 0, 252), 128, 4)
PREFILL = BenchShape("tiny-prefill", "prefill", (64, 23), (0, 0), 128, 4)
"""


# A guard against a hang: the longest script (the query record) ran in 43 to 73 s (two busy cores, 2026-12-03).
DOUBLE_TIMEOUT_S = 900


def _on_the_double(body: str) -> None:
    done = run_on_double(_PRELUDE + textwrap.dedent(body) + "\nprint('ok')\n", timeout=DOUBLE_TIMEOUT_S)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-3000:]


@pytest.mark.slow
def test_the_compress_records_check_the_unfused_bytes_and_time_both():
    _on_the_double(
        """
        for shape, target in ((DECODE, fp8.TABLE), (PREFILL, fp8.SLOTS)):
            record = fp8.bench_compress_fp8(shape, target, samples=1)
            assert record["name"] == f"compress-fp8 {shape.name} {target}", record["name"]
            assert record["bytes"] == fp8.compress_fp8_bytes(shape)
            assert record["bytes_unfused"] == fp8.unfused_bytes(shape) > record["bytes"]
            rotated = record["rotation"]
            assert rotated["over_l2"] >= 3 and rotated["sets"] == record["input_sets"], rotated
            assert abs(record["copy"]["bytes_moved"] - record["bytes"]) <= 1
            ours, theirs = record["implementations"]["kpool-cupy"], record["implementations"]["unfused"]
            assert theirs["same_bytes_as_kpool_cupy"] is True and theirs["differing_bytes_vs_kpool_cupy"] == 0
            assert ours["timing"] == "graph" and ours["time_over_kpool_cupy"] == 1.0
            # Array operations cannot be captured on the double: the method is recorded, with why.
            assert theirs["timing"] == "events-around-python" and "capture failed" in theirs["timing_note"]
            assert theirs["time_over_kpool_cupy"] == theirs["median_ms"] / ours["median_ms"]
        """
    )


@pytest.mark.slow
def test_an_unfused_sequence_that_misses_a_pool_is_reported_as_different():
    # The equality field is not vacuous: a scatter that drops the last pool
    # leaves that pool's FP8 row as the fill, and the record counts its bytes.
    _on_the_double(
        """
        scatter = fp8.scatter_fp8

        def dropping(views, page, entry, values, scales):
            scatter(views, page[:-1], entry[:-1], values[:-1], scales[:-1])

        fp8.scatter_fp8 = dropping
        record = fp8.bench_compress_fp8(DECODE, fp8.TABLE, samples=1)
        theirs = record["implementations"]["unfused"]
        assert theirs["same_bytes_as_kpool_cupy"] is False, theirs
        assert 0 < theirs["differing_bytes_vs_kpool_cupy"] <= 128 + 4, theirs
        """
    )


@pytest.mark.slow
def test_the_query_record_times_the_op_against_the_copy():
    _on_the_double(
        """
        record = fp8.bench_hadamard_quant(1, samples=1, heads=4)
        assert record["name"] == "hadamard-quant 1x4" and record["rows"] == 4
        assert record["bytes"] == fp8.hadamard_quant_bytes(4, 128)
        assert list(record["implementations"]) == ["kpool-cupy"]
        assert record["implementations"]["kpool-cupy"]["timing"] == "graph"
        assert record["rotation"]["over_l2"] >= 3
        """
    )


def _synthetic_fp8_record(same: bool) -> dict:
    entry = {"median_ms": 0.01, "p10_ms": 0.009, "p90_ms": 0.012, "min_ms": 0.009, "runs": 3, "timing": "graph",
             "gbps": 90.0, "fraction_of_copy": 0.9, "time_over_kpool_cupy": 1.0}  # fmt: skip
    unfused = {**entry, "median_ms": 0.02, "gbps": 45.0, "fraction_of_copy": 0.45, "time_over_kpool_cupy": 2.0,
               "same_bytes_as_kpool_cupy": same, "differing_bytes_vs_kpool_cupy": 0 if same else 132}  # fmt: skip
    return {
        "name": "compress-fp8 prefill-4x16384 slots",
        "bytes": 1000,
        "bytes_unfused": 1360,
        "copy": {**entry, "gbps": 100.0},
        "implementations": {"kpool-cupy": entry, "unfused": unfused},
    }


def test_the_table_shows_the_fp8_records_with_their_bytes_and_the_equality():
    lines = table({"shapes": [], "lifecycle": [], "fp8": [_synthetic_fp8_record(True)]})
    ours = next(line for line in lines if "kpool-cupy" in line)
    assert ours.startswith(" " * 36 + "kpool-cupy") and ours.split()[-1] == "1.00"
    theirs = next(line for line in lines if "unfused" in line and "graph" in line)
    assert theirs.split()[1:] == ["graph", "20.00", "45", "0.45", "2.00", "same", "bytes"]
    assert any("bytes: 1000 credited to both" in line and "at least 1.36 x that" in line for line in lines)
    assert lines[1].startswith("compress-fp8 prefill-4x16384 slots ")  # the longest name keeps its column
    broken = table({"shapes": [], "fp8": [_synthetic_fp8_record(False)]})
    assert any(line.endswith("2.00  132 bytes DIFFER") for line in broken)


@pytest.mark.skipif(gpu_status()[0], reason="this machine has a GPU, so bench runs")
def test_the_fp8_records_can_be_left_out():
    # The option parses; the GPU check comes after it.
    result = CliRunner().invoke(main, ["bench", "--no-fp8"])
    assert result.exit_code == 2 and "needs a CUDA GPU" in result.output, result.output


def test_the_torch_compile_step_leaves_the_fp8_records_out():
    # gpu_check.sh's cold torch.compile run times this package against torch.compile alone, within its own limit.
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    compile_step = script[script.index("run bench-compile") :].split("\n\n")[0]
    assert "--no-fp8" in compile_step and "--no-decode-side" in compile_step
