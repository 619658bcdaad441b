"""kpool_cupy.torch on CUDA tensors: the CuPy path's bits, torch's stream, graph capture, a second device.

Needs torch with CUDA and a device (skipped otherwise, and on the CuPy
double: it has no torch CUDA).
"""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a CUDA device"),
]

HEAD_DIM, KPOOL = 128, 4


def _batch(seed: int, device: str = "cuda"):
    from kpool_cupy.torch.tensors import from_numpy

    rng = np.random.default_rng(seed)
    lengths, cached = [9, 1, 12, 4], [3, 2, 0, 7]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    k = rng.standard_normal((sum(lengths), HEAD_DIM)).astype(BF16)
    gate = (3 * rng.standard_normal((sum(lengths), HEAD_DIM))).astype(BF16)
    ape = rng.standard_normal((KPOOL, HEAD_DIM)).astype(np.float32)
    host = (k, gate, ape, offsets, np.asarray(cached, np.int32))
    return host, tuple(from_numpy(a).to(device) for a in host)


def test_cuda_ops_equal_the_cupy_path_bit_for_bit():
    import cupy

    import kpool_cupy
    import kpool_cupy.torch as kt

    host, tensors = _batch(1)
    want = cupy.asnumpy(kpool_cupy.kpool_compress(*(cupy.asarray(a) for a in host)))
    got = kt.kpool_compress(*tensors)
    assert got.device.type == "cuda"
    assert got.cpu().view(torch.int16).numpy().tobytes() == want.view(np.int16).tobytes()
    ids = torch.randint(-1, 8, (tensors[0].shape[0], 4), dtype=torch.int32, device="cuda")
    want_ids = cupy.asnumpy(
        kpool_cupy.kpool_expand_topk(cupy.asarray(ids.cpu().numpy()), cupy.asarray(host[3]), cupy.asarray(host[4]),
                                     kpool=KPOOL)
    )  # fmt: skip
    assert np.array_equal(kt.kpool_expand_topk(ids, tensors[3], tensors[4], kpool=KPOOL).cpu().numpy(), want_ids)


def test_a_captured_call_replays_with_new_inputs_written_in_place():
    import kpool_cupy.torch as kt

    _, (k, gate, ape, offsets, cache) = _batch(2)
    pools = torch.ops.kpool.pool_row_offsets(offsets, cache, KPOOL)
    out = torch.empty((int(pools[-1]), HEAD_DIM), dtype=torch.bfloat16, device="cuda")

    def call():
        kt.kpool_compress(k, gate, ape, offsets, cache, pool_row_offsets=pools, out=out, validate=False)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # compiles and loads outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    _, (k2, gate2, _, _, _) = _batch(3)
    k.copy_(k2)
    gate.copy_(gate2)
    graph.replay()
    torch.cuda.synchronize()
    want = kt.kpool_compress(k2, gate2, ape, offsets, cache)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))


def _decode_inputs(seed: int, heads: int = 4, head_dim: int = 64) -> dict:
    """One decode step's tensors on the GPU (tests/test_torch_graph_capture.py's step, there on the CuPy double)."""
    r = np.random.default_rng(seed)
    cache = r.integers(0, 0x7E, (4, 4, head_dim + 4), dtype=np.uint8)
    cache.reshape(4, -1)[:, 4 * head_dim :] = np.full((4, 4), 0.25, np.float32).view(np.uint8)
    return {
        "tail": torch.from_numpy(r.standard_normal((3, 2, 6, head_dim)).astype(np.float32)).to("cuda", torch.bfloat16),
        "k": torch.from_numpy(r.standard_normal((2, 3, head_dim)).astype(np.float32)).to("cuda", torch.bfloat16),
        "gate": torch.from_numpy(r.standard_normal((2, 3, head_dim)).astype(np.float32)).to("cuda", torch.bfloat16),
        "ape": torch.from_numpy(r.standard_normal((2, head_dim)).astype(np.float32)).cuda(),
        "cache": torch.from_numpy(cache).cuda(),
        "queries": torch.from_numpy(r.standard_normal((5 * heads, head_dim)).astype(np.float32)).cuda(),
        "weights": torch.from_numpy(r.standard_normal((5, heads)).astype(np.float32)).cuda(),
    }


def test_a_decode_step_through_torch_ops_captured_in_a_cuda_graph_replays_as_eager():
    # Tail update FP8, query quantize, the fused select and the two-call select through torch.ops.kpool, with
    # validate=False and their workspaces: captured once, replayed over new inputs, equal to eager.
    import copy

    import kpool_cupy

    kp = torch.ops.kpool
    cuda = {"device": "cuda", "dtype": torch.int32}
    table, slots = torch.tensor([[1, 3], [0, 2]], **cuda), torch.tensor([2, 0], **cuda)
    offsets, lengths = torch.tensor([0, 3, 5], **cuda), torch.tensor([5, 9], **cuda)
    positions = torch.tensor([[5, 6, 7], [9, 10, -1]], **cuda)
    workspace = torch.zeros(kpool_cupy.index_select_workspace_bytes(5, 2), dtype=torch.uint8, device="cuda")
    topk_space = torch.zeros(max(1, kpool_cupy.index_topk_workspace_bytes(5, 8, 2)), dtype=torch.uint8, device="cuda")
    logits = torch.empty((5, 8), device="cuda")
    options = {"kpool": 2, "pool_topk": 2, "always_select_tail": True, "validate": False}

    def step(x):
        closed = kp.tail_update_fp8.cache(
            [x["tail"]], x["k"], x["gate"], x["ape"], positions, slots, cache=x["cache"], block_table=table,
            validate=False,
        )  # fmt: skip
        values, scales = kp.hadamard_quant_fp8(x["queries"], validate=False)
        q = values.view(5, 4, 64)
        fused, _ = kp.index_select_fp8(q, x["weights"], x["cache"], table, offsets, lengths, workspace=workspace,
                                       **options)  # fmt: skip
        kp.index_logits_fp8.out(q, x["weights"], x["cache"], table, offsets, lengths, kpool=2, max_pools=8,
                                out=logits, validate=False)  # fmt: skip
        two, _ = kp.index_topk(logits, offsets, lengths, workspace=topk_space, **options)
        return closed, values, scales, fused, two.clone()

    live = _decode_inputs(1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(copy.deepcopy(live))  # compiles and loads outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        results = step(live)
    for seed in (2, 3):
        fresh = _decode_inputs(seed)
        for name, tensor in fresh.items():
            live[name].copy_(tensor)
        graph.replay()
        torch.cuda.synchronize()
        eager = copy.deepcopy(fresh)
        want = step(eager)
        for got, expected in zip(results, want, strict=True):
            assert torch.equal(got, expected), seed
        assert torch.equal(live["cache"], eager["cache"]) and torch.equal(live["tail"], eager["tail"])
        assert not workspace[:512].any() and not topk_space[:512].any()


def test_work_is_ordered_on_a_non_default_torch_stream():
    import kpool_cupy.torch as kt

    _, (k, gate, ape, offsets, cache) = _batch(4)
    want = kt.kpool_compress(k, gate, ape, offsets, cache)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        busy = torch.randn(4096, 4096, device="cuda")
        for _ in range(8):
            busy = busy @ busy  # keeps the stream busy while k changes on it
        k2 = k.clone()
        got = kt.kpool_compress(k2, gate, ape, offsets, cache)
    stream.synchronize()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_hot_calls_replay_their_plan_on_torchs_current_stream():
    # The first .out call of a signature makes its launch plan (kpool_cupy/torch/plans.py); the others launch
    # from the tensors' pointers on torch's current stream, which a side stream keeps busy while k changes.
    import kpool_cupy.torch as kt

    _, (k, gate, ape, offsets, cache) = _batch(6)
    pools = torch.ops.kpool.pool_row_offsets(offsets, cache, KPOOL)
    want = kt.kpool_compress(k, gate, ape, offsets, cache)
    outs = [torch.empty_like(want) for _ in range(3)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for out in outs:
            busy = torch.randn(4096, 4096, device="cuda")
            for _ in range(8):
                busy = busy @ busy
            k2 = k.clone()
            kt.kpool_compress(k2, gate, ape, offsets, cache, pool_row_offsets=pools, out=out, validate=False)
    stream.synchronize()
    for out in outs:
        assert torch.equal(out.view(torch.int16), want.view(torch.int16))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second CUDA device")
def test_tensors_on_a_second_device_run_there():
    import kpool_cupy.torch as kt

    _, tensors = _batch(5, device="cuda:1")
    with torch.cuda.device(0):
        got = kt.kpool_compress(*tensors)
    assert got.device == torch.device("cuda:1")
    _, on_first = _batch(5, device="cuda:0")
    assert torch.equal(got.cpu().view(torch.int16), kt.kpool_compress(*on_first).cpu().view(torch.int16))


@pytest.mark.parametrize(
    "loss",
    [
        lambda pooled: pooled.sum(),  # an expanded gradient, strides (0, 0)
        lambda pooled: (pooled.T * torch.arange(1.0, 1.0 + pooled.shape[0], device="cuda")).sum(),  # column-major
        lambda pooled: (pooled * pooled).sum(),  # a plain one
    ],
    ids=["expanded", "transposed", "dense"],
)
def test_cuda_gradients_equal_the_cupy_backward_bit_for_bit(loss):
    # The gradient goes to the backward op as autograd made it (through
    # DLPack, strides and all); the CuPy call on a contiguous copy of it
    # gives the same bits.
    import cupy

    import kpool_cupy
    import kpool_cupy.torch as kt

    host, (k, gate, ape, offsets, cache) = _batch(6)
    leaves = [t.detach().clone().requires_grad_() for t in (k, gate, ape)]
    pooled = kt.kpool_compress(*leaves, offsets, cache, out_dtype=torch.float32)
    seen = []
    pooled.register_hook(seen.append)
    loss(pooled).backward()
    grad = cupy.asarray(seen[0].contiguous().cpu().numpy())
    want = kpool_cupy.kpool_compress_backward(grad, *(cupy.asarray(a) for a in host))
    for leaf, wanted in zip(leaves, want, strict=True):
        got = leaf.grad.cpu()
        got = (got.view(torch.int16) if got.dtype == torch.bfloat16 else got).numpy()
        assert got.tobytes() == cupy.asnumpy(wanted).tobytes()
