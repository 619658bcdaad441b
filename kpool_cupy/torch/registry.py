"""Defines every op under ``torch.ops.kpool`` from the op specs, with its CPU, CUDA and fake kernels.

Registration happens once per process (``register``); the library object
that holds it lives here for as long as the process does.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from ..ops.spec import OpSpec
from ..pool_offsets import pool_row_offsets
from .kernels import cpu_kernel, cuda_kernel, fake_kernel
from .schema import NAMESPACE, POOL_ROW_OFFSETS_SCHEMA, SPECS, Overload, op_name, overloads
from .tensors import from_cupy, from_numpy, to_cupy, to_numpy

_library: torch.library.Library | None = None
_lock = threading.Lock()


def qualified(spec_or_name: OpSpec | str, overload: str = "") -> str:
    """``kpool::compress`` or ``kpool::compress.out``."""
    name = spec_or_name if isinstance(spec_or_name, str) else op_name(spec_or_name)
    return f"{NAMESPACE}::{name}" + (f".{overload}" if overload else "")


class _NoGradient(torch.autograd.Function):
    """Passes an op's result through; its backward calls ``kpool::no_gradient``, which raises when it runs.

    The raise is an op, not Python in ``backward``: torch.compile traces the
    backward of a model whose ape is a Parameter (without running it), and
    only running a backward is an error.
    """

    @staticmethod
    def forward(ctx: Any, name: str, result: torch.Tensor, *anchors: torch.Tensor) -> torch.Tensor:
        ctx.name = name
        ctx.save_for_backward(*anchors)
        return result.view_as(result)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        gradients = torch.ops.kpool.no_gradient(grads[0], list(ctx.saved_tensors), ctx.name)
        return (None, None, *gradients)


NO_GRADIENT_SCHEMA = "(Tensor grad, Tensor[] inputs, str op) -> Tensor[]"


def _no_gradient(grad: torch.Tensor, inputs: list[torch.Tensor], op: str) -> list[torch.Tensor]:
    raise RuntimeError(f"{op} is not differentiable: its inputs get no gradient (call it under no_grad)")


def _no_gradient_fake(grad: torch.Tensor, inputs: list[torch.Tensor], op: str) -> list[torch.Tensor]:
    return [torch.empty_like(t) for t in inputs]


def _autograd_kernel(name: str, op: Any) -> Any:
    """Runs the op below autograd; when an input requires grad, its float results carry a backward that
    raises (an op registered without one would hand back a silent None gradient)."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            result = op(*args, **kwargs)
        inputs = [t for v in (*args, *kwargs.values()) for t in (v if isinstance(v, (list, tuple)) else [v])]
        anchors = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
        if not anchors or not torch.is_grad_enabled():
            return result
        results = result if isinstance(result, tuple) else (result,)
        wrapped = tuple(_NoGradient.apply(name, r, *anchors) if r.is_floating_point() else r for r in results)
        return wrapped if isinstance(result, tuple) else wrapped[0]

    return kernel


def _define(library: torch.library.Library, spec: OpSpec, overload: Overload) -> None:
    name = qualified(spec, overload.name)
    torch.library.define(name, overload.schema, lib=library)
    torch.library.register_kernel(name, "cpu", cpu_kernel(spec, overload), lib=library)
    torch.library.register_kernel(name, "cuda", cuda_kernel(spec, overload), lib=library)
    torch.library.register_fake(name, fake_kernel(spec, overload), lib=library)
    # A float result from an input that requires grad: asking for its
    # gradient is an error that names the op, not a silent None. (The .out
    # overloads return nothing.)
    if overload.results:
        op = getattr(getattr(torch.ops, NAMESPACE), op_name(spec))
        function = _autograd_kernel(name, getattr(op, overload.name or "default"))
        library.impl(op_name(spec) + (f".{overload.name}" if overload.name else ""), function, "Autograd")


def _pool_row_offsets_cpu(input_row_offsets: torch.Tensor, cache_lengths: torch.Tensor, kpool: int) -> torch.Tensor:
    offsets = pool_row_offsets(
        to_numpy("input_row_offsets", input_row_offsets), to_numpy("cache_lengths", cache_lengths), kpool
    )
    return from_numpy(np.asarray(offsets))


def _pool_row_offsets_cuda(input_row_offsets: torch.Tensor, cache_lengths: torch.Tensor, kpool: int) -> torch.Tensor:
    from .kernels import _torch_stream

    with _torch_stream(input_row_offsets.device):
        return from_cupy(pool_row_offsets(to_cupy(input_row_offsets), to_cupy(cache_lengths), kpool))


def _pool_row_offsets_fake(input_row_offsets: torch.Tensor, cache_lengths: torch.Tensor, kpool: int) -> torch.Tensor:
    return torch.empty(input_row_offsets.shape, dtype=torch.int64, device=input_row_offsets.device)


def register() -> None:
    """Define ``torch.ops.kpool.*`` (idempotent)."""
    global _library
    with _lock:
        if _library is not None:
            return
        library = torch.library.Library(NAMESPACE, "FRAGMENT")
        for spec in SPECS:
            for overload in overloads(spec):
                _define(library, spec, overload)
        name = qualified("no_gradient")
        torch.library.define(name, NO_GRADIENT_SCHEMA, lib=library)
        torch.library.register_kernel(name, ("cpu", "cuda"), _no_gradient, lib=library)
        torch.library.register_fake(name, _no_gradient_fake, lib=library)
        name = qualified("pool_row_offsets")
        torch.library.define(name, POOL_ROW_OFFSETS_SCHEMA, lib=library)
        torch.library.register_kernel(name, "cpu", _pool_row_offsets_cpu, lib=library)
        torch.library.register_kernel(name, "cuda", _pool_row_offsets_cuda, lib=library)
        torch.library.register_fake(name, _pool_row_offsets_fake, lib=library)
        _library = library
