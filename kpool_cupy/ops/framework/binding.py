"""Public functions bound to a backend: each op's def (``kpool_cupy/functions.py``) copied for one backend.

``bind(function, binding)`` makes a copy of the def (same code, so the same
source file and lines) whose ``call_backend`` hands the arguments to
``binding.call``; the copy gets the binding's module name, its docstring
and a ``__signature__`` with the binding's array types and keywords, so
``help()`` and ``inspect.signature`` show what this backend takes. Binding
checks the def against its spec first: the same parameters in the same
order with the same defaults, or a ValueError naming the difference.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import numpy as np

from .checks import check_aligned, check_bool, check_no_overlap
from .engine_forms import AFTER_CHECKS, BEFORE_CHECKS, given_back, read_forms
from .results import cache_target, remaining_results
from .spec import REQUIRED, Backend, Operand, OpSpec, Option

# (spec, operand arrays in parameter order, op options, binding options) -> result
CallFn = Callable[[OpSpec, tuple[Any, ...], dict[str, Any], dict[str, Any]], Any]


@dataclass(frozen=True)
class Binding:
    """How one backend takes calls: its name and module, how it annotates arrays, its options, its entry."""

    name: str  # "cupy", "emulate", "reference", "torch": the key of OpSpec.docs and OpSpec.extras
    module: str  # where the bound functions are public
    array: str  # annotation of an array parameter (an optional one adds ``| None``)
    result: str  # annotation of a returned array
    options: tuple[Option, ...]  # options every op takes on this backend, after the op's own
    call: CallFn
    names: tuple[tuple[str, Any], ...] = ()  # what the annotations name, so typing.get_type_hints resolves them


class BackendOptions(TypedDict, total=False):
    """The keywords a backend adds to an op, for a type checker reading a def's ``**backend_options``: ``stream``
    on the GPU (every op), ``accumulate`` on the reference (the ops that declare it in ``OpSpec.extras``). A bound
    copy takes its own backend's alone and refuses any other keyword as a plain function would."""

    stream: Any
    accumulate: str


def parameters(spec: OpSpec, binding: Binding) -> list[Operand | Option]:
    """The bound function's parameters, in order."""
    return [*spec.parameters, *spec.extras.get(binding.name, ()), *binding.options]


def signature(spec: OpSpec, binding: Binding) -> inspect.Signature:
    """The bound function's signature, annotations as strings like those of a module with postponed annotations."""
    listed = []
    for p in parameters(spec, binding):
        # A split ring is a pair of arrays.
        array = (
            f"{binding.array} | tuple[{binding.array}, {binding.array}]"
            if isinstance(p, Operand) and p.pair
            else binding.array
        )
        if isinstance(p, Operand) and not p.optional:
            listed.append(inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=array))
        elif isinstance(p, Operand):
            kind = inspect.Parameter.KEYWORD_ONLY
            listed.append(inspect.Parameter(p.name, kind, default=None, annotation=f"{array} | None"))
        else:
            default = inspect.Parameter.empty if p.default is REQUIRED else p.default
            listed.append(
                inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=p.annotation)
            )
    return inspect.Signature(listed, return_annotation=_result_annotation(spec, binding))


# Every op's errors, the same on every backend (docs/validation.md lists each check), in the docstring's
# Raises section (one it has already, such as the emulator's CompilerNotFoundError, takes them first).
RAISES_HEADER = "\nRaises\n------\n"
RAISES = """TypeError
    An argument of the wrong kind or dtype, or a bool option given anything
    but True or False; the message names the argument.
ValueError
    A bad shape, stride, length or value (offsets, positions, slots with
    ``validate=True``), or an output that shares memory with another
    argument; the message names the argument.
"""


def _returns(results: tuple[str, ...], binding: Binding) -> str:
    if not results:
        return "None"
    if len(results) == 1:
        return binding.result
    return f"tuple[{', '.join([binding.result] * len(results))}]"


def _result_forms(spec: OpSpec) -> tuple[tuple[str, ...], ...]:
    """What the op returns in each of its forms: the FP8 ops return less with a cache (``Operand.replaces``),
    expand returns counts with ``compact`` (``OpSpec.conditional_results``)."""
    if cache_target(spec) is not None:
        return spec.results, remaining_results(spec)
    if spec.conditional_results:
        return spec.results, (*spec.results, *spec.conditional_results)
    return (spec.results,)


def _result_annotation(spec: OpSpec, binding: Binding) -> str:
    return " | ".join(dict.fromkeys(_returns(results, binding) for results in _result_forms(spec)))


def definition_parameters(spec: OpSpec) -> list[tuple[str, Any, Any]]:
    """(name, kind, default) of each parameter a def of ``spec`` must list before ``**backend_options``."""
    listed = []
    for p in spec.parameters:
        if isinstance(p, Operand) and not p.optional:
            listed.append((p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty))
        elif isinstance(p, Operand):
            listed.append((p.name, inspect.Parameter.KEYWORD_ONLY, None))
        else:
            default = inspect.Parameter.empty if p.default is REQUIRED else p.default
            listed.append((p.name, inspect.Parameter.KEYWORD_ONLY, default))
    return listed


def check_definition(function: Callable[..., Any], spec: OpSpec) -> None:
    """A ValueError unless ``function``'s parameters are ``spec``'s (names, order, kinds, defaults), then
    ``**backend_options``."""
    listed = list(inspect.signature(function).parameters.values())
    if not listed or listed[-1].kind is not inspect.Parameter.VAR_KEYWORD or listed[-1].name != "backend_options":
        raise ValueError(f"Invalid def of {spec.name}: expected **backend_options last, got {listed[-1:]}")
    got = [(p.name, p.kind, p.default) for p in listed[:-1]]
    want = definition_parameters(spec)
    for i in range(max(len(got), len(want))):
        if i >= len(got) or i >= len(want) or got[i] != want[i]:
            raise ValueError(
                f"Invalid def of {spec.name}: expected its spec's parameters, parameter {i}: "
                f"want {_spelled(want[i : i + 1])}, got {_spelled(got[i : i + 1])}"
            )


def _spelled(parameter: list[tuple[str, Any, Any]]) -> str:
    """A parameter as a def spells it (``k``, ``*, out=None``), or "none"."""
    if not parameter:
        return "none"
    name, kind, default = parameter[0]
    star = "*, " if kind is inspect.Parameter.KEYWORD_ONLY else ""
    return f"{star}{name}" + ("" if default is inspect.Parameter.empty else f"={default!r}")


def _doc(function: Callable[..., Any], spec: OpSpec, binding: Binding) -> str:
    """The copy's docstring: the def's own on the GPU, else the spec's for the binding; with the errors every
    op raises in its Raises section (one it has already, such as the emulator's CompilerNotFoundError, takes
    them first)."""
    if binding.name == "cupy":
        doc = inspect.cleandoc(function.__doc__ or "") + "\n"
    else:
        doc = spec.docs.get(binding.name) or f"Same contract as :func:`kpool_cupy.{spec.name}`."
    if RAISES_HEADER in doc:
        return doc.replace(RAISES_HEADER, RAISES_HEADER + RAISES, 1)
    return doc.rstrip("\n") + "\n" + RAISES_HEADER + RAISES


def backend_caller(spec: OpSpec, binding: Binding) -> Callable[[tuple[Any, ...], dict[str, Any], dict[str, Any]], Any]:
    """What a bound copy calls: ``binding.call`` with the binding's keywords at their defaults unless given,
    and a TypeError, as from a plain function, for any keyword the binding does not take."""
    accepted = {o.name: o.default for o in [*spec.extras.get(binding.name, ()), *binding.options]}
    required = {name for name, default in accepted.items() if default is REQUIRED}
    call = binding.call

    def call_backend(arrays: tuple[Any, ...], options: dict[str, Any], given: dict[str, Any]) -> Any:
        # Membership tests, not set comparisons of dict views: torch 2.11's dynamo cannot trace `<=` on those.
        if all(name in accepted for name in given) and all(name in given for name in required):
            return call(spec, arrays, options, accepted | given)
        unknown = sorted(given.keys() - accepted.keys())
        if unknown:
            raise TypeError(f"{spec.name}() got an unexpected keyword argument '{unknown[0]}'")
        missing = sorted(required - given.keys())
        raise TypeError(f"{spec.name}() missing 1 required keyword-only argument: '{missing[0]}'")

    return call_backend


def bind(function: Callable[..., Any], binding: Binding, spec: OpSpec | None = None) -> Callable[..., Any]:
    """``function`` (an op's def) bound to ``binding``'s backend, as described by ``spec`` (default the spec the
    def was written for, ``functions.defines``)."""
    spec = spec if spec is not None else function.__kpool_spec__  # type: ignore[attr-defined]
    check_definition(function, spec)
    # The copy's globals: the def's module's, its call_backend replaced, and
    # what the binding's string annotations name, so typing.get_type_hints
    # resolves them. Without the module's __name__: a dict that is no
    # module's must not claim one, since torch.compile finds an inlined
    # function's globals by that name (it would read the unbound module's).
    namespace = {name: value for name, value in function.__globals__.items() if name != "__name__"}
    namespace.update({"Any": Any, "Literal": Literal, "np": np, **dict(binding.names)})
    namespace["call_backend"] = backend_caller(spec, binding)
    bound = types.FunctionType(function.__code__, namespace, spec.name, function.__defaults__, function.__closure__)
    bound.__kwdefaults__ = dict(function.__kwdefaults__ or {})
    bound.__module__ = binding.module
    bound.__qualname__ = spec.name
    bound.__doc__ = _doc(function, spec, binding)
    listed = signature(spec, binding)
    bound.__signature__ = listed  # type: ignore[attr-defined]
    bound.__annotations__ = {
        **{p.name: p.annotation for p in listed.parameters.values()},
        "return": listed.return_annotation,
    }
    return bound


def bind_into(namespace: dict[str, Any], functions: Iterable[Callable[..., Any]], binding: Binding) -> list[str]:
    """Bind each def of ``functions`` into a public module's ``namespace`` under its own name (in place of the
    def the module star-imported from ``kpool_cupy.functions`` for readers and type checkers); returns the
    names, for the module's ``__all__``."""
    bound = [bind(function, binding) for function in functions]
    namespace.update({function.__name__: function for function in bound})
    return [function.__name__ for function in bound]


def check_bool_options(spec: OpSpec, options: dict[str, Any]) -> None:
    """A ``bool`` option takes True or False (a NumPy bool too), nothing else: a string such as "False" or an
    array would otherwise read as true, or fail inside NumPy without naming the argument."""
    for option in spec.options:
        if option.annotation == "bool":
            check_bool(option.name, options[option.name])


def check_call(spec: OpSpec, arrays: tuple[Any, ...], options: dict[str, Any]) -> Checked:
    """The checks of every op on every backend, none of which reads array contents: the options' types, engine
    forms as the checks read them (``engine_forms``), the op's checks, alignment, the overlap rule for every
    operand the op writes. Returns the call record, the arrays by name as the checks read them, and the array
    behind each view made."""
    check_bool_options(spec, options)
    checked, behind = read_forms(spec.formed, spec.named(arrays), BEFORE_CHECKS)
    call = spec.check(checked, options)
    check_aligned(spec.operands, checked)
    check_no_overlap(spec.operands, checked)
    return call, checked, behind


Checked = tuple[Any, dict[str, Any], dict[int, Any]]
"""What ``check_call`` gives ``run_checked``: the call record, the arrays by name, the arrays behind views."""


def checked_before(spec: OpSpec, call: Any, arrays: tuple[Any, ...]) -> Checked:
    """What ``check_call`` gives for a call whose checks passed before with the same metadata: ``call`` (the
    record they gave then) with this call's arrays as the checks would read them."""
    return (call, *read_forms(spec.formed, spec.named(arrays), BEFORE_CHECKS))


def run_checked(spec: OpSpec, backend: Backend, checked: Checked, options: dict[str, Any]) -> Any:
    """The op's own run on the forms the kernels read, after ``check_call`` (or, on the GPU path, a signature
    whose checks passed before: ``backends.cupy_plans``)."""
    call, arrays, behind = checked
    named, viewed = read_forms(spec.formed, arrays, AFTER_CHECKS)
    return given_back(spec.run(backend, call, named, **options), behind | viewed)


def execute(spec: OpSpec, backend: Backend, arrays: tuple[Any, ...], options: dict[str, Any]) -> Any:
    """The call flow of every op on every backend: ``check_call``, then ``run_checked``."""
    return run_checked(spec, backend, check_call(spec, arrays, options), options)
