"""The CuPy path against the reference, DLPack and streams; skipped without a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16, F16, F32, assert_close_to_model, make_batch, standard_lengths

from kpool_cupy import reference

pytestmark = pytest.mark.gpu


def _device(batch):
    import cupy

    return tuple(cupy.asarray(a) for a in batch.args())


@pytest.mark.parametrize("dtype", [BF16, F16, F32], ids=["bf16", "f16", "f32"])
@pytest.mark.parametrize(("head_dim", "kpool"), [(64, 1), (128, 4), (256, 8), (128, 16), (1024, 128)])
def test_gpu_matches_model_and_reference(dtype, head_dim, kpool):
    import cupy

    import kpool_cupy

    batch = make_batch(*standard_lengths(kpool), head_dim=head_dim, kpool=kpool, dtype=dtype, seed=head_dim + kpool)
    got = cupy.asnumpy(kpool_cupy.kpool_compress(*_device(batch)))
    assert_close_to_model(got, batch.model(), dtype)
    want = reference.kpool_compress(*batch.args())
    assert_close_to_model(got, want.astype(np.float64), dtype)


def test_gpu_kpool_one_is_identity_bit_for_bit():
    import cupy

    import kpool_cupy

    batch = make_batch([5, 0, 9], [0, 4, 7], kpool=1, gate_scale=1e4)
    got = cupy.asnumpy(kpool_cupy.kpool_compress(*_device(batch)))
    np.testing.assert_array_equal(got.view(np.uint16), batch.k.view(np.uint16))


def test_gpu_oversized_out_and_no_sync_path():
    import cupy

    import kpool_cupy

    batch = make_batch(*standard_lengths(4), seed=3)
    k, gate, ape, offsets, cache = _device(batch)
    pools = kpool_cupy.pool_row_offsets(offsets, cache, 4)
    assert isinstance(pools, cupy.ndarray)
    want = batch.model()
    out = cupy.full((want.shape[0] + 5, 128), -7.0, dtype=BF16)
    kpool_cupy.kpool_compress(k, gate, ape, offsets, cache, pool_row_offsets=pools, out=out, validate=False)
    host = cupy.asnumpy(out)
    assert_close_to_model(host[: want.shape[0]], want, BF16)
    assert np.all(host[want.shape[0] :].astype(np.float32) == -7.0)


def test_gpu_rejects_host_arrays_pointing_to_reference():
    import kpool_cupy

    batch = make_batch([8], [0])
    with pytest.raises(TypeError, match="reference"):
        kpool_cupy.kpool_compress(*batch.args())


def test_torch_bf16_through_dlpack_zero_copy():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    import cupy

    import kpool_cupy

    batch = make_batch(*standard_lengths(4), seed=9)
    to_torch = lambda a: torch.from_dlpack(cupy.asarray(a))  # noqa: E731
    k = to_torch(batch.k)
    fused = torch.zeros(k.shape[0], 3 * 128, device="cuda", dtype=torch.bfloat16)
    fused[:, 128:256] = to_torch(batch.gate)
    gate = fused[:, 128:256]  # strided rows, no copy
    want = batch.model()
    out = torch.empty(want.shape[0], 128, device="cuda", dtype=torch.bfloat16)
    result = kpool_cupy.kpool_compress(
        k,
        gate,
        to_torch(batch.ape),
        to_torch(batch.input_row_offsets),
        to_torch(batch.cache_lengths),
        out=out,
        stream=torch.cuda.current_stream(),
    )
    assert result.data.ptr == out.data_ptr()  # written in place, zero copy
    torch.cuda.synchronize()
    got = cupy.asnumpy(cupy.from_dlpack(out))
    assert_close_to_model(got, want, BF16)


@pytest.mark.parametrize(("dtype", "gate_dtype"), [(BF16, F32), (F16, BF16)])
def test_gpu_mixed_gate_dtype_and_float32_out(dtype, gate_dtype):
    import cupy

    import kpool_cupy

    batch = make_batch(*standard_lengths(4), dtype=dtype, gate_dtype=gate_dtype, seed=13)
    want = batch.model()
    got = cupy.asnumpy(kpool_cupy.kpool_compress(*_device(batch)))
    assert_close_to_model(got, want, dtype)
    out = cupy.empty(want.shape, dtype=cupy.float32)
    kpool_cupy.kpool_compress(*_device(batch), out=out)
    assert_close_to_model(cupy.asnumpy(out), want, F32)


@pytest.mark.parametrize("kind", ["cupy-stream", "raw-handle", "protocol"])
def test_gpu_explicit_streams(kind):
    import cupy

    import kpool_cupy

    batch = make_batch(*standard_lengths(4), seed=14)
    stream = cupy.cuda.Stream(non_blocking=True)

    class Protocol:
        def __cuda_stream__(self):
            return (0, stream.ptr)

    given = {"cupy-stream": stream, "raw-handle": stream.ptr, "protocol": Protocol()}[kind]
    with stream:
        args = _device(batch)
    got = kpool_cupy.kpool_compress(*args, stream=given)
    stream.synchronize()
    assert_close_to_model(cupy.asnumpy(got), batch.model(), BF16)


def test_gpu_fast_path_captures_in_a_graph_without_allocating():
    # out=, pool_row_offsets= and validate=False: no sync (capture would fail)
    # and no allocation (the pool's used bytes stay put), replayable.
    import cupy

    import kpool_cupy

    batch = make_batch(*standard_lengths(4), seed=15)
    k, gate, ape, offsets, cache = _device(batch)
    pools = kpool_cupy.pool_row_offsets(offsets, cache, 4)
    want = batch.model()
    out = cupy.zeros((want.shape[0], 128), dtype=BF16)
    stream = cupy.cuda.Stream(non_blocking=True)

    def call():
        kpool_cupy.kpool_compress(
            k, gate, ape, offsets, cache, pool_row_offsets=pools, out=out, validate=False, stream=stream
        )

    call()  # compile and load outside the capture
    stream.synchronize()
    out[...] = 0
    used = cupy.get_default_memory_pool().used_bytes()
    stream.begin_capture()
    call()
    graph = stream.end_capture()
    assert cupy.get_default_memory_pool().used_bytes() == used
    graph.launch(stream)
    stream.synchronize()
    assert_close_to_model(cupy.asnumpy(out), want, BF16)
