"""Defines every op under ``torch.ops.kpool`` from the op specs, with its CPU, CUDA and fake kernels.

An op whose spec declares a gradient (``OpSpec.gradient``) gets it on its
default overload (an autograd kernel, the backward a call of the declared
backward op); every other overload, and every other op,
refuses a gradient when one is asked for (``_NoGradient``).

Registration happens once per process (``register``); the library object
that holds it lives here for as long as the process does.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from ..ops.framework.spec import OpSpec
from ..pool_offsets import check_pool_row_offsets_args, pool_row_offsets
from .kernels import check_devices, cpu_kernel, cuda_kernel, fake_kernel, gather_arguments
from .schema import NAMESPACE, POOL_ROW_OFFSETS_SCHEMA, SPECS, Overload, op_name, overloads
from .tensors import from_cupy, from_numpy, metadata, to_cupy, to_numpy

_library: torch.library.Library | None = None
_lock = threading.Lock()


def qualified(spec_or_name: OpSpec | str, overload: str = "") -> str:
    """``kpool::compress`` or ``kpool::compress.out``."""
    name = spec_or_name if isinstance(spec_or_name, str) else op_name(spec_or_name)
    return f"{NAMESPACE}::{name}" + (f".{overload}" if overload else "")


class _NoGradient(torch.autograd.Function):
    """Runs an op below autograd, its inputs that require grad (``anchors``) linked to its float results by a
    backward that calls ``kpool::no_gradient``, which raises when a gradient other than zero reaches it.

    The raise is an op, not Python in ``backward``: torch.compile traces the
    backward of a model whose ape is a Parameter (without running it), and
    only running a backward is an error. The op runs inside ``forward`` so that
    its results are its own tensors, which the caller may change in place (a
    result passed through would be a view of the Function's input).
    """

    @staticmethod
    def forward(
        name: str, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], grad_mode: bool, *anchors: torch.Tensor
    ) -> Any:
        # In the call's grad mode (a Function's forward runs without): the kernels refuse to write in place a
        # tensor autograd tracks only in grad mode. Below autograd, nothing here is recorded.
        with torch.set_grad_enabled(grad_mode), torch._C._AutoDispatchBelowAutograd():
            return op(*args, **kwargs)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.name = inputs[0]
        ctx.save_for_backward(*inputs[5:])
        results = output if isinstance(output, tuple) else (output,)
        # Integers, and float8 values (quantized bytes, typed as engines take them), carry no gradient.
        ctx.mark_non_differentiable(*(r for r in results if not r.is_floating_point() or r.element_size() == 1))

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        gradients = torch.ops.kpool.no_gradient(_gradient_size(grads), list(ctx.saved_tensors), ctx.name)
        needs = ctx.needs_input_grad[5:]
        return (None,) * 5 + tuple(g if need else None for g, need in zip(gradients, needs, strict=True))

    @staticmethod
    def jvp(ctx: Any, *tangents: Any) -> Any:
        raise RuntimeError(f"{ctx.name} is not differentiable: forward-mode AD (jvp, jacfwd, make_dual) gets no "
                           "derivative through it")  # fmt: skip


NO_GRADIENT_SCHEMA = "(Tensor grad, Tensor[] inputs, str op) -> Tensor[]"


def _gradient_size(grads: tuple[Any, ...]) -> torch.Tensor:
    """The float gradients reaching a non-differentiable op's results as one number: the sum of their absolute
    values (0 only where every one is all zeros; NaN or infinite where one holds such a value)."""
    floats = [g.detach().float().abs().sum() for g in grads if isinstance(g, torch.Tensor) and g.is_floating_point()]
    return torch.stack(floats).sum() if floats else torch.zeros(())


def _no_gradient(grad: torch.Tensor, inputs: list[torch.Tensor], op: str) -> list[torch.Tensor]:
    """A gradient of zeros has one answer whatever the op's derivative: zeros (what a compiled backward sends
    for a result the loss does not use, where eager runs no backward at all). Any other raises, naming the op."""
    if not bool(grad != 0):  # a host read of one number, in a backward that could only raise otherwise
        return [torch.zeros_like(t) for t in inputs]
    raise RuntimeError(f"{op} is not differentiable: its inputs get no gradient (call it under no_grad)")


def _no_gradient_fake(grad: torch.Tensor, inputs: list[torch.Tensor], op: str) -> list[torch.Tensor]:
    return [torch.empty_like(t) for t in inputs]


def carries_tangent(tensors: list[torch.Tensor]) -> bool:
    """Whether a forward-mode tangent rides on one of ``tensors`` (``forward_ad.make_dual``; ``torch.func.jvp``
    and ``jacfwd`` make them too): the op would drop it silently, so the call goes through a Function whose
    ``jvp`` refuses it. Outside a dual level (a module global, cheap for every call) none can."""
    if torch.autograd.forward_ad._current_level < 0:
        return False
    unpack = torch.autograd.forward_ad.unpack_dual
    return any(t.is_floating_point() and unpack(t).tangent is not None for t in tensors)


def check_no_transform(name: str) -> None:
    """A call whose derivative a torch.func transform (grad, vjp, jacrev, jvp, jacfwd) would take: a
    RuntimeError naming the op. Its Function runs inside the op's autograd kernel, where the transforms cannot
    reach it (torch raises its own "could not find kernel for HigherOrderOperator custom_function_call")."""
    if torch._C._are_functorch_transforms_active():
        raise RuntimeError(
            f"{name} under a torch.func transform: its derivative is torch.autograd's only "
            "(backward, torch.autograd.grad); vmap of the op itself runs"
        )


def _autograd_kernel(name: str, op: Any) -> Any:
    """Runs the op below autograd; when an input requires grad, its float results carry a backward that
    raises (an op registered without one would hand back a silent None gradient), and a forward-mode tangent on
    an input is refused (it would be dropped: a silent zero derivative)."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        inputs = [t for v in (*args, *kwargs.values()) for t in (v if isinstance(v, (list, tuple)) else [v])]
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        grad_mode = torch.is_grad_enabled()
        if carries_tangent(tensors):  # the Function's jvp refuses the tangent
            check_no_transform(name)
            duals = (t for t in tensors if t.is_floating_point())
            return _NoGradient.apply(name, op, args, kwargs, grad_mode, *duals)
        anchors = [t for t in tensors if t.requires_grad]
        if anchors and grad_mode:
            check_no_transform(name)
            return _NoGradient.apply(name, op, args, kwargs, grad_mode, *anchors)
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args, **kwargs)

    return kernel


class _Differentiable(torch.autograd.Function):
    """Runs an op below autograd, with the backward its spec declares (``_Gradient``).

    Not ``torch.library.register_autograd``: that refuses a schema with
    keyword-only tensors (``pool_row_offsets``), which the schemas keep to
    match the functions' signatures. This is what it would register: an
    autograd kernel around a Function whose inputs are the positional
    tensors.
    """

    @staticmethod
    def forward(rule: _Gradient, keyword: dict[str, Any], *inputs: Any) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            return rule.forward(*inputs, **keyword)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        rule, keyword, *tensors = inputs
        rule.setup_context(ctx, tuple(tensors), keyword)

    @staticmethod
    def jvp(ctx: Any, *tangents: Any) -> Any:
        raise RuntimeError(f"{ctx.rule.name} has no forward-mode derivative (jvp, jacfwd, make_dual): use reverse "
                           "mode (backward, torch.autograd.grad)")  # fmt: skip

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        return (None, None, *ctx.rule.backward(ctx, ctx.needs_input_grad[2:], grads))


class _Gradient:
    """An op's declared gradient (``OpSpec.gradient``) on one overload: the backward op takes the forward's
    inputs by name (saved, never its results) and each result's gradient as it comes (the dtype the forward
    returned, any strides: the backward op takes every stride, 0 too)."""

    def __init__(self, spec: OpSpec, overload: Overload) -> None:
        gradient = spec.gradient
        if gradient is None:
            raise ValueError(f"Invalid spec: expected one with a gradient, got {spec.name}")
        self.gradient, self.name = gradient, qualified(spec, overload.name)
        backward_spec = next((s for s in SPECS if s.name == gradient.op), None)
        if backward_spec is None:
            raise ValueError(f"Invalid gradient of {spec.name}: expected an op of OPS, got {gradient.op!r}")
        self.backward_spec = backward_spec
        self.backward_overload = overloads(backward_spec)[0]  # the default: it allocates the gradients
        self.overload = overload
        self.positional = [o.name for o in overload.operands if not o.optional]
        # What the backward takes of the forward's inputs (by name), and of its options (validate); its scratch
        # is its own (made for each backward call).
        self.saved = [
            o.name for o in self.backward_overload.operands if o.name not in gradient.outputs and not o.scratch
        ]
        missing = [n for n in (*self.saved, *gradient.inputs) if n not in {o.name for o in overload.operands}]
        if missing:
            raise ValueError(f"Invalid gradient of {spec.name}: expected inputs of {self.name}, got {missing}")
        self.options = [o.name for o in self.backward_overload.options if o.name in {p.name for p in overload.options}]
        self.forward = getattr(getattr(getattr(torch.ops, NAMESPACE), op_name(spec)), overload.name or "default")

    def kernel(self, *args: Any, **kwargs: Any) -> Any:
        """The overload's autograd kernel: the Function where an input requires grad in grad mode."""
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        tracked = torch.is_grad_enabled() and any(a.requires_grad for a in tensors)
        if tracked or carries_tangent(tensors):  # a tangent: the Function's jvp refuses it
            check_no_transform(self.name)
            return _Differentiable.apply(self, kwargs, *args)
        with torch._C._AutoDispatchBelowAutograd():
            return self.forward(*args, **kwargs)

    def setup_context(self, ctx: Any, inputs: tuple[Any, ...], keyword: dict[str, Any]) -> None:
        given = gather_arguments(self.overload, inputs, keyword)  # an optional operand left out is absent: None
        ctx.rule = self
        ctx.save_for_backward(*(given.get(n) for n in self.saved))
        ctx.options = {n: given[n] for n in self.options}  # validate: the backward checks what the forward did
        ctx.refused = [f"{n}={given[n]!r}" for n in self.gradient.refused if given[n]]

    def backward(self, ctx: Any, needs: tuple[bool, ...], grads: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
        """One gradient (or None) per positional input."""
        tensors = dict(zip(self.saved, ctx.saved_tensors, strict=True))
        if ctx.refused:  # an op, so that a compiled model traces this backward; running it raises
            inputs = [tensors[n] for n in self.gradient.inputs]
            refused = f"{self.name} with {', '.join(ctx.refused)}"
            got = torch.ops.kpool.no_gradient(_gradient_size(grads), inputs, refused)
        else:
            given = tensors | dict(zip(self.gradient.outputs, grads, strict=True))
            operands = self.backward_overload.operands
            args = [given[o.name] for o in operands if not o.optional]
            kwargs = {o.name: given[o.name] for o in operands if o.optional and given.get(o.name) is not None}
            op = getattr(getattr(torch.ops, NAMESPACE), op_name(self.backward_spec)).default
            got = op(*args, **kwargs, **ctx.options)
        by_input = dict(zip(self.gradient.inputs, got, strict=True))
        return tuple(by_input.get(n) if need else None for n, need in zip(self.positional, needs, strict=True))


def _define(library: torch.library.Library, spec: OpSpec, overload: Overload) -> None:
    name = qualified(spec, overload.name)
    torch.library.define(name, overload.schema, lib=library)
    torch.library.register_kernel(name, "cpu", cpu_kernel(spec, overload), lib=library)
    torch.library.register_kernel(name, "cuda", cuda_kernel(spec, overload), lib=library)
    torch.library.register_fake(name, fake_kernel(spec, overload), lib=library)
    if spec.gradient is not None and not overload.name:
        # Declared differentiable (the default overload only: .out writes in
        # place, and the cache overloads write a cache).
        rule = _Gradient(spec, overload)
        library.impl(op_name(spec), rule.kernel, "Autograd")
        return
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
        offsets, lengths = to_cupy("input_row_offsets", input_row_offsets), to_cupy("cache_lengths", cache_lengths)
        return from_cupy(pool_row_offsets(offsets, lengths, kpool))


def _pool_row_offsets_fake(input_row_offsets: torch.Tensor, cache_lengths: torch.Tensor, kpool: int) -> torch.Tensor:
    # The real kernels' checks on what a fake tensor has (a meta tensor beside a CPU one lands here too: it
    # made an uninitialized CPU result).
    given = {"input_row_offsets": input_row_offsets, "cache_lengths": cache_lengths}
    device = check_devices(given, tuple(given))
    check_pool_row_offsets_args(*(metadata(name, tensor) for name, tensor in given.items()), kpool)
    return torch.empty(input_row_offsets.shape, dtype=torch.int64, device=device)


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
