"""Host costs of each op of an indexer decode step: the ``host`` record's keys, per op (issue 36, item 3).

For each op of the step (tail update FP8, query quantize, the fused select, and the two-call select: the
scorer then the top-k), with every output and workspace given:

- ``call_us_validate_off``: the hot call (``validate=False``), served by its launch plan;
- ``call_us_validate_on``: the same call validated (it reads the small index arrays back);
- ``bare_launch_us``: the plan's kernel launched straight from CuPy, the floor for this launch, and
  ``overhead_over_bare_us`` the difference;
- ``call_us_torch_op`` (torch's op on tensors viewing the same memory) and ``torch_op_over_cupy_us``, beside
  ``empty_torch_op_us``: an empty ``torch.library`` op taking as many tensors, the floor of any torch op.

Host wall time only (``timing.host_call_microseconds``): never a device figure.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .impls import torch_stream_of_cupy, torch_unavailable
from .index import IndexShape, _input_sets
from .lifecycle import DecodeShape
from .plans import plan_launch
from .tail_fp8 import _step_sets
from .timing import HOST_CALLS, HOST_REPEATS, host_call_microseconds

STEP = IndexShape("decode", 64, 64, 1, 8192)  # the engines' decode: 64 heads, 64 requests of one token, 8K
POOL_TOPK = 512
# ``--quick``: a step the CPU emulator behind the CuPy double runs in seconds (the same calls, smaller).
QUICK_STEP, QUICK_POOL_TOPK = IndexShape("decode", 16, 4, 1, 512), 32
QUICK_CALLS = 2  # calls a sample there: every call runs its kernels on the emulator


@dataclass(frozen=True)
class OpCall:
    """One op call of the step: the op's spec, its arrays and options (``validate`` is the record's)."""

    spec: Any
    arrays: dict[str, Any]
    options: dict[str, Any]

    def run(self, validate: bool) -> Any:
        import kpool_cupy

        return getattr(kpool_cupy, self.spec.name)(**self.arrays, **self.options, validate=validate)


def step_calls(step: IndexShape = STEP, pool_topk: int = POOL_TOPK) -> dict[str, list[OpCall]]:
    """The step's ops, each as the calls it makes, on CuPy arrays of ``step``'s shape."""
    import cupy

    import kpool_cupy

    from ..dtypes import BFLOAT16
    from ..ops import HADAMARD_QUANT_FP8, INDEX_LOGITS_FP8, INDEX_SELECT_FP8, INDEX_TOPK, TAIL_UPDATE_FP8

    decode = DecodeShape(step.requests, step.next_n)
    sets, out = _step_sets(decode, 1)
    tail = OpCall(TAIL_UPDATE_FP8, {**sets[0], "out": out["values"][0], "out_scale": out["scales"][0],
                                    "closed": out["closed"][0]}, {})  # fmt: skip
    queries = cupy.random.default_rng(9).standard_normal((step.tokens * step.heads, 128), dtype=cupy.float32)
    quantize = OpCall(HADAMARD_QUANT_FP8, {
        "x": queries.astype(BFLOAT16),
        "out": cupy.empty(queries.shape, cupy.uint8),
        "out_scale": cupy.empty(queries.shape[0], cupy.float32),
    }, {})  # fmt: skip
    scoring, logits, _ = _input_sets(step, 1)
    width = pool_topk * 4 + 3
    options = {"kpool": 4, "pool_topk": pool_topk, "always_select_tail": True}
    select_space = cupy.zeros(kpool_cupy.index_select_workspace_bytes(step.tokens, pool_topk), cupy.uint8)
    fused = OpCall(INDEX_SELECT_FP8, {**scoring[0], "out": cupy.empty((step.tokens, width), cupy.int32),
                                      "workspace": select_space}, options)  # fmt: skip
    score = OpCall(INDEX_LOGITS_FP8, {**scoring[0], "out": logits[0]}, {"kpool": 4, "max_pools": step.pools})
    topk_bytes = kpool_cupy.index_topk_workspace_bytes(step.tokens, step.pools, pool_topk)
    topk_space = cupy.zeros(max(topk_bytes, 16), cupy.uint8)
    rows = {name: scoring[0][name] for name in ("input_row_offsets", "cache_lengths")}
    topk = OpCall(INDEX_TOPK, {"logits": logits[0], **rows, "out": cupy.empty((step.tokens, width), cupy.int32),
                               "workspace": topk_space}, options)  # fmt: skip
    return {
        "tail_update_fp8": [tail],
        "hadamard_quant_fp8": [quantize],
        "index_select_fp8": [fused],
        "index_logits_fp8 + index_topk": [score, topk],
    }


def _torch_call(calls: list[OpCall]) -> Callable[[], None]:
    """The same calls through ``torch.ops.kpool``'s ``.out`` overloads on tensors viewing the same memory."""
    import torch

    from .. import torch as _registered  # noqa: F401  (importing kpool_cupy.torch defines torch.ops.kpool)
    from ..torch.tensors import from_cupy

    bound = []
    for call in calls:
        op = getattr(torch.ops.kpool, call.spec.name.removeprefix("kpool_")).out
        positional = [o.name for o in call.spec.operands if not o.optional]
        args = [from_cupy(call.arrays[name]) for name in positional]
        keywords = {n: from_cupy(a) for n, a in call.arrays.items() if n not in positional}
        bound.append(functools.partial(op, *args, **keywords, **call.options, validate=False))

    def run() -> None:
        for each in bound:
            each()

    return run


def _empty_torch_op(tensors: int) -> Callable[..., Any]:
    """``kpool_bench::empty_<n>``: a torch.library op taking ``tensors`` tensors and doing nothing, on CUDA."""
    import torch

    name = f"kpool_bench::empty_{tensors}"
    if not hasattr(torch.ops, "kpool_bench") or not hasattr(torch.ops.kpool_bench, f"empty_{tensors}"):
        schema = "(" + ", ".join(f"Tensor t{i}" for i in range(tensors)) + ") -> ()"
        torch.library.define(name, schema, lib=_library())
        torch.library.register_kernel(name, "cuda", lambda *args: None, lib=_library())
    return getattr(torch.ops.kpool_bench, f"empty_{tensors}").default


@functools.cache
def _library() -> Any:
    import torch

    return torch.library.Library("kpool_bench", "FRAGMENT")


def op_host_cost(
    op: str, calls: list[OpCall], shape: str, repeats: int = HOST_REPEATS, per_sample: int = HOST_CALLS
) -> dict[str, Any]:
    """The host record of one op of the step (its calls one after another), ``per_sample`` calls a sample."""
    record: dict[str, Any] = {"op": op, "shape": shape, "calls_per_sample": per_sample}

    def microseconds(call: Callable[[], Any]) -> float:
        return host_call_microseconds(call, calls=per_sample, repeats=repeats)

    for call in calls:
        call.run(False)  # the signature's first call runs the full path and makes the plan
    record["call_us_validate_off"] = microseconds(lambda: [c.run(False) for c in calls])
    record["call_us_validate_on"] = microseconds(lambda: [c.run(True) for c in calls])
    bare = [plan_launch(c.spec, c.arrays, {**c.options, "validate": False}) for c in calls]
    reasons = [b for b in bare if isinstance(b, str)]
    if reasons:
        record["bare_launch"] = reasons[0]
    else:
        record["bare_launch_us"] = microseconds(lambda: [b() for b in bare])
        record["overhead_over_bare_us"] = record["call_us_validate_off"] - record["bare_launch_us"]
    why = torch_unavailable()
    if why is not None:
        record["torch_op"] = why
        return record
    import torch

    from ..torch.tensors import from_cupy

    run = _torch_call(calls)
    tensors = max(len(c.arrays) for c in calls)
    empty = _empty_torch_op(tensors)
    some = [from_cupy(a) for a in list(calls[0].arrays.values())[:1]] * tensors
    with torch.cuda.stream(torch_stream_of_cupy({})):
        record["call_us_torch_op"] = microseconds(run)
        record["empty_torch_op_us"] = microseconds(lambda: empty(*some))
        record["empty_torch_op_tensors"] = tensors
    record["torch_op_over_cupy_us"] = record["call_us_torch_op"] - record["call_us_validate_off"]
    return record


def decode_step_host_costs(repeats: int = HOST_REPEATS, quick: bool = False) -> list[dict[str, Any]]:
    """One record per op of the step (``quick``: the small step)."""
    step, pool_topk = (QUICK_STEP, QUICK_POOL_TOPK) if quick else (STEP, POOL_TOPK)
    shape = f"{step.name} top{pool_topk}"
    per_sample = QUICK_CALLS if quick else HOST_CALLS
    return [op_host_cost(op, calls, shape, repeats, per_sample) for op, calls in step_calls(step, pool_topk).items()]
