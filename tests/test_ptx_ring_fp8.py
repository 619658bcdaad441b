"""Register budgets of the FP8 ring kernels and the rotating variants (issue 12), read off ptxas for sm_90.

kpool_ring_close_fp8 and kpool_tail_update_fp8 pool as their plain forms
and run the FP8 epilogue after; the plain kernels' ROTATE variants add the
rotation. None may spill under its launch bound. A sweep of 4 key/gate
dtype pairs x head_dim 8, 128, 256 x kpool 5, 7, 8, 17 x rows and block
table (288 variants of the two FP8 ring kernels, one ring and split) found
ring close spilling 4-48 bytes at kpool 17 while it kept the pool id live
across the pooling; it now writes closed first and reads the id again after
(kernels/kpool_ring.cu), and nothing spills. The tests keep three dtype
pairs at three corners (about 70 variants, 20 s): the smallest head_dim with 17's partial last
chunk (where the spills were), the largest with kpool 7, and 128 with 8.
"""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="compiling needs CuPy's NVRTC bindings")

from kpool_cupy.dtypes import BFLOAT16, FLOAT16, FLOAT32
from kpool_cupy.kernel.codes import Fp8Target
from kpool_cupy.kernel.declarations import COMPRESS, RING_CLOSE, RING_CLOSE_FP8, TAIL_UPDATE, TAIL_UPDATE_FP8
from kpool_cupy.kernel.geometry import group_block_bound
from kpool_cupy.kernel.nvrtc import kernel_ptxas_report

PAIRS = [(BFLOAT16, BFLOAT16), (FLOAT16, FLOAT32), (FLOAT32, FLOAT16)]
CORNERS = [(8, 17), (256, 7), (128, 8)]  # (head_dim, kpool)
EVERY = 63  # every VectorAccess bit: the aligned variant an engine's arrays get


# A split tail update builds for its geometry's block (kp::group_block_bound: 256 threads at these
# head_dims); every other kernel for 512 threads, 128 registers.
SPLIT_BOUND, BOUND = group_block_bound(256), 512


def _fp8_ring_variants():
    for (key, gate), (head_dim, kpool), target in itertools.product(PAIRS, CORNERS, [Fp8Target.ROWS, Fp8Target.TABLE]):
        sizes = {"T": key, "G": gate, "HEAD_DIM": head_dim, "KPOOL": kpool, "VECTOR": EVERY, "TARGET": target}
        yield RING_CLOSE_FP8.instance(**sizes), BOUND
        for split in (False, True) if key.itemsize == gate.itemsize else (True,):
            yield TAIL_UPDATE_FP8.instance(**sizes, SPLIT=split), SPLIT_BOUND if split else BOUND


def _rotating_variants():
    for (key, gate), (head_dim, kpool) in itertools.product(PAIRS, CORNERS):
        sizes = {"HEAD_DIM": head_dim, "KPOOL": kpool, "ROTATE": True}
        yield COMPRESS.source, COMPRESS.instance(KT=key, GT=gate, OT=key, **sizes), BOUND
        yield RING_CLOSE.source, RING_CLOSE.instance(T=key, G=gate, OT=key, **sizes), BOUND
        for split in (False, True) if key.itemsize == gate.itemsize else (True,):
            name = TAIL_UPDATE.instance(T=key, G=gate, OT=key, **sizes, SPLIT=split)
            yield TAIL_UPDATE.source, name, SPLIT_BOUND if split else BOUND


def _check(report, name: str, bound: int) -> None:
    assert report.spill_stores == report.spill_loads == report.stack_bytes == 0, (name, report)
    assert report.registers * bound <= 65536, (name, report)  # the launch bound's block fits an SM


@pytest.mark.slow
@pytest.mark.parametrize(("name", "bound"), list(_fp8_ring_variants()), ids=lambda v: v if isinstance(v, str) else "")
def test_fp8_ring_kernels_do_not_spill(name, bound):
    source = {k.name: k.source for k in (RING_CLOSE_FP8, TAIL_UPDATE_FP8)}[name.partition("<")[0]]
    _check(kernel_ptxas_report(source, name), name, bound)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source", "name", "bound"), list(_rotating_variants()), ids=lambda v: v if isinstance(v, str) and "<" in v else ""
)
def test_rotating_variants_do_not_spill(source, name, bound):
    _check(kernel_ptxas_report(source, name), name, bound)
