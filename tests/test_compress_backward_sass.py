"""The backward kernel's machine code, read off sm_90 SASS without a GPU (`kpool-cupy ptx --sass --op
compress_backward`): no spill under its 128-register bound, 16-byte loads of every member row and of the
gradient row, and each member row read once where the pool is held in registers (kernels/kpool_compress.cu,
``kp::backward_whole_pool``) — twice (the forward's reduction, then member by member) where it is not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kpool_cupy.dtypes import BFLOAT16, FLOAT16, FLOAT32
from kpool_cupy.kernel.declarations import COMPRESS_BACKWARD, COMPRESS_BACKWARD_APE
from kpool_cupy.kernel.geometry import CHANNELS_PER_THREAD, chunk_members
from kpool_cupy.tools import sass
from kpool_cupy.tools.load_depth import load_depth

pytestmark = pytest.mark.usefixtures("sass_tools")

BACKWARD_WHOLE_BYTES = 320  # kp::kBackwardWholeBytes


def _backward(dtype: np.dtype, head_dim: int, kpool: int, grad: np.dtype | None = None) -> sass.SassSummary:
    name = COMPRESS_BACKWARD.instance(KT=dtype, GT=dtype, DT=grad or dtype, HEAD_DIM=head_dim, KPOOL=kpool)
    return sass.summarize_sass(COMPRESS_BACKWARD.source, name)


def _whole(dtype: np.dtype, kpool: int) -> bool:
    member_bytes = CHANNELS_PER_THREAD * (2 * dtype.itemsize + 4)
    return chunk_members(kpool, member_bytes) == kpool and kpool * member_bytes <= BACKWARD_WHOLE_BYTES


def test_the_holding_limit_is_the_kernels():
    text = Path(__file__).resolve().parent.parent.joinpath("kernels", "kpool_compress.cu").read_text()
    assert f"kBackwardWholeBytes = {BACKWARD_WHOLE_BYTES} " in text


# The engines' shape (bf16, head_dim 128, kpool 4) and the edges of the two paths for each dtype: the
# largest pool held in registers, the smallest streamed one, and kpool 16.
CASES = [
    (BFLOAT16, 128, 4),
    (BFLOAT16, 128, 5),
    (BFLOAT16, 128, 6),
    (BFLOAT16, 128, 16),
    (FLOAT16, 512, 8),
    (FLOAT32, 128, 3),
    (FLOAT32, 128, 4),
    (FLOAT32, 64, 1),
]


@pytest.mark.parametrize(("dtype", "head_dim", "kpool"), CASES, ids=lambda v: str(getattr(v, "name", v)))
def test_no_spill_and_every_row_in_16_byte_loads(dtype, head_dim, kpool):
    summary = _backward(dtype, head_dim, kpool)
    assert summary.spill_stores == summary.spill_loads == 0, summary
    words = dtype.itemsize // 2  # 16-byte words of 8 channels of k, and of gate
    per_member = 2 * words + 2  # k, gate and the float32 ape row
    gradient = words  # the pool's gradient row, in k's dtype here
    # The request blocks' loops of zero rows (d k and d gate), rolled: the rows before a request's first pool and
    # after its last; at kpool 1 none come before (the phase is 0), and that loop compiles away.
    zeroing = (2 if kpool > 1 else 1) * 2 * words
    if _whole(dtype, kpool):
        # Every member row loaded once (unrolled), the gradient once; d k and d gate stored once a member.
        assert summary.vector_loads == kpool * per_member + gradient, summary
        assert summary.vector_stores == kpool * 2 * words + zeroing, summary
    else:
        # Streamed: the forward's chunks (a loop's body counts once), then one member a loop iteration.
        chunk = chunk_members(kpool, CHANNELS_PER_THREAD * (2 * dtype.itemsize + 4))
        first = min(chunk, kpool)
        rest = (kpool - first) % chunk
        streamed = (first + (chunk if kpool - first >= chunk else 0) + rest) * per_member
        assert summary.vector_loads == streamed + per_member + gradient, summary
        assert summary.vector_stores == 2 * words + zeroing, summary


def test_a_gradient_in_another_dtype_is_still_one_16_byte_row():
    summary = _backward(BFLOAT16, 128, 4, grad=FLOAT32)
    assert summary.spill_stores == summary.spill_loads == 0, summary
    assert summary.vector_loads == 4 * 4 + 2, summary  # two 16-byte words of 8 float32 gradient channels


# kp::kApeLoads: the partials a thread of the ape sum has in flight at once.
APE_LOADS = 16


@pytest.mark.parametrize(("head_dim", "kpool"), [(128, 4), (64, 16)])
def test_the_ape_sum_keeps_a_batch_of_loads_in_flight(head_dim, kpool):
    # kpool_compress_backward_ape's thread reads its slice's partials, at 32 x 4,096 tokens (2,048 pool blocks)
    # 32 of them: in batches of APE_LOADS whose loads issue together (all but 2 before the first add, which
    # waits for the first), so a batch costs one round trip, two in all at that shape (the tool counts the
    # batch loop's body once). A
    # loop of one load and its add waits a round trip a partial in its remainder (the kernel before: up to 7
    # partials at 8 a trip): seen failing with the loop written that way (`#pragma unroll 16` over
    # `sum += partials[...]`).
    text = (Path(__file__).resolve().parent.parent / "kernels" / "kpool_compress.cu").read_text()
    assert f"kApeLoads = {APE_LOADS} " in text
    summary = sass.summarize_sass(
        COMPRESS_BACKWARD_APE.source, COMPRESS_BACKWARD_APE.instance(HEAD_DIM=head_dim, KPOOL=kpool)
    )
    assert summary.spill_stores == summary.spill_loads == 0, summary
    depth = load_depth(summary.sass)
    assert depth.depth <= 2, depth
    code, _ = sass.parse_instructions(summary.sass)
    loads = [i for i in code if i.address in depth.loads]
    assert len(loads) == APE_LOADS, [i.operands for i in loads]
    # The batch's loads issue before the first add, which waits for the first (in order: it would stall the rest),
    # but for two ptxas places after it.
    first_add = next(i.address for i in code if i.opcode[0] == "FADD")
    assert sum(i.address < first_add for i in loads) >= APE_LOADS - 2, first_add


def test_the_engines_shape_rounds_its_gradient_rows_by_the_hardware_on_one_branch_a_member():
    # kp::pack_bf16x8 on the path finite values take (tools/value_paths: the group-with-a-NaN path cut): each
    # member's d k and d gate rows are 4 pair roundings (F2FP) each, where from_float<bf16> took about seven
    # instructions a value; and one branch a member on whether the pool was located, where each channel had its
    # own. 1,556 instructions a thread on that path (2,128 with both as before, 1,672 with the branches alone):
    # the bound leaves 6% for changes elsewhere and fails either way back.
    from kpool_cupy.kernel.sources import kernel_source
    from kpool_cupy.tools.value_paths import finite_values_code

    name = COMPRESS_BACKWARD.instance(KT=BFLOAT16, GT=BFLOAT16, DT=BFLOAT16, HEAD_DIM=128, KPOOL=4)
    summary = sass.summarize_code_sass(finite_values_code(kernel_source(COMPRESS_BACKWARD.source)), name)
    assert summary.sass.count("F2FP.BF16.F32.PACK_AB") >= 4 * 2 * 4, summary.sass.count("F2FP")
    assert summary.instructions <= 1650, summary.instructions
