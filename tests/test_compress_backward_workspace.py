"""The backward's ``workspace=``: d ape's block partials in the caller's bytes, sized by
``kpool_cupy.compress_backward_workspace_bytes``; with it, its outputs, ``pool_row_offsets`` and
``validate=False`` the GPU path allocates nothing and syncs nothing (shown on the CuPy double), and torch's
CUDA backward makes it from torch's allocator."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from double import run_on_double

import kpool_cupy
from kpool_cupy import emulate, reference
from kpool_cupy.ops.framework.examples import example_batch

BACKENDS = [reference, emulate]
TIMEOUT_S = 300  # a guard against a hang: seconds warm, up to a minute compiling the kernels


def _call():
    b = example_batch(head_dim=64, kpool=4)
    return (b.grad_pooled, b.k, b.gate, b.ape, b.offsets, b.lengths), b.k.shape[0]


def test_the_size_is_the_partials_for_every_pool_the_tokens_can_complete():
    # 4096 tokens of 128 at kpool 4: 1024 pools, 16 a block of 256 threads, a float32 [4, 128] partial a block.
    assert kpool_cupy.compress_backward_workspace_bytes(4096, 128, 4) == 64 * 4 * 128 * 4
    assert kpool_cupy.compress_backward_workspace_bytes(3, 128, 4) == 0  # no complete pool: nothing to sum
    # Sizes of calls no op takes are refused, naming the argument, as the other sizing functions refuse theirs (a
    # hostile round found head_dim 12 sized at 192 bytes and kpool 2000 at 0).
    with pytest.raises(ValueError, match=r"^Invalid kpool: expected an integer in \[1, 1024\], got 0$"):
        kpool_cupy.compress_backward_workspace_bytes(16, 128, 0)
    with pytest.raises(ValueError, match=r"^Invalid kpool: expected an integer in \[1, 1024\], got 2000$"):
        kpool_cupy.compress_backward_workspace_bytes(16, 128, 2000)
    for head_dim in (12, 8192, 0, -8):
        wanted = rf"^Invalid head_dim: expected a positive multiple of 8 up to 4096, got {head_dim}$"
        with pytest.raises(ValueError, match=wanted):
            kpool_cupy.compress_backward_workspace_bytes(16, head_dim, 4)
    with pytest.raises(TypeError, match=r"^Invalid head_dim: expected an integer, got float$"):
        kpool_cupy.compress_backward_workspace_bytes(16, 128.0, 4)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__.rpartition(".")[2])
def test_any_contents_give_the_same_bits_as_the_calls_own_partials(backend):
    args, tokens = _call()
    want = backend.kpool_compress_backward(*args)
    size = kpool_cupy.compress_backward_workspace_bytes(tokens, 64, 4)
    workspace = np.full(size + 32, 0xFF, np.uint8)[16:-16]  # NaN bytes: a partial read before written shows
    got = backend.kpool_compress_backward(*args, workspace=workspace)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__.rpartition(".")[2])
def test_a_bad_workspace_is_refused_naming_it(backend):
    args, tokens = _call()
    size = kpool_cupy.compress_backward_workspace_bytes(tokens, 64, 4)
    read_only = np.zeros(size, np.uint8)
    read_only.flags.writeable = False
    cases = [
        (np.zeros(size - 1, np.uint8), ValueError, rf"^Invalid workspace: expected at least {size} bytes "
         rf"\(compress_backward_workspace_bytes\({tokens}, 64, 4\)\), got {size - 1} bytes"),
        (np.zeros(size + 16, np.uint8)[1 : size + 1], ValueError, r"^Invalid workspace: expected a 16-byte aligned"),
        (np.zeros(size // 4, np.float32), TypeError, r"^Invalid workspace: expected dtype uint8"),
        (read_only, ValueError, r"^Invalid workspace: expected a writable array"),
    ]  # fmt: skip
    for workspace, error, message in cases:
        with pytest.raises(error, match=message):
            backend.kpool_compress_backward(*args, workspace=workspace)
    grad_k = np.zeros(args[1].shape, args[1].dtype)
    with pytest.raises(ValueError, match=r"^Invalid grad_k: .* sharing bytes with workspace"):  # partials in its rows
        backend.kpool_compress_backward(*args, grad_k=grad_k, workspace=grad_k.reshape(-1).view(np.uint8))


_SCRIPT = textwrap.dedent(
    """
    import contextlib, sys
    import numpy as np, torch, cupy
    from cupy import cuda
    sys.path.insert(0, "tests")
    import test_torch_ops as t
    import kpool_cupy
    from kpool_cupy import emulate
    from kpool_cupy.ops.framework.examples import example_batch
    from kpool_cupy.torch import kernels
    from kpool_cupy.torch.schema import SPECS, overloads
    from kpool_cupy.torch.tensors import to_numpy

    b = example_batch(head_dim=64, kpool=4)
    host = (b.grad_pooled, b.k, b.gate, b.ape, b.offsets, b.lengths)
    want = emulate.kpool_compress_backward(*host)
    pools = kpool_cupy.pool_row_offsets(b.offsets, b.lengths, 4)
    grads = [cupy.asarray(np.zeros_like(w)) for w in want]
    workspace = cupy.zeros(kpool_cupy.compress_backward_workspace_bytes(len(b.k), 64, 4), cupy.uint8)
    device = [cupy.asarray(a) for a in host]
    keywords = dict(pool_row_offsets=cupy.asarray(pools), grad_k=grads[0], grad_gate=grads[1], grad_ape=grads[2],
                    workspace=workspace, validate=False)
    kpool_cupy.kpool_compress_backward(*device, **keywords)  # warm: the kernels built
    capture = cuda.Stream(non_blocking=True)
    used = cupy.get_default_memory_pool().used_bytes()
    capture.begin_capture()
    with capture:
        kpool_cupy.kpool_compress_backward(*device, **keywords)  # recorded: a sync or an array operation raises
    graph = capture.end_capture()
    assert cupy.get_default_memory_pool().used_bytes() == used, "the backward allocated"
    for g in grads:
        g[...] = 0
    graph.launch(capture)
    capture.synchronize()
    for g, w in zip(grads, want):
        assert np.asarray(g).tobytes() == w.tobytes()

    # torch's CUDA backward (CPU tensors standing in) makes the partials from torch's allocator, not CuPy's.
    kernels._torch_stream = lambda device: contextlib.nullcontext()
    kernels._launch_stream = lambda device_id: None
    kernels.to_cupy = lambda name, tensor: to_numpy(name, tensor).view(cupy.ndarray)
    kernels.from_cupy = lambda array: t.from_numpy(np.asarray(array).view(np.ndarray))
    spec = next(s for s in SPECS if s.name == "kpool_compress_backward")
    backward = kernels.cuda_kernel(spec, overloads(spec)[0])
    tensors = [t._tensor(a) for a in host]
    used = cupy.get_default_memory_pool().used_bytes()
    got = backward(*tensors, pool_row_offsets=t._tensor(np.asarray(pools)), validate=False)  # as autograd's can
    assert cupy.get_default_memory_pool().used_bytes() == used, "torch's backward allocated from CuPy"
    t._same(got, want)
    print("ok")
    """
)


def test_with_a_workspace_the_gpu_backward_launches_only_and_torchs_makes_it():
    pytest.importorskip("torch")
    done = run_on_double(_SCRIPT, timeout=TIMEOUT_S)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-3000:] + done.stderr[-4000:]
