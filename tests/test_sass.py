"""The machine code's memory path, read off sm_90 SASS without a GPU (`kpool-cupy ptx --sass`).

What the GPU would show as speed, these show as structure: a pool that fits
one prefetch chunk issues every 16-byte load before its first exp (one memory
round trip), its softmax has no branch, and the headline variant is at most
half the 1455 static instructions the kernel had before the rework.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kpool_cupy.dtypes import BFLOAT16, FLOAT16, FLOAT32
from kpool_cupy.kernel.declarations import COMPRESS, RING_CLOSE
from kpool_cupy.kernel.geometry import STREAM_BYTES, chunk_members
from kpool_cupy.tools import sass

ROOT = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.usefixtures("sass_tools")


def _compress(dtype: np.dtype, head_dim: int, kpool: int) -> sass.SassSummary:
    name = COMPRESS.instance(KT=dtype, GT=dtype, OT=dtype, HEAD_DIM=head_dim, KPOOL=kpool)
    return sass.summarize_sass(COMPRESS.source, name)


def test_the_headline_variant_is_half_its_old_size_with_one_round_trip():
    # bf16, head_dim 128, kpool 4: 1455 static instructions before (issue 10),
    # 8 of its 16 loads before the first exp and 24 convergence barriers
    # between the loads and the last exp.
    summary = _compress(BFLOAT16, 128, 4)
    assert summary.instructions <= 732, summary.instructions
    assert summary.vector_loads == 16 and summary.vector_stores == 1, summary
    assert summary.vector_loads_before_first_exp == summary.vector_loads, summary
    assert summary.branches_in_softmax == 0, summary
    assert summary.spill_stores == summary.spill_loads == 0, summary


# Pools that fit one prefetch chunk (kWholePoolBytes, 448 bytes a thread of
# keys, gate scores and ape rows: 7 members of 16-bit types, 4 of float32).
# ptxas, under the 128-register bound, may hold the last loads of the
# largest ones behind the first exps, so the whole-pool claim is asserted up
# to kpool 4 for every dtype; docs/benchmarks.md records the rest.
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [BFLOAT16, FLOAT16, FLOAT32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("kpool", [2, 3, 4])
def test_a_small_pool_issues_every_load_before_its_first_exp_and_never_branches(dtype, kpool):
    summary = _compress(dtype, 128, kpool)
    per_member = 2 * (dtype.itemsize // 2) + 2  # 16-byte words of k and of gate, two of the float32 ape row
    assert summary.vector_loads == kpool * per_member, summary
    assert summary.vector_loads_before_first_exp == summary.vector_loads, summary
    assert summary.branches_in_softmax == 0, summary


@pytest.mark.slow
def test_ring_close_pools_like_compress():
    # Ring close picks each member's row from the ring or from this call's
    # tokens with a select, not a branch; its pool is one round trip as well.
    name = RING_CLOSE.instance(T=BFLOAT16, G=BFLOAT16, OT=BFLOAT16, HEAD_DIM=128, KPOOL=4)
    summary = sass.summarize_sass(RING_CLOSE.source, name)
    assert summary.vector_loads_before_first_exp == summary.vector_loads == 16, summary
    assert summary.branches_in_softmax == 0, summary


@pytest.mark.slow
@pytest.mark.parametrize("kpool", [8, 16, 128])
@pytest.mark.parametrize("dtype", [BFLOAT16, FLOAT32], ids=["bf16", "fp32"])
def test_larger_pools_keep_at_least_128_bytes_of_keys_and_gates_in_flight(dtype, kpool):
    # A streamed pool's chunks are at least 256 bytes a thread with their ape
    # rows: the first chunk's loads all precede the first exp.
    summary = _compress(dtype, 128, kpool)
    member_bytes = 8 * (2 * dtype.itemsize + 4)
    per_member = 2 * (dtype.itemsize // 2) + 2  # as above
    streamed = STREAM_BYTES // member_bytes
    assert summary.vector_loads_before_first_exp >= min(chunk_members(kpool, member_bytes), streamed) * per_member
    assert summary.spill_stores == summary.spill_loads == 0, summary


@pytest.mark.slow
def test_the_benchmark_model_in_the_docs_is_current():
    # docs/benchmarks.md's prediction table is scripts/bench_model.py's
    # output for today's kernel; a kernel change that moves the SASS counts
    # must update it.
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_model.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
