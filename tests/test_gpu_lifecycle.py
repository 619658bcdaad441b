"""The lifecycle functions on the GPU: bit for bit against one GPU compress, and against the emulator."""

from __future__ import annotations

import numpy as np
import pytest
from lifecycle import Sequence, run_life
from model import BF16, F32

from kpool_cupy import reference  # not the emulator: a lent GPU machine may have no C++ compiler

pytestmark = pytest.mark.gpu


class CupyBackend:
    """kpool_cupy's GPU functions with host arrays in and out; the ring stays on the device."""

    def __getattr__(self, name):
        import cupy

        import kpool_cupy

        function = getattr(kpool_cupy, name)

        def call(*args, **kwargs):
            convert = lambda a: cupy.asarray(a) if isinstance(a, np.ndarray) else a  # noqa: E731
            result = function(*map(convert, args), **{key: convert(value) for key, value in kwargs.items()})
            if isinstance(result, tuple):
                return tuple(cupy.asnumpy(r) for r in result)
            return None if result is None else cupy.asnumpy(result)

        return call


@pytest.mark.parametrize("kpool", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "f32"])
def test_gpu_chunked_prefill_then_decode_equals_one_call(kpool, dtype):
    import cupy

    backend = CupyBackend()
    rng = np.random.default_rng(kpool)
    sequences = []
    for slot in (3, 0, 5, 1):
        length = int(rng.integers(0, 40))
        sequences.append(
            Sequence(
                keys=rng.standard_normal((length, 32)).astype(dtype),
                gates=(3 * rng.standard_normal((length, 32))).astype(dtype),
                slot=slot,
                prefill=int(rng.integers(0, length + 1)),
            )
        )
    ape = rng.standard_normal((kpool, 32)).astype(np.float32)
    run_life(backend, sequences, ape, max_slots=6, rng=rng, zeros=cupy.zeros)
    for sequence in sequences:
        length = len(sequence.keys)
        whole = backend.kpool_compress(
            sequence.keys, sequence.gates, ape, np.array([0, length], np.int64), np.array([0], np.int64)
        )
        assert sorted(sequence.pools) == list(range(length // kpool))
        for pool in range(length // kpool):
            assert sequence.pools[pool] == whole[pool].tobytes()


@pytest.mark.parametrize("tail", [False, True])
def test_gpu_expand_matches_reference(tail):
    rng = np.random.default_rng(7)
    offsets = np.array([0, 5, 8, 9, 15], np.int32)
    cache = np.array([0, 6, 7, 9], np.int32)
    pool_ids = rng.integers(-1, 50, (15, 512)).astype(np.int32)
    got = CupyBackend().kpool_expand_topk(pool_ids, offsets, cache, kpool=4, always_select_tail=tail)
    want = reference.kpool_expand_topk(pool_ids, offsets, cache, kpool=4, always_select_tail=tail)
    np.testing.assert_array_equal(got, want)
