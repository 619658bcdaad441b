"""The FP8 scorer on a GPU: the CuPy path against the float64 reference within the GPU bound, both tensor-core
paths (e4m3 and the sm_80 f16 path, forced), and its device time at engine shapes; the selection: kpool_index_topk
of the GPU's logits against the reference's selection of the same logits, and kpool_index_select_fp8 against the
GPU's two calls, bit for bit, on both paths. Prints one JSON line a case.

    python scripts/gpu_index_check.py            (on a machine with a GPU; run from the repository root)
    python scripts/gpu_index_check.py --no-timing (the checks alone)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import cupy
from index_cases import index_case

import kpool_cupy
from kpool_cupy import reference
from kpool_cupy.backends import cupy as cupy_backend
from kpool_cupy.kernel.declarations import MMA_E4M3, MMA_F16
from kpool_cupy.tools.index_accuracy import (
    gpu_accumulation_bits,
    index_logits_agree,
    index_logits_bound,
)


def on_gpu(case, mma: int | None, **options):
    original = cupy_backend.CupyBackend.tensor_core
    if mma is not None:
        cupy_backend.CupyBackend.tensor_core = lambda self: mma
    try:
        args = [cupy.asarray(a) for a in case.args]
        return cupy.asnumpy(kpool_cupy.kpool_index_logits_fp8(*args, kpool=case.kpool, **options))
    finally:
        cupy_backend.CupyBackend.tensor_core = original


def accuracy(name, case, mma):
    want = reference.kpool_index_logits_fp8(*case.args, kpool=case.kpool)
    got = on_gpu(case, mma)
    row = {"case": name, "mma": "default" if mma is None else mma}
    capability = int(cupy.cuda.Device().compute_capability)
    used = mma if mma is not None else cupy_backend.CupyBackend(cupy, cupy.cuda.Device().id).tensor_core()
    for bits in sorted({24, gpu_accumulation_bits(capability, used)}, reverse=True):
        bound = index_logits_bound(*case.args, kpool=case.kpool, max_pools=want.shape[1], accumulation_bits=bits)
        verdict = index_logits_agree(got, want, bound)
        row[f"bits{bits}"] = {k: verdict[k] for k in ("ok", "worst_error_over_bound", "max_abs_err", "same_inf")}
    print(json.dumps(row), flush=True)


def selection(name, case, mma, pool_topk, **options):
    """The GPU's selection of its own logits equals the reference's selection of them; the fused call equals the
    GPU's two calls; the workspace's counters are zero after it."""
    original = cupy_backend.CupyBackend.tensor_core
    if mma is not None:
        cupy_backend.CupyBackend.tensor_core = lambda self: mma
    try:
        args = [cupy.asarray(a) for a in case.args]
        rows = {"input_row_offsets": args[4], "cache_lengths": args[5]}
        call = {"kpool": case.kpool, "pool_topk": pool_topk, **options}
        logits = kpool_cupy.kpool_index_logits_fp8(*args, kpool=case.kpool)
        two = kpool_cupy.kpool_index_topk(logits, **rows, **call)
        host = reference.kpool_index_topk(cupy.asnumpy(logits), case.input_row_offsets, case.cache_lengths, **call)
        workspace = cupy.zeros(kpool_cupy.index_select_workspace_bytes(case.q.shape[0], pool_topk), cupy.uint8)
        fused = kpool_cupy.kpool_index_select_fp8(*args, workspace=workspace, **call)
    finally:
        cupy_backend.CupyBackend.tensor_core = original
    counters = workspace[: 16 * -(-4 * case.q.shape[0] // 16)]
    row = {"selection": name, "mma": "default" if mma is None else mma, "pool_topk": pool_topk}
    row["topk_equals_reference"] = bool(np.array_equal(cupy.asnumpy(two), host))
    row["fused_equals_two_calls"] = bool(cupy.array_equal(fused, two))
    row["counters_zero"] = not bool(counters.any())
    print(json.dumps(row), flush=True)


def timing(name, heads, requests, next_n, context, kpool=4, block_size=64):
    rng = np.random.default_rng(0)
    case = index_case(
        rng,
        heads=heads,
        kpool=kpool,
        block_size=block_size,
        counts=(next_n,) * requests,
        cache_lengths=(context,) * requests,
        spare_pages=0,
        spare_columns=0,
    )
    args = [cupy.asarray(a) for a in case.args]
    max_pools = int(case.visible().max())
    out = cupy.empty((case.q.shape[0], max_pools), cupy.float32)
    call = lambda: kpool_cupy.kpool_index_logits_fp8(*args, kpool=kpool, max_pools=max_pools, out=out, validate=False)  # noqa: E731
    for _ in range(3):
        call()
    cupy.cuda.Device().synchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    reps = 20
    start.record()
    for _ in range(reps):
        call()
    end.record()
    end.synchronize()
    ms = cupy.cuda.get_elapsed_time(start, end) / reps
    cache_bytes = requests * max_pools * (128 + 4)
    flops = 2 * case.q.shape[0] * heads * 128 * max_pools
    print(
        json.dumps(
            {
                "timing": name,
                "us": round(ms * 1e3, 2),
                "cache_GBps": round(cache_bytes / ms / 1e6, 1),
                "TFLOPs": round(flops / ms / 1e9, 2),
            }
        ),
        flush=True,
    )


def main() -> None:
    rng = np.random.default_rng(1)
    props = cupy.cuda.runtime.getDeviceProperties(0)
    print(
        json.dumps(
            {"gpu": props["name"].decode(), "cc": f"{props['major']}.{props['minor']}", "cupy": cupy.__version__}
        ),
        flush=True,
    )
    for d in (64, 128, 256):
        for heads in (1, 20, 64):
            case = index_case(rng, head_dim=d, heads=heads, counts=(5, 0, 11, 2), cache_lengths=(3, 9, 400, 0))
            accuracy(f"prefill d{d} h{heads}", case, None)
    for mma in (MMA_E4M3, MMA_F16):
        case = index_case(rng, heads=32, counts=(2,) * 6, cache_lengths=(61, 64, 127, 5, 0, 1000))
        accuracy(f"decode next_n 2 forced mma {mma}", case, mma)
    case = index_case(rng, heads=128, block_size=64, counts=(3, 40), cache_lengths=(3000, 17))
    accuracy("h128 bs64", case, None)
    for mma in (None, MMA_F16):
        case = index_case(rng, heads=32, kpool=4, block_size=64, counts=(1,), cache_lengths=(131071,))
        selection("decode B1 ctx128K", case, mma, 512)
        case = index_case(rng, heads=32, kpool=4, block_size=64, counts=(2,) * 64, cache_lengths=(8190,) * 64)
        selection("decode B64 next_n2 ctx8K", case, mma, 512, always_select_tail=True)
        case = index_case(rng, heads=32, kpool=4, block_size=64, counts=(512,), cache_lengths=(16384,))
        selection("prefill 512 ctx16K", case, mma, 2048, compact=True)
    if "--no-timing" in sys.argv:
        return
    timing("decode B64 next_n1 ctx8K h64", 64, 64, 1, 8192)
    timing("decode B64 next_n2 ctx8K h64", 64, 64, 2, 8192)
    timing("decode B8 next_n1 ctx128K h64", 64, 8, 1, 131072)
    timing("prefill 1x2048 ctx8K h64", 64, 1, 2048, 8192 - 2048)
    timing("prefill 1x2048 ctx8K h32", 32, 1, 2048, 8192 - 2048)


if __name__ == "__main__":
    main()
