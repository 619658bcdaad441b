"""The prefill pooling kernels at the engines' shape fit 3 blocks of 256 threads per SM (issue 21).

16-bit keys and gate scores in pools of at most 4 members, head_dim up to
2048 (blocks of 256 threads): ``kp::three_blocks_per_sm`` gives
kpool_compress and kpool_compress_fp8 ``__launch_bounds__(256, 3)``, so
ptxas keeps them within 80 registers (65536 / 768, in its steps of 8).
Everywhere else the bound stays ``(512, 1)``: 128 registers.
"""

from __future__ import annotations

import pytest

pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="ptxas reports need CuPy's NVRTC bindings")

from model import BF16, F16, F32

from kpool_cupy.kernel.codes import Fp8Target
from kpool_cupy.kernel.declarations import COMPRESS, COMPRESS_FP8
from kpool_cupy.kernel.geometry import group_geometry
from kpool_cupy.kernel.nvrtc import kernel_ptxas_report

INT64 = "int64"
THREE_BLOCKS = 65536 // (3 * 256) // 8 * 8  # 80: ptxas allocates registers in steps of 8


def _report(kernel, **template):
    return kernel_ptxas_report(kernel.source, kernel.instance(**template))


def _assert_three_blocks(report, what) -> None:
    assert report.spill_stores == report.spill_loads == report.stack_bytes == 0, (what, report)
    assert report.registers <= THREE_BLOCKS, (what, report)


@pytest.mark.parametrize("kpool", [1, 2, 3, 4])
@pytest.mark.parametrize(("key", "gate"), [(BF16, BF16), (F16, BF16)], ids=str)
def test_compress_at_the_engines_shape_fits_three_blocks_without_spills(key, gate, kpool):
    for head_dim in (8, 128, 2048):
        report = _report(COMPRESS, KT=key, GT=gate, OT=key, HEAD_DIM=head_dim, KPOOL=kpool)
        _assert_three_blocks(report, (head_dim, kpool))
        assert group_geometry(head_dim, 10_000).block == 256  # what the bound promises the launch


@pytest.mark.parametrize("target", list(Fp8Target), ids=lambda t: t.name.lower())
def test_compress_fp8_at_the_engines_shape_fits_three_blocks_without_spills(target):
    for head_dim, kpool in ((16, 4), (128, 4), (256, 3)):
        report = _report(COMPRESS_FP8, KT=BF16, GT=BF16, HEAD_DIM=head_dim, KPOOL=kpool, TARGET=int(target), ID=INT64)
        _assert_three_blocks(report, (head_dim, kpool))


@pytest.mark.slow
@pytest.mark.parametrize("rotate", [False, True])
@pytest.mark.parametrize("vector", [0, int(COMPRESS.aligned)])
def test_every_form_of_the_engines_shape_fits_three_blocks(vector, rotate):
    # The scalar path, 64-bit indices and the rotation: each keeps 80.
    indices = {"IO": INT64, "IC": INT64, "IP": INT64}
    for kpool in (1, 4):
        report = _report(
            COMPRESS, KT=BF16, GT=F16, OT=F32, HEAD_DIM=128, KPOOL=kpool, VECTOR=vector, ROTATE=rotate, **indices
        )
        _assert_three_blocks(report, (vector, rotate, kpool))


@pytest.mark.parametrize(
    ("key", "kpool", "head_dim"), [(F32, 4, 128), (BF16, 5, 128), (BF16, 4, 4096)], ids=["float32", "kpool-5", "4096"]
)
def test_outside_the_engines_shape_the_bound_stays_128_registers(key, kpool, head_dim):
    # Wider members (float32, or 5 of them) need more than 80 registers to
    # hold a whole pool's loads at once, and a head_dim 4096 pool's 512
    # threads fill a block alone, so the bound is (512, 1) there; each uses
    # more than 80 (110, 102 and 83 here), which the 3-block bound forbids.
    report = _report(COMPRESS, KT=key, GT=key, OT=key, HEAD_DIM=head_dim, KPOOL=kpool)
    assert report.spill_stores == report.stack_bytes == 0, report
    assert THREE_BLOCKS < report.registers <= 128, report
