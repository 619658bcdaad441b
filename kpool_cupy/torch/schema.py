"""Torch operator schemas written from the op specs: no per-op text, and no torch import.

Each op gets two overloads under the namespace ``kpool``:

- ``kpool::compress`` and friends (the default overload) take the function's
  parameters but the outputs it can be handed (``out``, ``closed``), and
  return what it allocates;
- ``kpool::compress.out`` takes those outputs as required keyword-only
  tensors (optional where the op returns one only with an option set:
  expand's ``counts``), writes them and returns nothing (an op may not
  return an alias of its input under torch.compile);
- an op that can write a cache in place instead (``Operand.replaces``: the
  FP8 ops) also has ``.cache``, which takes the cache as a required mutable
  tensor and returns the results the cache does not replace (ring close's
  and tail update's ``closed``), and ``.cache_out`` where those can be
  given too.

A ring (``Operand(pair=True)``) is a tensor list: ``[tail]`` or
``[key_ring, gate_ring]``. Everything an op writes is annotated mutable,
each with its own alias letter.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from ..ops import OPS
from ..ops.framework.results import all_results, cache_target, conditional_outputs, given_outputs, remaining_results
from ..ops.framework.spec import REQUIRED, Operand, OpSpec, Option

# The ops torch.ops.kpool has: every op.
SPECS: tuple[OpSpec, ...] = OPS

NAMESPACE = "kpool"

# Option annotations (or kinds, where the annotation does not say) as schema
# types; a new one must be added here on purpose (a KeyError at import names
# it). A dtype option takes a torch dtype; the wrappers take names too.
_OPTION_TYPES = {
    "bool": "bool", "int": "int", "int | None": "int?", "str": "str", "dtype": "ScalarType?", "size": "SymInt?",
}  # fmt: skip


@dataclass(frozen=True)
class Overload:
    """One overload: its name (``""`` for the default), the schema after the op name, and its parameters."""

    name: str
    schema: str
    operands: tuple[Operand, ...]  # the tensors it takes, in order
    options: tuple[Option, ...]
    results: tuple[str, ...]


def op_name(spec: OpSpec) -> str:
    """``kpool_compress`` -> ``compress``: the name under ``torch.ops.kpool``."""
    return spec.name.removeprefix("kpool_")


def _option(option: Option) -> str:
    kind = _OPTION_TYPES[option.kind or option.annotation]
    if option.default is REQUIRED:
        return f"{kind} {option.name}"
    default = "None" if option.default is None else repr(option.default)
    return f"{kind} {option.name}={default}"


def _overload(spec: OpSpec, name: str) -> Overload:
    """``""``: outputs allocated; ``out``: every output given; ``cache``: the cache written, the remaining
    results allocated; ``cache_out``: the cache and the remaining outputs given."""
    target = cache_target(spec)
    replaced = target.replaces if target is not None else ()
    with_cache = name in ("cache", "cache_out")
    given = {o.name for o in given_outputs(spec)} if name == "out" else set()
    if with_cache:
        given = {o.name for o in given_outputs(spec) if o.name not in replaced} if name == "cache_out" else set()
        given.add(target.name)
    left_out = {o.name for o in given_outputs(spec)} - given
    if target is not None and not with_cache:
        left_out.add(target.name)
    left_out |= {o.name for o in spec.operands if o.with_operand in left_out}  # slots without the cache
    given -= set(conditional_outputs(spec))  # given only with its option (expand's counts): optional there
    letters = iter(string.ascii_lowercase)
    positional, keyword, operands = [], [], []
    for parameter in spec.parameters:
        if isinstance(parameter, Option):
            keyword.append(_option(parameter))
            continue
        if parameter.name in left_out:
            continue
        operands.append(parameter)
        mutable = f"({next(letters)}!)" if parameter.written else ""
        if parameter.name in given or parameter.required_with:  # required, keyword-only
            keyword.append(f"Tensor{mutable} {parameter.name}")
        elif parameter.optional:
            keyword.append(f"Tensor{mutable}? {parameter.name}=None")  # mutable: scratch the op writes
        else:
            positional.append(f"Tensor{mutable}{'[]' if parameter.pair else ''} {parameter.name}")
    if name in ("out", "cache_out"):
        results: tuple[str, ...] = ()
    elif name == "cache":
        results = remaining_results(spec)
    else:
        results = all_results(spec)
    returns = "Tensor" if len(results) == 1 else f"({', '.join(['Tensor'] * len(results))})"
    listed = ", ".join([*positional, *(["*", *keyword] if keyword else [])])
    return Overload(name, f"({listed}) -> {returns}", tuple(operands), spec.options, results)


def overloads(spec: OpSpec) -> tuple[Overload, ...]:
    """The default overload, ``out`` where the op can be handed outputs, ``cache`` (and ``cache_out`` where
    results remain) where it can write a cache instead."""
    names = [""] + (["out"] if given_outputs(spec) else [])
    if cache_target(spec) is not None:
        names += ["cache"] + (["cache_out"] if remaining_results(spec) else [])
    return tuple(_overload(spec, name) for name in names)


# pool_row_offsets is a plain function, not an op spec.
POOL_ROW_OFFSETS_SCHEMA = "(Tensor input_row_offsets, Tensor cache_lengths, int kpool) -> Tensor"
