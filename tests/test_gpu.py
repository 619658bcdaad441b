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


def _no_sync_call(batch, out, stream):
    """The call that neither syncs nor allocates (out=, pool_row_offsets=, validate=False), on ``stream``."""
    import cupy

    import kpool_cupy

    k, gate, ape, offsets, cache = _device(batch)
    pools = kpool_cupy.pool_row_offsets(offsets, cache, 4)

    def call():
        return kpool_cupy.kpool_compress(
            k, gate, ape, offsets, cache, pool_row_offsets=pools, out=out, validate=False, stream=stream
        )

    cupy.cuda.Device().synchronize()
    return call


SENTINEL = -7.0  # a pooled value is a weighted mean of standard-normal k: never -7 in these batches


@pytest.mark.parametrize("first", [True, False], ids=["first-call", "planned-call"])
@pytest.mark.parametrize("kind", ["cupy-stream", "raw-handle", "protocol"])
def test_gpu_explicit_streams(kind, first):
    # The call must land on the stream it is given, on the full path (a
    # signature's first call) and on its launch plan. The stream is held shut
    # by a host function waiting on a gate; while it is shut, everything else
    # is drained: the stream current during the call (the wrong place the
    # call could launch) and the null stream. `out` must still hold its
    # sentinel, read through a third stream, and the stream must still be
    # busy (else the check would prove nothing); once the gate opens and the
    # stream finishes, `out` holds the result. A launch on any stream but the
    # given one has run by the time `out` is read.
    import threading

    import cupy

    from kpool_cupy.backends import cupy_plans

    batch = make_batch(*standard_lengths(4), seed=14)
    want = batch.model()
    stream = cupy.cuda.Stream(non_blocking=True)
    current = cupy.cuda.Stream(non_blocking=True)
    observer = cupy.cuda.Stream(non_blocking=True)

    class Protocol:
        def __cuda_stream__(self):
            return (0, stream.ptr)

    given = {"cupy-stream": stream, "raw-handle": stream.ptr, "protocol": Protocol()}[kind]
    out = cupy.full((want.shape[0], 128), SENTINEL, dtype=BF16)
    call = _no_sync_call(batch, out, given)
    call()  # compiles and loads the kernel (no module load behind the gate); a CuPy stream's call makes a plan
    stream.synchronize()
    if first:
        cupy_plans.forget_all()  # the gated call takes the full path (foreign streams always do)
    out[...] = SENTINEL
    cupy.cuda.Device().synchronize()
    gate = threading.Event()
    stream.launch_host_func(lambda _: gate.wait(60), None)  # 60 s: a bound, never reached when the test passes
    try:
        with current:
            got = call()
        current.synchronize()
        cupy.cuda.Stream.null.synchronize()
        assert not stream.done, "the gate did not hold the stream: nothing below would be shown"
        seen = out.get(stream=observer)
        ran = np.flatnonzero(seen.astype(np.float32).ravel() != SENTINEL)
        assert ran.size == 0, f"out was written before its stream ran: first element {ran[:1]}"
    finally:
        gate.set()
    stream.synchronize()
    assert got is out or got.data.ptr == out.data.ptr
    assert_close_to_model(out.get(stream=stream), want, BF16)


def test_gpu_fast_path_captures_in_a_graph_without_allocating():
    # out=, pool_row_offsets= and validate=False: no sync (capture would fail)
    # and no allocation (the pool's used bytes stay put). The capture must
    # record the launch, not run it: after the capture the whole device is
    # drained and `out` must still hold its sentinel (a launch made eagerly,
    # on this stream or any other, has written it by then). Replays must
    # write it: cleared on the capturing stream, replayed there, compared.
    import cupy

    batch = make_batch(*standard_lengths(4), seed=15)
    want = batch.model()
    out = cupy.full((want.shape[0], 128), SENTINEL, dtype=BF16)
    stream = cupy.cuda.Stream(non_blocking=True)
    call = _no_sync_call(batch, out, stream)
    call()  # the signature's first call runs the full path (compile, load, plan) outside the capture
    stream.synchronize()
    out[...] = SENTINEL
    cupy.cuda.Device().synchronize()
    used = cupy.get_default_memory_pool().used_bytes()
    stream.begin_capture()
    try:
        call()
    finally:
        graph = stream.end_capture()
    assert cupy.get_default_memory_pool().used_bytes() == used
    cupy.cuda.Device().synchronize()
    host = cupy.asnumpy(out).astype(np.float32)
    assert np.all(host == SENTINEL), f"the captured call ran eagerly: {np.count_nonzero(host != SENTINEL)} written"
    for _ in range(2):  # each replay writes out again
        with stream:
            out[...] = 0
        graph.launch(stream)
        stream.synchronize()
        assert_close_to_model(cupy.asnumpy(out), want, BF16)


def test_gpu_a_stream_of_another_device_is_refused_by_name():
    # torch.cuda.current_stream() taken while another device is current: a
    # stream object that says its device. Refused before any launch, with
    # what to pass instead; the same object naming the arrays' device runs.
    import types

    import cupy

    import kpool_cupy

    batch = make_batch(*standard_lengths(4), seed=15)
    own = cupy.cuda.Stream(non_blocking=True)
    arrays = _device(batch)

    def torch_like(index: int):
        return types.SimpleNamespace(cuda_stream=own.ptr, device=types.SimpleNamespace(index=index))

    here = arrays[0].device.id
    other = 3 if here != 3 else 2
    refused = rf"^Invalid stream: expected a stream of device {here} like k .*device {other}$"
    with pytest.raises(ValueError, match=refused):
        kpool_cupy.kpool_compress(*arrays, stream=torch_like(other))
    got = kpool_cupy.kpool_compress(*arrays, stream=torch_like(here))
    own.synchronize()
    assert_close_to_model(cupy.asnumpy(got), batch.model(), batch.k.dtype)
