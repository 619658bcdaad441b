"""The FP8 scorer on a GPU, on every tensor-core path the device has: the CuPy path against the float64 reference
within the GPU bound, and its device time at engine shapes; the selection: kpool_index_topk of the GPU's logits
against the reference's selection of the same logits, and kpool_index_select_fp8 against the GPU's two calls, bit
for bit; the same keys in pages of 8 and of 64, bit for bit. Prints one JSON line a case and path, then a verdict
line; exits 1 when a check failed.

    python scripts/gpu_index_check.py                   (on a machine with a GPU; run from the repository root)
    python scripts/gpu_index_check.py --no-timing       (the checks alone: scripts/gpu_check.sh runs this)
    python scripts/gpu_index_check.py --path sm_90a     (one path; repeat --path for more)

The paths (``device_paths``): on compute capability 9.0, ``sm_90a`` (wgmma) and ``sm_90`` (f16 mma.sync on e4m3
converted by the hardware, MMA_E4M3_HMMA), each
chosen through KPOOL_CUPY_SM90_BUILD as a user chooses it, and ``f16`` (the sm_80 path, forced by patching
CupyBackend.tensor_core: no setting picks it on a newer GPU); on other GPUs ``default`` (what the device takes)
and, from sm_89, ``f16``. The fused select takes the same path as the scorer, so its logits must be the scorer's.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import cupy
from index_cases import index_case, repaged

import kpool_cupy
from kpool_cupy import reference
from kpool_cupy.backends import cupy as cupy_backend
from kpool_cupy.backends import cupy_plans
from kpool_cupy.kernel.declarations import MMA_F16
from kpool_cupy.tools.index_accuracy import (
    gpu_accumulation_bits,
    index_logits_agree,
    index_logits_bound,
)

PATHS = ("sm_90a", "sm_90", "default", "f16")
failures: list[str] = []  # every row that failed, by its case and path


def device_paths(capability: int) -> list[str]:
    """The paths a GPU of compute ``capability`` (90 for sm_90) can run: see the module docstring."""
    if capability == 90:
        return ["sm_90a", "sm_90", "f16"]
    return ["default", "f16"] if capability >= 89 else ["default"]


@contextlib.contextmanager
def on_path(path: str) -> Iterator[None]:
    """Every GPU call inside runs on ``path``: sm_90a and sm_90 set KPOOL_CUPY_SM90_BUILD, f16 patches
    CupyBackend.tensor_core, default leaves both as they are. A launch plan replays the kernel its first call
    chose, whatever the path is now, so each path starts and ends without plans."""
    variable = cupy_backend.SM90_BUILD_VARIABLE
    saved = os.environ.get(variable)
    original = cupy_backend.CupyBackend.tensor_core
    if path in cupy_backend.SM90_BUILDS:
        os.environ[variable] = path
    elif path == "f16":
        cupy_backend.CupyBackend.tensor_core = lambda self: MMA_F16
    elif path != "default":
        raise ValueError(f"Invalid path: expected one of {', '.join(PATHS)}, got {path!r}")
    cupy_plans.forget_all()
    try:
        yield
    finally:
        cupy_plans.forget_all()
        cupy_backend.CupyBackend.tensor_core = original
        if saved is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = saved


def path_mma(path: str) -> int:
    """The MMA template argument the scorer and the fused select take on ``path`` (on this process's device)."""
    with on_path(path):
        return cupy_backend.CupyBackend(cupy, cupy.cuda.Device().id).tensor_core()


def emit(row: dict, ok: bool) -> None:
    row["ok"] = ok
    if not ok:
        failures.append(f"{row.get('case') or row.get('selection') or row.get('paging')} on {row['path']}")
    print(json.dumps(row), flush=True)


def accuracy(name, case, paths, capability):
    """The GPU's logits on each path against the float64 reference, within the CPU bound (24 bits) and the path's
    GPU bound; the row passes on the GPU bound."""
    want = reference.kpool_index_logits_fp8(*case.args, kpool=case.kpool)
    bounds = {}
    for path in paths:
        mma = path_mma(path)
        with on_path(path):
            args = [cupy.asarray(a) for a in case.args]
            got = cupy.asnumpy(kpool_cupy.kpool_index_logits_fp8(*args, kpool=case.kpool))
        gpu_bits = gpu_accumulation_bits(capability, mma)
        row = {"case": name, "path": path, "mma": mma}
        for bits in sorted({24, gpu_bits}, reverse=True):
            if bits not in bounds:
                bounds[bits] = index_logits_bound(
                    *case.args, kpool=case.kpool, max_pools=want.shape[1], accumulation_bits=bits
                )
            verdict = index_logits_agree(got, want, bounds[bits])
            row[f"bits{bits}"] = {k: verdict[k] for k in ("ok", "worst_error_over_bound", "max_abs_err", "same_inf")}
        emit(row, row[f"bits{gpu_bits}"]["ok"])


def selection(name, case, paths, pool_topk, **options):
    """On each path: the GPU's selection of its own logits equals the reference's selection of them; the fused
    call equals the GPU's two calls; the workspace's counters are zero after it."""
    for path in paths:
        mma = path_mma(path)
        with on_path(path):
            args = [cupy.asarray(a) for a in case.args]
            rows = {"input_row_offsets": args[4], "cache_lengths": args[5]}
            call = {"kpool": case.kpool, "pool_topk": pool_topk, **options}
            logits = kpool_cupy.kpool_index_logits_fp8(*args, kpool=case.kpool)
            two = kpool_cupy.kpool_index_topk(logits, **rows, **call)
            host = reference.kpool_index_topk(cupy.asnumpy(logits), case.input_row_offsets, case.cache_lengths, **call)
            workspace = cupy.zeros(kpool_cupy.index_select_workspace_bytes(case.q.shape[0], pool_topk), cupy.uint8)
            fused = kpool_cupy.kpool_index_select_fp8(*args, workspace=workspace, **call)
        counters = workspace[: 16 * -(-4 * case.q.shape[0] // 16)]
        row = {"selection": name, "path": path, "mma": mma, "pool_topk": pool_topk}
        row["topk_equals_reference"] = bool(np.array_equal(cupy.asnumpy(two), host))
        row["fused_equals_two_calls"] = bool(cupy.array_equal(fused, two))
        row["counters_zero"] = not bool(counters.any())
        emit(row, row["topk_equals_reference"] and row["fused_equals_two_calls"] and row["counters_zero"])


def paging(name, case, paths, block_size=64, pool_topk=64):
    """On each path: the same keys in the case's pages and in pages of ``block_size`` (where the sm_90a scorer and
    fused select copy each key tile from one page) give the same logits, bit for bit, and the same selection."""
    paged = repaged(case, block_size, np.random.default_rng(block_size))
    for path in paths:
        with on_path(path):
            args, paged_args = [cupy.asarray(a) for a in case.args], [cupy.asarray(a) for a in paged.args]
            rows = kpool_cupy.kpool_index_logits_fp8(*args, kpool=case.kpool)
            one_page = kpool_cupy.kpool_index_logits_fp8(*paged_args, kpool=case.kpool)
            selected = kpool_cupy.kpool_index_select_fp8(*args, kpool=case.kpool, pool_topk=pool_topk)
            selected_paged = kpool_cupy.kpool_index_select_fp8(*paged_args, kpool=case.kpool, pool_topk=pool_topk)
        row = {"paging": name, "path": path, "mma": path_mma(path), "block_size": block_size}
        row["same_bits"] = bool(cupy.array_equal(rows.view(cupy.uint32), one_page.view(cupy.uint32)))
        row["same_selection"] = bool(cupy.array_equal(selected, selected_paged))
        emit(row, row["same_bits"] and row["same_selection"])


def device_ms(call, reps: int = 20) -> float:
    """Milliseconds of device time a call of ``call``, over ``reps`` calls after three warm-ups."""
    for _ in range(3):
        call()
    cupy.cuda.Device().synchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(reps):
        call()
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / reps


def timing(name, paths, heads, requests, next_n, context, kpool=4, block_size=64):
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
    max_pools = int(case.visible().max())
    cache_bytes = requests * max_pools * (128 + 4)
    flops = 2 * case.q.shape[0] * heads * 128 * max_pools
    for path in paths:
        with on_path(path):
            args = [cupy.asarray(a) for a in case.args]
            out = cupy.empty((case.q.shape[0], max_pools), cupy.float32)
            options = {"kpool": kpool, "max_pools": max_pools, "out": out, "validate": False}
            ms = device_ms(functools.partial(kpool_cupy.kpool_index_logits_fp8, *args, **options))
        record = {"timing": name, "path": path, "us": round(ms * 1e3, 2)}
        record |= {"cache_GBps": round(cache_bytes / ms / 1e6, 1), "TFLOPs": round(flops / ms / 1e9, 2)}
        print(json.dumps(record), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-timing", action="store_true", help="the checks alone")
    parser.add_argument("--path", action="append", choices=PATHS, help="a path to run (default: all the device's)")
    options = parser.parse_args()
    rng = np.random.default_rng(1)
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    capability = props["major"] * 10 + props["minor"]
    available = device_paths(capability)
    paths = options.path or available
    if not set(paths) <= set(available):
        parser.error(f"--path: sm_{capability} runs {', '.join(available)}, got {', '.join(paths)}")
    facts = {"gpu": props["name"].decode(), "cc": f"{props['major']}.{props['minor']}", "cupy": cupy.__version__}
    print(json.dumps({**facts, "paths": {path: path_mma(path) for path in paths}}), flush=True)
    for d in (64, 128, 256):
        for heads in (1, 20, 64):
            case = index_case(rng, head_dim=d, heads=heads, counts=(5, 0, 11, 2), cache_lengths=(3, 9, 400, 0))
            accuracy(f"prefill d{d} h{heads}", case, paths, capability)
    case = index_case(rng, heads=32, counts=(2,) * 6, cache_lengths=(61, 64, 127, 5, 0, 1000))
    accuracy("decode next_n 2", case, paths, capability)
    case = index_case(rng, heads=128, block_size=64, counts=(3, 40), cache_lengths=(3000, 17))
    accuracy("h128 bs64", case, paths, capability)
    case = index_case(rng, heads=64, kpool=2, block_size=8, counts=(3, 1, 2), cache_lengths=(600, 5, 333))
    paging("pages of 8 and 64", case, paths)
    case = index_case(rng, heads=32, kpool=4, block_size=64, counts=(1,), cache_lengths=(131071,))
    selection("decode B1 ctx128K", case, paths, 512)
    case = index_case(rng, heads=32, kpool=4, block_size=64, counts=(2,) * 64, cache_lengths=(8190,) * 64)
    selection("decode B64 next_n2 ctx8K", case, paths, 512, always_select_tail=True)
    case = index_case(rng, heads=32, kpool=4, block_size=64, counts=(512,), cache_lengths=(16384,))
    selection("prefill 512 ctx16K", case, paths, 2048, compact=True)
    # 256 tokens: a block each, walking 4 chunks, after a seed pass over the last (kSeedChunks).
    case = index_case(rng, heads=32, kpool=4, block_size=64, counts=(1,) * 256, cache_lengths=(16383,) * 256)
    selection("decode B256 ctx16K", case, paths, 512)
    # V3.2's indexer (kpool 1, top 2048): 256 tokens of 16K pools, each block after a seed of two chunks.
    case = index_case(rng, heads=64, kpool=1, block_size=64, counts=(1,) * 256, cache_lengths=(16383,) * 256)
    selection("decode B256 kpool1 ctx16K top2048", case, paths, 2048)
    if not options.no_timing:
        timing("decode B64 next_n1 ctx8K h64", paths, 64, 64, 1, 8192)
        timing("decode B64 next_n2 ctx8K h64", paths, 64, 64, 2, 8192)
        timing("decode B8 next_n1 ctx128K h64", paths, 64, 8, 1, 131072)
        timing("prefill 1x2048 ctx8K h64", paths, 64, 1, 2048, 8192 - 2048)
        timing("prefill 1x2048 ctx8K h32", paths, 32, 1, 2048, 8192 - 2048)
    print(f"index check: {'all rows ok' if not failures else 'FAILED ' + '; '.join(failures)} on {', '.join(paths)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
