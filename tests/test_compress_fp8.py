"""kpool_compress_fp8 and hadamard_quant_fp8 (issue 12) on the emulated kernels and the NumPy reference.

The fused kernel must equal the epilogue (backends/reference_epilogue.py,
itself checked against ml_dtypes) applied to kpool_compress's own float32
result, bit for bit, on each backend; the two backends' bytes must agree
wherever their bf16 x agree (pooling agrees to rounding, not bit for bit:
the GPU's exp2 and reciprocal are approximations). FP8 results here are
compared exactly: every check is a byte or a scale's bits.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from model import BF16, F16, F32, make_batch, standard_lengths

from kpool_cupy import emulate, reference
from kpool_cupy.backends import reference_epilogue as epilogue
from kpool_cupy.emulator.launch import recording

E4M3_MAX_CODE = 0x7E  # 448


def _bf16_x(pooled: np.ndarray) -> np.ndarray:
    return pooled.astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize(
    ("head_dim", "kpool", "dtype", "gate_dtype"),
    [
        (128, 4, BF16, BF16),
        (16, 5, F16, F32),  # two chunks: 5 members of 16-bit keys and float32 gates exceed one
        (256, 1, F32, F32),
        (8, 3, BF16, F16),  # one lane per row: no shuffles
        (32, 4, BF16, BF16),  # four lanes: a mask of four
        (64, 16, F32, BF16),  # streamed in chunks
    ],
)
@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_the_fused_kernel_is_the_epilogue_of_compress_bit_for_bit(module, head_dim, kpool, dtype, gate_dtype):
    lengths, cache = standard_lengths(kpool)
    batch = make_batch(lengths, cache, head_dim=head_dim, kpool=kpool, dtype=dtype, gate_dtype=gate_dtype, seed=kpool)
    for round_scale in (True, False):
        values, scales = module.kpool_compress_fp8(*batch.args(), round_scale=round_scale)
        pooled = module.kpool_compress(*batch.args(), out_dtype="float32")
        want_values, want_scales = epilogue.epilogue(pooled, round_scale)
        assert values.dtype == np.uint8 and scales.dtype == np.float32
        assert np.array_equal(values, want_values)
        assert scales.tobytes() == want_scales.tobytes()


def test_emulate_and_reference_agree_wherever_their_bf16_keys_agree():
    lengths, cache = standard_lengths(4)
    batch = make_batch(lengths * 4, cache * 4, head_dim=128, kpool=4, seed=3)
    got = emulate.kpool_compress_fp8(*batch.args())
    want = reference.kpool_compress_fp8(*batch.args())
    same_x = np.all(
        _bf16_x(emulate.kpool_compress(*batch.args(), out_dtype="float32"))
        == _bf16_x(reference.kpool_compress(*batch.args(), out_dtype="float32")),
        axis=1,
    )
    assert same_x.sum() >= len(same_x) // 2, "too few rows to compare"  # the comparison below covers something
    assert np.array_equal(got[0][same_x], want[0][same_x])
    assert got[1][same_x].tobytes() == want[1][same_x].tobytes()


def _exact_rows(rows: np.ndarray):
    """A batch whose pools are exactly ``rows``: kpool 1 and a zero ape weigh each member 1, so pooled = k."""
    count, head_dim = rows.shape
    zero = np.zeros((1, head_dim), np.float32)
    offsets = np.array([0, count], np.int32)
    return (rows, rows, zero, offsets, np.zeros(1, np.int32))


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_epilogue_edges_through_the_op(module):
    head_dim = 64
    rows = np.zeros((4, head_dim), np.float32)
    rows[1, 5] = 56.0  # one-hot: y = +-56 / 8 = +-7 everywhere, amax 7 * 2^0
    rows[2, 0] = 1.0  # one-hot of another magnitude
    rows[3] = np.linspace(-3, 3, head_dim)
    values, scales = module.kpool_compress_fp8(*_exact_rows(rows.astype(BF16)))
    # An all-zero pool: scale 1e-4 / 448 rounded up to a power of two (2^-22), all bytes zero.
    assert scales[0] == np.float32(2.0**-22) and not values[0].any()
    # A one-hot pool rotates to a constant magnitude; an amax of 7 * 2^m reaches exactly 448.
    assert set(values[1] & 0x7F) == {E4M3_MAX_CODE}
    assert scales[1] == np.float32(7 / 448)  # 2^-6 exactly: fl32(7 * fl32(1/448)) rounds to it
    assert len(set(values[2] & 0x7F)) == 1
    # round_scale: every scale a power of two (no mantissa bits); without it the exact v.
    assert not (scales.view(np.uint32) & 0x7FFFFF).any()
    _, exact = module.kpool_compress_fp8(*_exact_rows(rows.astype(BF16)), round_scale=False)
    assert exact[0] == np.float32(1e-4) * np.float32(1 / 448)
    assert (exact.view(np.uint32) & 0x7FFFFF).any()
    assert (exact <= scales).all()


def _scatter(values: np.ndarray, scales: np.ndarray, cache: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """What the cache must hold: ``cache`` with row i of (values, scales) at flat slot ``slots[i]`` (-1: skip)."""
    want = cache.copy()
    pages, size, width = cache.shape
    head_dim = width - 4
    flat = want.reshape(pages, size * width)
    for row, slot in enumerate(slots):
        if slot < 0:
            continue
        page, entry = divmod(int(slot), size)
        flat[page, entry * head_dim : (entry + 1) * head_dim] = values[row]
        flat[page, size * head_dim + 4 * entry : size * head_dim + 4 * entry + 4] = scales[row : row + 1].view(np.uint8)
    return want


def _table_slots(batch, kpool: int, table: np.ndarray, size: int) -> np.ndarray:
    """Each pool's slot through the block table, in output order (the issue's formula, written plainly)."""
    slots = []
    offsets, cached = batch.input_row_offsets.astype(int), batch.cache_lengths.astype(int)
    for b in range(len(cached)):
        first = -(-cached[b] // kpool)
        last = (cached[b] + offsets[b + 1] - offsets[b]) // kpool
        for q in range(first, last):
            slots.append(table[b, q // size] * size + q % size)
    return np.array(slots, np.int64)


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_cache_writes_through_slots_and_block_table(module):
    kpool, head_dim, size = 4, 128, 4
    lengths, cache_lengths = standard_lengths(kpool)
    batch = make_batch(lengths, cache_lengths, head_dim=head_dim, kpool=kpool, seed=5)
    values, scales = module.kpool_compress_fp8(*batch.args())
    pools = values.shape[0]
    rng = np.random.default_rng(0)
    cache = rng.integers(0, 256, (12, size, head_dim + 4), dtype=np.uint8)  # every byte a value to keep

    # Slots: a shuffled set of distinct slots, two pools skipped with -1.
    slots = rng.permutation(cache.shape[0] * size)[:pools].astype(np.int64)
    slots[[1, pools - 2]] = -1
    got = cache.copy()
    assert module.kpool_compress_fp8(*batch.args(), cache=got, slots=slots) is None
    assert np.array_equal(got, _scatter(values, scales, cache, slots))  # neighbours and skipped slots kept

    # All -1: the cache stays byte-identical.
    untouched = cache.copy()
    module.kpool_compress_fp8(*batch.args(), cache=untouched, slots=np.full(pools, -1, np.int64))
    assert np.array_equal(untouched, cache)

    # A block table: each request's pages, shuffled; the same bytes as the slots the table implies.
    table = rng.permutation(cache.shape[0])[: len(lengths) * 2].reshape(len(lengths), 2).astype(np.int32)
    by_table = cache.copy()
    module.kpool_compress_fp8(*batch.args(), cache=by_table, block_table=table)
    implied = _table_slots(batch, kpool, table, size)
    assert np.array_equal(by_table, _scatter(values, scales, cache, implied))
    by_slots = cache.copy()
    module.kpool_compress_fp8(*batch.args(), cache=by_slots, slots=implied.astype(np.int32))
    assert np.array_equal(by_slots, by_table)


def test_a_cache_with_padded_pages_and_an_unaligned_one_byte_path():
    # Pages further apart than their bytes (a layer's view of a larger cache),
    # and a cache whose pages are 4- but not 8-byte aligned (byte stores).
    kpool, head_dim, size = 4, 16, 2
    batch = make_batch([9, 6], [0, 3], head_dim=head_dim, kpool=kpool, seed=2)
    values, scales = reference.kpool_compress_fp8(*batch.args())
    page = size * (head_dim + 4)
    for stride, offset in ((page + 8, 0), (page + 4, 4)):
        backing = np.zeros(8 * stride + 64, np.uint8)
        cache = np.lib.stride_tricks.as_strided(
            backing[offset:], (8, size, head_dim + 4), (stride, head_dim + 4, 1), writeable=True
        )
        slots = np.array([3, 0, 15], np.int64)
        for module in (emulate, reference):
            backing[...] = 0xA5
            module.kpool_compress_fp8(*batch.args(), cache=cache, slots=slots)
            assert np.array_equal(
                np.ascontiguousarray(cache), _scatter(values, scales, np.full(cache.shape, 0xA5, np.uint8), slots)
            )
            assert (backing[:offset] == 0xA5).all() and (backing[offset + 7 * stride + page :] == 0xA5).all()


def test_aligned_inputs_take_the_vector_paths_exactly_where_allowed():
    # 3 pools x 16 threads, each loading 4 members' k and gate (one 16-byte
    # word each, bf16) and ape rows (two words each, float32); the 8-byte
    # value stores are not counted with the 16-byte accesses.
    batch = make_batch([9, 6], [0, 3], head_dim=128, kpool=4, seed=2)
    with recording() as launches:
        emulate.kpool_compress_fp8(*batch.args())
        strided = np.zeros((batch.k.shape[0], 136), BF16)[:, 8:]  # 16-byte rows, first element 16 bytes in
        strided[...] = batch.k
        emulate.kpool_compress_fp8(strided[:, :], *batch.args()[1:])
        unaligned = np.zeros((batch.k.shape[0], 129), BF16)[:, 1:]  # a 258-byte row stride: k element by element
        unaligned[...] = batch.k
        emulate.kpool_compress_fp8(unaligned, *batch.args()[1:])
    assert [launch.cooperative for launch in launches] == [True, True, True]
    assert [launch.vector_accesses for launch in launches] == [3 * 16 * 16, 3 * 16 * 16, 3 * 16 * 12]
