"""A decode step through ``torch.ops.kpool``'s CUDA kernels, captured as a CUDA graph and replayed over new inputs.

No GPU here: the CUDA implementations run on the CuPy double (CuPy over NumPy, kernels on the emulator), CPU
tensors standing in for CUDA ones and a capturing double stream for torch's. The double records launches
without running them and raises on anything a capture refuses (a wait for the stream, a host read that
waits, an array operation), and counts every array it makes. So the step, with ``validate=False``, its
workspace and the outputs torch makes, is shown to launch only: nothing allocated from CuPy, nothing synced.
The replay over changed inputs must equal the same step run eagerly on them. ``scripts/gpu_check.sh`` runs
the same step under ``torch.cuda.CUDAGraph`` on a GPU (tests/test_torch_cuda.py).
"""

from __future__ import annotations

import textwrap

import pytest
from double import run_on_double

pytest.importorskip("torch")

TIMEOUT_S = 300  # a guard against a hang: the script takes seconds warm, up to a minute compiling its kernels

_SCRIPT = textwrap.dedent(
    """
    import copy, sys
    import numpy as np, torch, cupy
    from cupy import cuda
    sys.path.insert(0, "tests")
    import kpool_cupy
    from kpool_cupy.ops.framework.examples import example_batch
    from torch_on_double import current, op


    tail_update, quantize = op("kpool_tail_update_fp8", "cache"), op("hadamard_quant_fp8")
    select, score, topk = op("kpool_index_select_fp8"), op("kpool_index_logits_fp8", "out"), op("kpool_index_topk")
    KPOOL, HEADS, D, TOPK = 2, 4, 64, 2
    batch = example_batch(head_dim=D, kpool=KPOOL)  # two requests; step tokens at 5, 6, 7 and 9, 10
    table = torch.tensor([[1, 3], [0, 2]], dtype=torch.int32)  # 4 pages of 4 pooled keys
    offsets, lengths = torch.tensor([0, 3, 5], dtype=torch.int32), torch.tensor([5, 9], dtype=torch.int32)
    positions = torch.tensor([[5, 6, 7], [9, 10, -1]], dtype=torch.int32)
    slots = torch.tensor([2, 0], dtype=torch.int32)
    workspace = torch.zeros(kpool_cupy.index_select_workspace_bytes(5, TOPK), dtype=torch.uint8)
    topk_space = torch.zeros(max(1, kpool_cupy.index_topk_workspace_bytes(5, 8, TOPK)), dtype=torch.uint8)
    logits = torch.empty(5, 8)
    options = {"kpool": KPOOL, "pool_topk": TOPK, "always_select_tail": True, "validate": False}


    def inputs(seed):
        r = np.random.default_rng(seed)
        step = r.standard_normal((2, 3, D)).astype(np.float32)
        cache = r.integers(0, 0x7E, (4, 4, D + 4), dtype=np.uint8)
        cache.reshape(4, -1)[:, 4 * D :] = np.full((4, 4), 0.25, np.float32).view(np.uint8)
        return {
            "tail": torch.from_numpy(r.standard_normal((3, 2, 6, D)).astype(np.float32)).to(torch.bfloat16),
            "k": torch.from_numpy(step).to(torch.bfloat16),
            "gate": torch.from_numpy(r.standard_normal((2, 3, D)).astype(np.float32)).to(torch.bfloat16),
            "ape": torch.from_numpy(r.standard_normal((KPOOL, D)).astype(np.float32)),
            "cache": torch.from_numpy(cache),
            "queries": torch.from_numpy(r.standard_normal((5 * HEADS, D)).astype(np.float32)),
            "weights": torch.from_numpy(r.standard_normal((5, HEADS)).astype(np.float32)),
        }


    def step(x):
        # Tail update FP8 (closing pools into the cache), query quantize, then the fused select and the two calls.
        closed = tail_update([x["tail"]], x["k"], x["gate"], x["ape"], positions, slots, cache=x["cache"],
                             block_table=table, validate=False)
        values, scales = quantize(x["queries"], validate=False)
        q = values.view(5, HEADS, D)
        fused, _ = select(q, x["weights"], x["cache"], table, offsets, lengths, workspace=workspace, **options)
        score(q, x["weights"], x["cache"], table, offsets, lengths, kpool=KPOOL, max_pools=8, out=logits,
              validate=False)
        two, _ = topk(logits, offsets, lengths, workspace=topk_space, **options)
        return closed, values, scales, fused, two


    live = inputs(1)
    step(copy.deepcopy(live))  # warm: each kernel variant built and each signature's plan made, as before a capture
    capture = cuda.Stream(non_blocking=True)
    current[0] = capture
    before = cupy.get_default_memory_pool().used_bytes()
    capture.begin_capture()
    results = step(live)  # recorded, not run
    graph = capture.end_capture()
    assert cupy.get_default_memory_pool().used_bytes() == before, "a captured call allocated from CuPy"
    captured = [entry for entry in cuda.launch_log if entry[1] == capture.ptr]
    assert len(captured) == 5 and all(fate == "captured" for _, _, fate in captured), captured
    for seed in (2, 3):  # new inputs in the captured memory, then one replay
        fresh = inputs(seed)
        for name, tensor in fresh.items():
            live[name].copy_(tensor)
        graph.launch(capture)
        capture.synchronize()
        current[0] = cuda.Stream.null
        eager = copy.deepcopy(fresh)
        want = step(eager)
        current[0] = capture
        for got, expected in zip(results, want, strict=True):
            assert torch.equal(got, expected), seed
        for name in ("cache", "tail"):  # written in place alike
            assert torch.equal(live[name], eager[name]) and not torch.equal(live[name], fresh[name]), name
        assert not workspace[:512].any() and not topk_space[:512].any()  # counters left zero: the next replay
    print("ok")
    """
)


def test_a_captured_decode_step_launches_only_and_replays_as_eager():
    done = run_on_double(_SCRIPT, timeout=TIMEOUT_S)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-3000:] + done.stderr[-4000:]
