"""Public functions bound from op specs: one factory for every op on every backend.

``bind(spec, binding)`` writes a real Python function whose signature is the
spec's parameters plus the binding's own options (``stream=`` on the GPU),
with the binding's docstring, so ``help()`` and ``inspect.signature`` show a
plain function and a wrong call fails the way a plain function does. The
function only gathers its arguments and hands them to ``binding.call``; a new
keyword on an op is a new entry in its spec, not an edit here.
"""

from __future__ import annotations

import inspect
import linecache
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .checks import check_bool, check_no_overlap
from .results import cache_target, remaining_results
from .spec import REQUIRED, Backend, Operand, OpSpec, Option

# (spec, operand arrays in parameter order, op options, binding options) -> result
CallFn = Callable[[OpSpec, tuple[Any, ...], dict[str, Any], dict[str, Any]], Any]


@dataclass(frozen=True)
class Binding:
    """How one backend takes calls: its name and module, how it annotates arrays, its options, its entry."""

    name: str  # "cupy", "emulate", "reference": the key of OpSpec.docs and OpSpec.extras
    module: str  # where the bound functions are public
    array: str  # annotation of an array parameter (an optional one adds ``| None``)
    result: str  # annotation of a returned array
    options: tuple[Option, ...]  # options every op takes on this backend, after the op's own
    call: CallFn
    names: tuple[tuple[str, Any], ...] = ()  # what the annotations name, so typing.get_type_hints resolves them


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


# A parameter that decides what the op returns: its name, and for each way it is
# given (annotation, default) what the op then returns.
Switch = tuple[str, tuple[tuple[str, Any, tuple[str, ...]], ...]]


def _switch(spec: OpSpec, binding: Binding) -> Switch | None:
    """The FP8 ops return less with a cache (``Operand.replaces``); expand returns counts with ``compact``."""
    target = cache_target(spec)
    if target is not None:
        forms = (("None", None, spec.results), (binding.array, inspect.Parameter.empty, remaining_results(spec)))
        return target.name, forms
    if spec.conditional_results:
        ((result, option),) = spec.conditional_results.items()
        with_it = (*spec.results, result)
        return option, (("Literal[False]", False, spec.results), ("Literal[True]", inspect.Parameter.empty, with_it))
    return None


def _result_annotation(spec: OpSpec, binding: Binding) -> str:
    switch = _switch(spec, binding)
    if switch is None:
        return _returns(spec.results, binding)
    return " | ".join(dict.fromkeys(_returns(results, binding) for _, _, results in switch[1]))


def typed_forms(spec: OpSpec, binding: Binding) -> tuple[inspect.Signature, ...]:
    """The bound function's forms for a stub's ``@overload``s: one for each way its switch is given, with what
    it then returns, and last the plain signature, which returns any of them; none for an op with one form."""
    switch = _switch(spec, binding)
    if switch is None:
        return ()
    name, forms = switch
    plain = signature(spec, binding)
    typed = []
    for annotation, default, results in forms:
        listed = [
            p.replace(annotation=annotation, default=default) if p.name == name else p
            for p in plain.parameters.values()
        ]
        typed.append(plain.replace(parameters=listed, return_annotation=_returns(results, binding)))
    return (*typed, plain)


def bind(spec: OpSpec, binding: Binding) -> Callable[..., Any]:
    """The public function of ``spec`` on ``binding``'s backend."""
    listed = parameters(spec, binding)
    names = [p.name for p in listed]
    if len(set(names)) != len(names) or not all(n.isidentifier() and not n.startswith("_") for n in names):
        raise ValueError(f"{spec.name}: parameter names must be distinct public identifiers, got {names}")
    positional = [p.name for p in listed if isinstance(p, Operand) and not p.optional]
    keyword = [p for p in listed if p.name not in positional]
    if positional != names[: len(positional)]:
        raise ValueError(f"{spec.name}: required operands must come first, got {names}")
    defaults = {p.name: (None if isinstance(p, Operand) else p.default) for p in keyword}
    spelled = [*positional, "*"] if keyword else positional
    spelled += [n if defaults[n] is REQUIRED else f"{n}=__defaults[{n!r}]" for n in defaults]
    arrays = ", ".join(p.name for p in spec.operands)
    own = ", ".join(f"{o.name!r}: {o.name}" for o in spec.options)
    theirs = ", ".join(f"{o.name!r}: {o.name}" for o in [*spec.extras.get(binding.name, ()), *binding.options])
    # Generated, like a dataclass's __init__: a plain function is the cheapest
    # call and the clearest signature.
    text = f"def {spec.name}({', '.join(spelled)}):\n    return __call(__spec, ({arrays},), {{{own}}}, {{{theirs}}})\n"
    filename = f"<kpool_cupy {binding.name} {spec.name}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)  # for inspect.getsource
    # The function's globals: its helpers, and the names its string annotations
    # use, so typing.get_type_hints resolves them.
    namespace: dict[str, Any] = {
        "__call": binding.call,
        "__spec": spec,
        "__defaults": defaults,
        "Any": Any,
        "Literal": Literal,
        "np": np,
    }
    namespace.update(binding.names)
    exec(compile(text, filename, "exec"), namespace)
    function = namespace[spec.name]
    function.__module__ = binding.module
    function.__qualname__ = spec.name
    doc = spec.docs.get(binding.name) or f"Same contract as :func:`kpool_cupy.{spec.name}`."
    if RAISES_HEADER in doc:
        function.__doc__ = doc.replace(RAISES_HEADER, RAISES_HEADER + RAISES, 1)
    else:
        function.__doc__ = doc.rstrip("\n") + "\n" + RAISES_HEADER + RAISES
    function.__signature__ = signature(spec, binding)
    function.__kpool_forms__ = typed_forms(spec, binding)  # type: ignore[attr-defined]  # the stubs' overloads
    function.__annotations__ = {
        **{p.name: p.annotation for p in function.__signature__.parameters.values()},
        "return": function.__signature__.return_annotation,
    }
    return function


def bind_into(namespace: dict[str, Any], specs: tuple[OpSpec, ...], binding: Binding) -> list[str]:
    """Bind every op of ``specs`` into a public module's ``namespace`` under its own name; returns the names,
    for the module's ``__all__``. Editors read the names and signatures from the module's ``.pyi`` stub,
    which ``kpool_cupy.tools.stubs`` writes from the same specs."""
    functions = {spec.name: bind(spec, binding) for spec in specs}
    namespace.update(functions)
    return list(functions)


def check_bool_options(spec: OpSpec, options: dict[str, Any]) -> None:
    """A ``bool`` option takes True or False (a NumPy bool too), nothing else: a string such as "False" or an
    array would otherwise read as true, or fail inside NumPy without naming the argument."""
    for option in spec.options:
        if option.annotation == "bool":
            check_bool(option.name, options[option.name])


def execute(spec: OpSpec, backend: Backend, arrays: tuple[Any, ...], options: dict[str, Any]) -> Any:
    """The call flow of every op on every backend: the options' types, the op's checks, the overlap rule for
    every operand the op writes, then the op's own run."""
    check_bool_options(spec, options)
    named = spec.named(arrays)
    call = spec.check(named, options)
    check_no_overlap(spec.operands, named)
    return spec.run(backend, call, named, **options)
