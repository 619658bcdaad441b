"""kpool_compress_backward on the GPU: the gradients against float64 within the stated bound, d ape the same
bits on every run, gradients at any strides, given outputs written whole; skipped without a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16, F16, F32, make_batch, standard_lengths

from kpool_cupy import reference
from kpool_cupy.tools.gradient_accuracy import compare_gradients, gradient_allowed_error

pytestmark = pytest.mark.gpu

NAMES = ("grad_k", "grad_gate", "grad_ape")


def _verdict(got, grad, batch):
    want = reference.kpool_compress_backward(grad, *batch.args(), accumulate="float64")
    largest = lambda a: float(np.abs(np.asarray(a, np.float32)).max(initial=0.0))  # noqa: E731
    logit = largest(batch.gate) + largest(batch.ape)
    bounds = gradient_allowed_error(
        {n: w.astype(np.float64) for n, w in zip(NAMES, want, strict=True)},
        {n: w.dtype for n, w in zip(NAMES, want, strict=True)},
        batch.ape.shape[0], grad.shape[0], largest(grad), largest(batch.k), logit,
    )  # fmt: skip
    return compare_gradients(dict(zip(NAMES, got, strict=True)), dict(zip(NAMES, want, strict=True)), bounds)


def _batch_and_grad(dtype, head_dim, kpool, seed=0):
    batch = make_batch(*standard_lengths(kpool), head_dim=head_dim, kpool=kpool, dtype=dtype, seed=seed)
    pools = reference.kpool_compress(*batch.args()).shape[0]
    grad = np.random.default_rng(seed).standard_normal((pools, head_dim)).astype(dtype)
    return batch, grad


@pytest.mark.parametrize("dtype", [BF16, F16, F32], ids=["bf16", "f16", "f32"])
@pytest.mark.parametrize(("head_dim", "kpool"), [(64, 1), (128, 4), (128, 5), (128, 16), (512, 8)])
def test_gpu_gradients_meet_float64_within_the_bound(dtype, head_dim, kpool):
    import cupy

    import kpool_cupy

    batch, grad = _batch_and_grad(dtype, head_dim, kpool, seed=head_dim + kpool)
    got = kpool_cupy.kpool_compress_backward(cupy.asarray(grad), *(cupy.asarray(a) for a in batch.args()))
    verdict = _verdict([cupy.asnumpy(g) for g in got], grad, batch)
    assert verdict["ok"], verdict


def test_gpu_grad_ape_is_the_same_bits_on_every_run():
    import cupy

    import kpool_cupy

    # 2048 pools over 128 blocks of 16: the block partials and their sum in a fixed order.
    batch = make_batch([8192], [0], head_dim=128, kpool=4, dtype=BF16, seed=3)
    grad = cupy.asarray(np.random.default_rng(3).standard_normal((2048, 128)).astype(BF16))
    args = [cupy.asarray(a) for a in batch.args()]
    first = cupy.asnumpy(kpool_cupy.kpool_compress_backward(grad, *args)[2])
    for _ in range(3):
        again = cupy.asnumpy(kpool_cupy.kpool_compress_backward(grad, *args)[2])
        assert again.tobytes() == first.tobytes()


def test_gpu_gradient_at_any_strides_and_given_outputs_written_whole():
    import cupy

    import kpool_cupy

    batch, grad = _batch_and_grad(BF16, 128, 4, seed=7)
    args = [cupy.asarray(a) for a in batch.args()]
    plain = [cupy.asnumpy(g) for g in kpool_cupy.kpool_compress_backward(cupy.asarray(grad), *args)]
    transposed = cupy.asarray(np.ascontiguousarray(grad.T)).T  # column stride = rows
    garbage = [cupy.full(a.shape, 7, a.dtype) for a in (args[0], args[1], args[2])]
    got = kpool_cupy.kpool_compress_backward(
        transposed, *args, grad_k=garbage[0], grad_gate=garbage[1], grad_ape=garbage[2]
    )
    assert all(g is o for g, o in zip(got, garbage, strict=True))
    for a, b in zip(plain, got, strict=True):
        assert cupy.asnumpy(b).tobytes() == a.tobytes()
    # Every pool's gradient the same row: autograd's expanded gradient of a sum, column and row stride 0.
    row = cupy.asarray(grad[:1])
    expanded = cupy.broadcast_to(row, grad.shape)
    got = [cupy.asnumpy(g) for g in kpool_cupy.kpool_compress_backward(expanded, *args)]
    want = [cupy.asnumpy(g) for g in kpool_cupy.kpool_compress_backward(cupy.ascontiguousarray(expanded), *args)]
    for a, b in zip(want, got, strict=True):
        assert a.tobytes() == b.tobytes()
