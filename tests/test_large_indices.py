"""Rows times stride past 2^31 elements: the kernel's row arithmetic is 64-bit.

The members sit in a sparse memory-mapped file, reached through a strided
view, so nothing near 2^31 elements is allocated or written.

Index expressions in kernels/kpool_compress.cu, reviewed for width:
- locate_pool: every offset is read by load_index as a signed 64-bit value;
  local_pool, phase, align and first are long long, and local_pool is
  bounded by (row_end - row_begin) / KPOOL before it is multiplied.
- kpool_compress: pool is long long (blockIdx.x widened before the multiply);
  k + first_row * k_row_stride, gate + first_row * gate_row_stride and
  pooled + pool * pooled_row_stride multiply two long longs; the member step
  m * k_row_stride promotes int m to long long. channel (< head_dim <= 4096)
  and the ape offset m * ape_row_stride (long long) cannot overflow.
"""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16, F32, TOLERANCES, assert_close_to_model

from kpool_cupy import emulate, reference

ROW_STEP = 2**28  # elements between consecutive rows: row 8 starts at 2^31


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["emulate", "reference"])
def test_members_beyond_2_31_elements(tmp_path, backend):
    rows, head_dim = 12, 128
    mapped = np.memmap(tmp_path / "sparse.bin", dtype=BF16, mode="w+", shape=(rows * ROW_STEP,))
    view = np.lib.stride_tricks.as_strided(mapped, (rows, 2 * head_dim), (ROW_STEP * 2, 2))
    rng = np.random.default_rng(0)
    k_values = rng.standard_normal((rows, head_dim)).astype(BF16)
    gate_values = (3 * rng.standard_normal((rows, head_dim))).astype(BF16)
    view[:, :head_dim], view[:, head_dim:] = k_values, gate_values
    k, gate = view[:, :head_dim], view[:, head_dim:]
    assert k.strides[0] // k.itemsize * 8 == 2**31  # pool 2's first member is past 2^31 elements
    ape = rng.standard_normal((4, head_dim)).astype(np.float32)
    offsets, cache = np.array([0, rows], np.int64), np.array([0], np.int64)
    run = {"emulate": emulate.kpool_compress, "reference": reference.kpool_compress}[backend]
    got = run(k, gate, ape, offsets, cache)
    from model import model_pooled

    want = model_pooled(k_values, gate_values, ape, offsets, cache)
    # With 32-bit row arithmetic pool 2 would wrap onto rows 0..3 and equal pool 0.
    assert not np.array_equal(want[2], want[0])
    assert_close_to_model(got, want, BF16)


@pytest.mark.slow
def test_ring_kernels_reach_rows_beyond_2_31_elements(tmp_path):
    # ring close reads its call's tokens, tail update its step tokens, past
    # 2^31 elements; the emulated kernels must agree with the reference (whose
    # indexing is NumPy's, 64-bit), the ring bytes included.
    head_dim, kpool, step = 16, 4, 2**30 + 16  # float32 row 2 starts past 2^31 elements
    mapped = np.memmap(tmp_path / "sparse.bin", dtype=np.float32, mode="w+", shape=(2 * step + head_dim,))
    rng = np.random.default_rng(1)
    for row in range(3):
        mapped[row * step : row * step + head_dim] = rng.standard_normal(head_dim)
    k = np.lib.stride_tricks.as_strided(mapped, (3, head_dim), (step * 4, 4))
    ring = rng.standard_normal((2, 2, kpool, head_dim)).astype(np.float32)
    ape = rng.standard_normal((kpool, head_dim)).astype(np.float32)
    offsets, cache, slot = np.array([0, 3], np.int64), np.array([1], np.int64), np.array([0], np.int32)
    got, closed = emulate.kpool_ring_close(ring, k, k, ape, offsets, cache, slot)
    want, want_closed = reference.kpool_ring_close(ring, k, k, ape, offsets, cache, slot)
    assert closed[0] == want_closed[0] == 0
    # Both within TOLERANCES[F32] of the exact pools (expf and NumPy's exp and
    # the summation order differ), so of each other within twice that.
    atol, rtol = TOLERANCES[F32]
    np.testing.assert_allclose(got, want, rtol=2 * rtol, atol=2 * atol)

    steps = np.lib.stride_tricks.as_strided(mapped, (2, 1, head_dim), (2 * step * 4, head_dim * 4, 4))
    positions, slots = np.array([[3], [7]], np.int32), np.array([0, 1], np.int32)
    ring_emulated, ring_reference = ring.copy(), ring.copy()
    got, closed = emulate.kpool_tail_update(ring_emulated, steps, steps, ape, positions, slots)
    want, want_closed = reference.kpool_tail_update(ring_reference, steps, steps, ape, positions, slots)
    np.testing.assert_array_equal(closed, want_closed)
    assert ring_emulated.tobytes() == ring_reference.tobytes()
    assert ring_emulated[1, 0, 3].tobytes() == mapped[2 * step : 2 * step + head_dim].tobytes()  # the far row
    np.testing.assert_allclose(got, want, rtol=2 * rtol, atol=2 * atol)


@pytest.mark.parametrize("backend", ["emulate", "reference"])
def test_a_batch_past_2_31_minus_1_requests_is_refused_before_the_offsets_are_read(tmp_path, backend):
    # The kernels' request searches walk requests in 32 bits (kernels/kpool_expand.cuh): every op refuses a
    # longer batch on the offsets' length. The offsets sit in a sparse file: nothing is allocated or read.
    requests = 2**31
    offsets = np.memmap(tmp_path / "offsets.bin", dtype=np.int32, mode="w+", shape=(requests + 1,))
    lengths = np.memmap(tmp_path / "lengths.bin", dtype=np.int32, mode="w+", shape=(requests,))
    module = emulate if backend == "emulate" else reference
    expected = f"length batch + 1 <= {2**31} (at most {2**31 - 1} requests), got length {2**31 + 1}"
    with pytest.raises(ValueError, match=r"^Invalid input_row_offsets: expected ") as refused:
        # validate=False: refused on metadata alone, not on a read of the offsets' values.
        module.kpool_expand_topk(np.zeros((1, 2), np.int32), offsets, lengths, kpool=4, validate=False)
    assert expected in str(refused.value)
    with pytest.raises(ValueError, match=r"^Invalid input_row_offsets: expected ") as refused:
        k = np.zeros((1, 128), np.float32)
        module.kpool_compress(k, k, np.zeros((4, 128), np.float32), offsets, lengths)
    assert expected in str(refused.value)
