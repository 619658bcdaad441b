"""The implementations the benchmark times side by side (GPU only).

Each factory takes the shape and its input sets and returns either a runner
``run(i) -> output array`` for input set ``i``, or a string saying why the
implementation is unavailable here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..dtypes import element_dtype
from ..kernel.declarations import COMPRESS_BASELINE
from .inputs import InputSet
from .shapes import BenchShape
from .timing import replay_refusal

Runner = Callable[[int], Any]


def kpool_cupy_kernel(shape: BenchShape, sets: list[InputSet]) -> Runner | str:
    import kpool_cupy

    def run(i: int) -> Any:
        s = sets[i]
        return kpool_cupy.kpool_compress(
            s.k,
            s.gate,
            s.ape,
            s.input_row_offsets,
            s.cache_lengths,
            pool_row_offsets=s.pool_row_offsets,
            out=s.out,
            validate=False,
        )

    return run


def upstream_geometry_kernel(shape: BenchShape, sets: list[InputSet]) -> Runner | str:

    from ..backends.cupy import kernel_function

    if shape.head_dim > 1024:
        return "one thread per channel cannot exceed 1024 threads per block"
    import cupy

    name = COMPRESS_BASELINE.instance(T=element_dtype(shape.dtype), HEAD_DIM=shape.head_dim, KPOOL=shape.kpool)
    kernel = kernel_function(COMPRESS_BASELINE.source, name, cupy.cuda.Device().id)

    def run(i: int) -> Any:
        s = sets[i]
        offsets = {"input_row_offsets": s.offsets64, "cache_lengths": s.cache64, "pool_row_offsets": s.pool_row_offsets}
        values = {"k": s.k, "gate": s.gate, "ape": s.ape, **offsets, "batch": shape.requests, "pooled": s.out}
        kernel((shape.pools,), (shape.head_dim,), COMPRESS_BASELINE.arguments(values))
        return s.out

    return run


def composite_pool(xp: Any, k: Any, gate: Any, ape: Any, first_rows: Any, kpool: int) -> Any:
    """Gather, softmax, weighted sum in array operations; ``xp`` is numpy or cupy."""
    rows = first_rows[:, None] + xp.arange(kpool, dtype=xp.int64)  # [pools, kpool]
    logits = gate[rows].astype(xp.float32) + ape
    weights = xp.exp(logits - logits.max(axis=1, keepdims=True))
    pooled = (weights * k[rows].astype(xp.float32)).sum(axis=1) / weights.sum(axis=1)
    return pooled.astype(k.dtype)


def cupy_composite(shape: BenchShape, sets: list[InputSet]) -> Runner | str:
    """What a user might write with CuPy array operations instead of a kernel."""
    import cupy

    def run(i: int) -> Any:
        s = sets[i]
        return composite_pool(cupy, s.k, s.gate, s.ape, s.first_rows, shape.kpool)

    return run


def torch_unavailable() -> str | None:
    """Why torch cannot run on the GPU here, or None when it can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch has no CUDA device"
    return None


def _torch_views(sets: list[InputSet]) -> list[dict[str, Any]] | str:
    why = torch_unavailable()
    if why is not None:
        return why
    import torch

    views = []
    for s in sets:
        views.append(
            {
                "k": torch.from_dlpack(s.k),
                "gate": torch.from_dlpack(s.gate),
                "ape": torch.from_dlpack(s.ape),
                "first": torch.from_dlpack(s.first_rows),
                "out": torch.from_dlpack(s.out),
            }
        )
    return views


def _torch_pool(k: Any, gate: Any, ape: Any, first: Any, kpool: int) -> Any:
    import torch

    rows = first[:, None] + torch.arange(kpool, device=first.device)
    logits = gate[rows].float() + ape
    weights = torch.softmax(logits, dim=1)
    return (weights * k[rows].float()).sum(dim=1).to(k.dtype)


def torch_eager(shape: BenchShape, sets: list[InputSet]) -> Runner | str:
    views = _torch_views(sets)
    if isinstance(views, str):
        return views

    def run(i: int) -> Any:
        v = views[i]
        return _torch_pool(v["k"], v["gate"], v["ape"], v["first"], shape.kpool)

    return run


def torch_compiled(shape: BenchShape, sets: list[InputSet]) -> Runner | str:
    views = _torch_views(sets)
    if isinstance(views, str):
        return views
    import torch

    try:
        import torch._dynamo

        # Static shapes recompile per shape, and dynamo's cache limit (8) would
        # otherwise turn later shapes into eager calls without a word.
        torch._dynamo.reset()
        compiled = torch.compile(_torch_pool, dynamic=False)
        v = views[0]
        compiled(v["k"], v["gate"], v["ape"], v["first"], shape.kpool)  # compile now, not while timed
    except Exception as error:  # torch.compile fails in many environment-specific ways
        return f"torch.compile failed: {type(error).__name__}: {str(error).splitlines()[0][:120]}"

    def run(i: int) -> Any:
        v = views[i]
        return compiled(v["k"], v["gate"], v["ape"], v["first"], shape.kpool)

    return run


def triton_kernel(shape: BenchShape, sets: list[InputSet]) -> Runner | str:
    views = _torch_views(sets)
    if isinstance(views, str):
        return views
    try:
        from .triton_impl import triton_pool
    except ImportError as error:
        return f"triton is not importable ({error})"

    def run(i: int) -> Any:
        v = views[i]
        return triton_pool(v["k"], v["gate"], v["ape"], v["first"], v["out"], shape.kpool)

    return run


def torch_op_call(s: InputSet) -> Callable[[], None]:
    """The hot call through ``torch.ops.kpool.compress.out`` on tensors viewing ``s``'s arrays (DLPack, no copy).

    ``out=`` and ``pool_row_offsets=`` given, ``validate=False``: the call that
    neither syncs nor allocates, so ``torch.cuda.graph`` can capture it. It
    runs on torch's current stream and writes ``s.out``. Check
    ``torch_unavailable()`` first.
    """
    import torch

    from .. import torch as _registered  # noqa: F401  (importing kpool_cupy.torch defines torch.ops.kpool)
    from ..torch.tensors import from_cupy

    k, gate, ape, offsets, cache, pools, out = (
        from_cupy(a) for a in (s.k, s.gate, s.ape, s.input_row_offsets, s.cache_lengths, s.pool_row_offsets, s.out)
    )
    op = torch.ops.kpool.compress.out

    def call() -> None:
        op(k, gate, ape, offsets, cache, pool_row_offsets=pools, out=out, validate=False)

    return call


def torch_stream_of_cupy(streams: dict[tuple[int, int], Any]) -> Any:
    """CuPy's current stream as a torch stream (made once per stream and device, kept in ``streams``)."""
    import cupy
    import torch

    device, pointer = cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr
    stream = streams.get((device, pointer))
    if stream is None:
        # 0 is the legacy default stream, which is torch's default stream too.
        made = torch.cuda.default_stream(device) if pointer == 0 else torch.cuda.ExternalStream(pointer, device=device)
        stream = streams[(device, pointer)] = made
    return stream


def kpool_torch_op(shape: BenchShape, sets: list[InputSet]) -> Runner | str:
    """This package's kernel through ``torch.ops.kpool.compress.out``: the device time of a torch user's hot call.

    Each call runs with torch's current stream set to CuPy's, so a CuPy graph
    capture records its launch. That is checked, not assumed: when a replay
    of a captured call does not rewrite its output, the row is timed with
    events around Python instead, and says why.
    """
    why = torch_unavailable()
    if why is not None:
        return why
    import torch

    calls = [torch_op_call(s) for s in sets]
    streams: dict[tuple[int, int], Any] = {}

    def run(i: int) -> Any:
        with torch.cuda.stream(torch_stream_of_cupy(streams)):
            calls[i]()
        return sets[i].out

    refusal = replay_refusal(run, sets[0].out)
    if refusal is not None:
        run.capture_refusal = refusal  # type: ignore[attr-defined]
    return run


_TORCH_STREAM = "launches on torch's current stream, which a CuPy graph capture does not record"

# Implementations timed with events around their Python loop, and why; every
# other one is captured in a CUDA graph on CuPy's current stream (its calls go
# there: kernel launches, CuPy array operations), unless its runner carries a
# ``capture_refusal`` of its own (the torch op's, when a replay wrote nothing).
CAPTURE_REFUSALS: dict[str, str] = {
    "torch-eager": _TORCH_STREAM,
    "torch-compile": _TORCH_STREAM,
    "triton": _TORCH_STREAM,
}


def capture_refusal(name: str, runner: Runner) -> str | None:
    """Why ``runner`` is timed with events around Python rather than by graph replay, or None."""
    return getattr(runner, "capture_refusal", None) or CAPTURE_REFUSALS.get(name)


IMPLEMENTATIONS: dict[str, Callable[[BenchShape, list[InputSet]], Runner | str]] = {
    "kpool-cupy": kpool_cupy_kernel,
    "upstream-geometry": upstream_geometry_kernel,
    "cupy-composite": cupy_composite,
    "torch-eager": torch_eager,
    "torch-compile": torch_compiled,
    "triton": triton_kernel,
    "torch.ops.kpool": kpool_torch_op,
}
