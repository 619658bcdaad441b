"""The memory path read off NVRTC's output: 128-bit accesses, no local memory, no spills."""

from __future__ import annotations

import pytest

pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="compile_ptx needs CuPy's NVRTC bindings")

from model import BF16, F16, F32

from kpool_cupy import compile_ptx
from kpool_cupy.kernel.declarations import (
    COMPRESS,
    EXPAND_TOPK,
    RING_CLOSE,
    SEED_TAIL,
    TAIL_UPDATE,
    Kernel,
)
from kpool_cupy.kernel.geometry import chunk_members
from kpool_cupy.kernel.nvrtc import kernel_ptxas_report, ptxas_report
from kpool_cupy.tools.ptx_report import count_accesses  # 16-byte accesses as `kpool-cupy ptx` counts them


def _one_dtype(kernel: Kernel, dtype, head_dim: int, kpool: int) -> str:
    """``kernel``'s every-operand-aligned instance with ``dtype`` for each element type (key, gate, output);
    ``kpool`` where the kernel pools (seed tail takes none)."""
    elements = {t.name: dtype for t in kernel.template if t.kind == "typename" and t.default is None}
    sizes = {"KPOOL": kpool} if any(t.name == "KPOOL" for t in kernel.template) else {}
    return kernel.instance(**elements, HEAD_DIM=head_dim, **sizes)


@pytest.mark.parametrize(
    ("head_dim", "kpool", "dtype"), [(128, 4, "bfloat16"), (64, 16, "float16"), (256, 8, "float32")]
)
def test_ptx_uses_128_bit_loads_and_stores(head_dim, kpool, dtype):
    accesses = count_accesses(compile_ptx(head_dim, kpool, dtype))
    loads = accesses.vector_loads
    # Per member: one vector for k and gate each when 2-byte, two when float32,
    # plus two for the float32 ape row; the scalar fallback adds none of these.
    # A pool that fits one prefetch chunk is unrolled whole; a larger one
    # streams in chunks (kpool_cupy/kernel/geometry.py).
    per_member = (2 if dtype != "float32" else 4) + 2
    member_bytes = 8 * (2 * (2 if dtype != "float32" else 4) + 4)
    members = chunk_members(kpool, member_bytes)
    assert loads >= members * per_member, loads
    assert accesses.vector_stores >= 1, "the pooled row is not stored with 128-bit stores"


@pytest.mark.parametrize(
    ("head_dim", "kpool", "dtype"), [(128, 4, "bfloat16"), (1024, 128, "float32"), (8, 64, "float16")]
)
def test_no_local_memory(head_dim, kpool, dtype):
    ptx = compile_ptx(head_dim, kpool, dtype)
    assert ".local" not in ptx and "ld.local" not in ptx and "st.local" not in ptx


@pytest.mark.parametrize(("head_dim", "kpool"), [(128, 4), (128, 128), (1024, 128), (1024, 8), (64, 256)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_no_spills_up_to_kpool_128_and_head_dim_1024(head_dim, kpool, dtype):
    # ptxas inside NVRTC, for sm_90 (the H100/H200 generation).
    report = ptxas_report(head_dim, kpool, dtype, arch="sm_90")
    assert report.spill_stores == 0 and report.spill_loads == 0 and report.stack_bytes == 0, report
    assert report.registers <= 128, report  # keeps at least 4 blocks of 128 threads per SM resident


def test_bad_arch_is_a_clear_error():
    with pytest.raises(ValueError, match="arch"):
        compile_ptx(128, 4, arch="hopper")


@pytest.mark.parametrize("kernel", [RING_CLOSE, SEED_TAIL, TAIL_UPDATE], ids=lambda k: k.name)
@pytest.mark.parametrize(("head_dim", "kpool", "dtype"), [(128, 4, BF16), (1024, 128, F32)])
def test_ring_kernels_do_not_spill(kernel, head_dim, kpool, dtype):
    report = kernel_ptxas_report(kernel.source, _one_dtype(kernel, dtype, head_dim, kpool))
    assert report.spill_stores == 0 and report.spill_loads == 0 and report.stack_bytes == 0, report


def test_expand_kernel_does_not_spill():
    report = kernel_ptxas_report(EXPAND_TOPK.source, EXPAND_TOPK.instance(KPOOL=4))
    assert report.spill_stores == 0 and report.stack_bytes == 0, report


@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "f32"])
@pytest.mark.parametrize("kpool", [4, 128])
@pytest.mark.parametrize("kernel", [COMPRESS, RING_CLOSE, TAIL_UPDATE], ids=lambda k: k.name)
def test_largest_accepted_head_dim_fits_one_block_in_registers(kernel, kpool, dtype):
    # At MAX_HEAD_DIM a pool's threads fill one block on their own; the block's
    # registers must fit an SM's 65536, or the launch fails with out-of-resources.
    from kpool_cupy.kernel.geometry import MAX_HEAD_DIM, group_geometry

    report = kernel_ptxas_report(kernel.source, _one_dtype(kernel, dtype, MAX_HEAD_DIM, kpool))
    block = group_geometry(MAX_HEAD_DIM, 1).block
    assert report.registers * block <= 65536, (report, block)


@pytest.mark.parametrize("dtype", [BF16, F16, F32], ids=["bf16", "f16", "f32"])
@pytest.mark.parametrize("kpool", [1, 3, 5, 8, 9, 17, 1024])
@pytest.mark.parametrize("kernel", [COMPRESS, RING_CLOSE, TAIL_UPDATE], ids=lambda k: k.name)
def test_no_variant_spills_under_the_launch_bound(kernel, kpool, dtype):
    # Every chunking a pool can get (whole pools up to 8 members, streamed
    # ones with a partial last chunk) under __launch_bounds__(512, 1), which
    # leaves 128 registers a thread. A sweep of 504 variants (3 dtypes,
    # head_dim 8, 128 and 4096, 14 kpools, 4 kernels) found none that spills.
    report = kernel_ptxas_report(kernel.source, _one_dtype(kernel, dtype, 128, kpool))
    assert report.spill_stores == report.spill_loads == report.stack_bytes == 0, report
    assert report.registers <= 128, report


# Split rings (tail=(key_ring, gate_ring)) address two arrays at two row
# strides; tail update then needs more than 128 registers with mixed dtypes,
# so it is built with the block bound of its geometry (256 threads up to
# head_dim 2048). At head_dim 4096 a request's 512 threads fill a block and
# 128 registers stay the limit: a sweep (3 x 3 dtypes, head_dim 8, 128 and
# 4096, 11 kpools, the three ring kernels) found exactly these six spilling,
# by the bytes given (ptxas -v spill stores). They are correct, only slower.
KNOWN_SPLIT_SPILLS = {
    ("float16", "float32", 5): 12,
    ("float16", "float32", 7): 16,
    ("float16", "float32", 8): 4,
    ("float32", "float16", 7): 24,
    ("float32", "float16", 8): 4,
    ("float32", "float32", 4): 4,
}


@pytest.mark.parametrize(("key", "gate"), [(F16, F32), (F32, F16), (BF16, F32), (F32, BF16)], ids=str)
@pytest.mark.parametrize("kpool", [5, 7, 8])
def test_split_ring_tail_update_does_not_spill_under_its_block_bound(key, gate, kpool):
    from kpool_cupy.kernel.geometry import group_block_bound

    name = TAIL_UPDATE.instance(T=key, G=gate, OT=key, HEAD_DIM=128, KPOOL=kpool, SPLIT=True)
    report = kernel_ptxas_report(TAIL_UPDATE.source, name)
    assert report.spill_stores == report.spill_loads == report.stack_bytes == 0, report
    assert report.registers * group_block_bound(128) <= 65536, report  # the block fits an SM


@pytest.mark.parametrize(("key", "gate", "kpool"), sorted(KNOWN_SPLIT_SPILLS), ids=str)
def test_split_ring_tail_update_at_head_dim_4096_spills_only_as_recorded(key, gate, kpool):
    name = TAIL_UPDATE.instance(T=key, G=gate, OT=key, HEAD_DIM=4096, KPOOL=kpool, SPLIT=True)
    report = kernel_ptxas_report(TAIL_UPDATE.source, name)
    assert report.spill_stores <= KNOWN_SPLIT_SPILLS[(key, gate, kpool)], report
    assert report.registers <= 128, report


@pytest.mark.parametrize(
    ("kernel", "kpool"),
    [(RING_CLOSE, 4), (RING_CLOSE, 7), (RING_CLOSE, 9), (SEED_TAIL, None)],
    ids=["ring_close-4", "ring_close-7", "ring_close-9", "seed_tail"],
)
@pytest.mark.parametrize(("key", "gate"), [(BF16, F32), (F32, F16)], ids=str)
def test_split_ring_close_and_seed_do_not_spill(kernel, key, gate, kpool):
    # Seed tail pools nothing: no output type, no kpool.
    sizes = {"OT": key, "KPOOL": kpool} if kernel is RING_CLOSE else {}
    name = kernel.instance(T=key, G=gate, **sizes, HEAD_DIM=4096)
    report = kernel_ptxas_report(kernel.source, name)
    assert report.spill_stores == report.spill_loads == report.stack_bytes == 0, report
    assert report.registers <= 128, report
