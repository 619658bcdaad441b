"""The scorer's benchmark records, as far as a machine without a GPU shows them: the fraction of the fixed
3.9 TB/s roof, the torch composite's math against the NumPy reference scorer, and a record made through the
CuPy double. No test here times anything or asserts a speed."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
from double import run_on_double
from index_cases import index_case

import kpool_cupy.reference
from kpool_cupy.bench import index
from kpool_cupy.bench.index import FIXED_ROOF_GBPS, IndexShape, fraction_of_fixed_roof, visible_pools
from kpool_cupy.bench.index_torch import BF16_SCORE_TOLERANCE, worst_fraction_of_bound
from kpool_cupy.bench.report import table


@pytest.mark.parametrize(
    ("nbytes", "milliseconds", "want"),
    [
        (3_900_000_000, 1.0, 1.0),  # exactly the roof
        (68_000_000, 0.352, 68e6 / 0.352e-3 / 3.9e12),  # decode-64x1 128K h64's size and time, roughly
        (7_800_000_000, 1.0, 2.0),  # faster than the roof: not clamped
    ],
)
def test_the_fraction_of_the_fixed_roof_is_bytes_over_time_over_3_9_tb_per_second(nbytes, milliseconds, want):
    assert fraction_of_fixed_roof(nbytes, milliseconds) == pytest.approx(want, rel=1e-12)


def _timed(median_ms: float, nbytes: int, copy_gbps: float) -> dict:
    gbps = nbytes / (median_ms * 1e-3) / 1e9
    return {"median_ms": median_ms, "timing": "graph", "gbps": gbps, "fraction_of_copy": gbps / copy_gbps}


def test_the_table_prints_the_fraction_of_the_fixed_roof_beside_the_fraction_of_copy():
    # A copy that ran slow (1.95 TB/s): the kernel's fraction of copy is 1.6 and printed as such, and
    # its fraction of 3.9 TB/s (0.80) is printed after it, for the copy too (0.50).
    nbytes, copy_ms = 1_950_000_000, 1.0
    ours = {**_timed(0.625, nbytes, 1950.0), "time_over_kpool_cupy": 1.0, "tflops": 1.0}
    ours["fraction_of_fixed_roof"] = fraction_of_fixed_roof(nbytes, 0.625)
    torch = {**_timed(5.0, nbytes, 1950.0), "timing": "events-around-python", "time_over_kpool_cupy": 8.0}
    torch |= {"fraction_of_fixed_roof": fraction_of_fixed_roof(nbytes, 5.0), "worst_fraction_of_bf16_bound": 0.4}
    record = {
        "name": "index decode-64x1 128K h64",
        "bytes": nbytes,
        "fixed_roof_gbps": FIXED_ROOF_GBPS,
        "copy": {"median_ms": copy_ms, "timing": "graph", "gbps": 1950.0, "fraction_of_fixed_roof": 0.5},
        "implementations": {"kpool-cupy": ours, "torch-composite": torch},
    }
    lines = table({"index": [record]})
    copy_line = next(line for line in lines if "(d2d copy)" in line)
    ours_line = next(line for line in lines if "kpool-cupy " in line and "graph" in line and "copy" not in line)
    torch_line = next(line for line in lines if "torch-composite" in line)
    assert copy_line.endswith("0.50 of 3.9 TB/s"), copy_line
    assert "     1.60     1.00" in ours_line and ours_line.endswith("0.80 of 3.9 TB/s"), ours_line
    assert "0.10 of 3.9 TB/s  within bf16 bound" in torch_line, torch_line


def _torch_case(shape: IndexShape, seed: int):
    """NumPy inputs of the bench's layout for ``shape``: every request ``context - next_n`` cached tokens,
    pages of 64 pools shuffled, no spare columns."""
    return index_case(
        np.random.default_rng(seed),
        heads=shape.heads,
        block_size=index.CACHE_BLOCK_SIZE,
        counts=(shape.next_n,) * shape.requests,
        cache_lengths=(shape.context - shape.next_n,) * shape.requests,
        spare_pages=1,
        spare_columns=0,
    )


# Decode of 2 tokens a request, where its two tokens see different pool counts (520 tokens: 129 and 130),
# one request and one head (a single rounded score makes the logit, the worst case for the bound), 64 heads
# (the engines'), and pools that end partway into a page (1030 tokens: 257 pools).
TORCH_SHAPES = [
    IndexShape("decode", 4, 2, 2, 520),
    IndexShape("decode", 1, 1, 1, 300),
    IndexShape("decode", 64, 1, 2, 260),
    IndexShape("decode", 16, 3, 2, 1030),
    IndexShape("prefill", 8, 1, 12, 300),
]


@pytest.mark.parametrize("shape", TORCH_SHAPES, ids=lambda s: s.name)
def test_the_torch_composite_agrees_with_the_reference_scorer_within_its_bf16_bound(shape):
    torch = pytest.importorskip("torch")
    from kpool_cupy.bench.index_torch import torch_index_logits

    case = _torch_case(shape, seed=shape.context + shape.heads)
    want = kpool_cupy.reference.kpool_index_logits_fp8(*case.args, kpool=index.KPOOL, max_pools=shape.pools)
    tensors = [torch.from_numpy(a) for a in (case.cache, case.cache_block_table, case.q)]
    seen = torch.from_numpy(visible_pools(shape))
    got = torch_index_logits(*tensors, torch.from_numpy(case.weights), seen).numpy()
    magnitude = torch_index_logits(*tensors, torch.from_numpy(np.abs(case.weights)), seen).numpy()
    assert got.shape == want.shape == (shape.tokens, shape.pools)
    assert np.array_equal(np.isneginf(got), np.isneginf(want)), "the -inf pattern differs"
    worst = worst_fraction_of_bound(np, got, want, magnitude)
    # At most 1: within BF16_SCORE_TOLERANCE. Above 1/16: the scores' bf16 rounding shows, so the bound is
    # not loose by orders of magnitude and this is the bf16 path, not a float32 one.
    assert 1 / 16 < worst <= 1, f"{shape.name}: worst |torch - reference| is {worst} of its bound"


def test_the_bound_is_twice_a_bf16_rounding_of_each_score():
    # 2^-8 is bf16's unit roundoff; the tolerance doubles it (index_torch.py says why).
    assert BF16_SCORE_TOLERANCE == 2 * 2.0**-8
    want = np.array([[1.0, -np.inf], [-3.0, 0.0]], np.float32)
    magnitude = np.array([[256.0, -np.inf], [512.0, 0.0]], np.float32)
    got = want + np.array([[1.0, 0.0], [-8.0, 0.0]], np.float32)  # 1/2 and 2 of the bound; -inf kept
    assert worst_fraction_of_bound(np, got, want, magnitude) == 2.0


# A guard against a hang: two records of a small shape took 6 s here (two busy cores).
DOUBLE_TIMEOUT_S = 60


def test_a_record_without_torch_cuda_says_why_the_torch_composite_was_skipped():
    # On the double torch (if installed) has no CUDA device; with torch blocked, it is not installed. Every
    # timed entry and the copy carry their fraction of 3.9 TB/s, from their own time; the record's name and
    # the CuPy composite's fields are as they were.
    body = """
    import json
    import os
    import sys
    import cupy
    assert cupy.__version__.endswith("numpy-double"), cupy.__file__
    from kpool_cupy.bench import index

    shape = index.IndexShape("decode", 4, 2, 2, 520)
    reasons = []
    for blocked in (False, True):
        if blocked:
            sys.modules["torch"] = None  # import torch raises ImportError
        record = index.bench_index_logits(shape, samples=1)
        assert record["name"] == "index decode-2x2 520 h4" and record["fixed_roof_gbps"] == 3900.0, record
        reasons.append(record["implementations"]["torch-composite"])
        copy = record["copy"]
        assert copy["fraction_of_fixed_roof"] == index.fraction_of_fixed_roof(copy["bytes_moved"], copy["median_ms"])
        # The double says compute capability 9.0: the default build is timed; the sm_90a one is skipped unless
        # KPOOL_CUPY_BENCH_SM90A is 1, and then tried and recorded as failed (the double loads no cubin), the
        # sweep going on.
        assert record["implementations"]["kpool-cupy"]["build"] == "sm_90", record
        reasons.append(record["implementations"]["kpool-cupy-sm90a"])
        if blocked:
            os.environ["KPOOL_CUPY_BENCH_SM90A"] = "1"
            tried = index.bench_index_logits(shape, samples=1)["implementations"]["kpool-cupy-sm90a"]
            assert set(tried) == {"failed"} and tried["failed"], tried
        for name in ("kpool-cupy", "cupy-composite"):
            entry = record["implementations"][name]
            assert entry["fraction_of_fixed_roof"] == index.fraction_of_fixed_roof(record["bytes"], entry["median_ms"])
            assert {"fraction_of_copy", "gbps", "tflops", "time_over_kpool_cupy"} <= set(entry), entry
        assert record["implementations"]["cupy-composite"]["same_minus_inf_as_kpool_cupy"] is True
    print(json.dumps(reasons))
    """
    done = run_on_double(textwrap.dedent(body), timeout=DOUBLE_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    reasons = json.loads(done.stdout.strip().splitlines()[-1])
    assert reasons[2] == {"skipped": "torch is not installed"}, reasons
    assert reasons[1] == reasons[3] == {"skipped": "KPOOL_CUPY_BENCH_SM90A is not 1"}, reasons
    assert reasons[0] in ({"skipped": "torch has no CUDA device"}, {"skipped": "torch is not installed"}), reasons
