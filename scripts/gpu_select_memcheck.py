"""The select bench's prefill record's calls, once each, for compute-sanitizer (issue 34, item 5).

    compute-sanitizer --tool memcheck python scripts/gpu_select_memcheck.py [--quick]

The first GPU run of ``kpool-cupy bench --select`` ended at ``select prefill-1x2048 128K h32 top512`` in
``CUDA_ERROR_ASSERT: device-side assert triggered``, its traceback lost (docs/benchmarks.md). This runs that
record's three implementations on its first input set, as the bench builds it, one call each with a
synchronize after every call: the fused select, the scorer then kpool_index_topk, and the torch composite on
the same logits (skipped without torch). It prints each call's name before and ``done`` after, so a log cut
by an assert says which call raised it, then whether the three agree. Exit 0 when every call ran and the
fused and two-step results are the same bits. ``--quick``: a small shape, for the CuPy double."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cupy

import kpool_cupy
from kpool_cupy.bench import select
from kpool_cupy.bench.index import KPOOL, IndexShape, _input_sets

RECORD = IndexShape("prefill", 32, 1, 2048, 131072)  # select prefill-1x2048 128K h32 top512
QUICK = IndexShape("prefill", 16, 1, 16, 4096)


def main() -> int:
    shape = QUICK if "--quick" in sys.argv[1:] else RECORD
    sets, logits, _ = _input_sets(shape, 1)
    table = select.kv_table(shape.requests, shape.context)
    paged = {"block_table": table, "block_size": select.KV_BLOCK_SIZE}
    workspace = cupy.zeros(kpool_cupy.index_select_workspace_bytes(shape.tokens, select.POOL_TOPK), cupy.uint8)
    s = sets[0]
    calls = {
        "fused": lambda: kpool_cupy.kpool_index_select_fp8(
            **s, kpool=KPOOL, pool_topk=select.POOL_TOPK, workspace=workspace, validate=False, **paged
        ),
        "scorer": lambda: kpool_cupy.kpool_index_logits_fp8(
            **s, kpool=KPOOL, max_pools=shape.pools, out=logits[0], validate=False
        ),
        "topk": lambda: kpool_cupy.kpool_index_topk(
            logits[0],
            s["input_row_offsets"],
            s["cache_lengths"],
            kpool=KPOOL,
            pool_topk=select.POOL_TOPK,
            validate=False,
            **paged,
        ),
    }
    results = {}
    for name, call in calls.items():
        print(f"call {name}", flush=True)
        results[name] = call()
        cupy.cuda.Device().synchronize()
        print(f"call {name} done", flush=True)
    composite, reason = select._torch_composite(shape, logits, table, select.POOL_TOPK)
    if composite is None:
        print(f"torch composite skipped: {reason}")
    else:
        print("call torch-composite", flush=True)
        got = cupy.asarray(composite(0))
        cupy.cuda.Device().synchronize()
        print("call torch-composite done", flush=True)
        rows = int(cupy.all(got == results["fused"][:, : got.shape[1]], axis=1).sum())
        print(f"torch composite rows equal to fused: {rows} of {shape.tokens}")
    same = bool(cupy.array_equal(results["fused"], results["topk"]))
    print(f"fused == scorer then topk: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
