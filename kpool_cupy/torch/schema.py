"""Torch operator schemas written from the op specs: no per-op text, and no torch import.

Each op gets two overloads under the namespace ``kpool``:

- ``kpool::compress`` and friends (the default overload) take the function's
  parameters but the outputs it can be handed (``out``, ``closed``), and
  return what it allocates;
- ``kpool::compress.out`` takes those outputs as required keyword-only
  tensors, writes them and returns nothing (an op may not return an alias
  of its input under torch.compile).

A ring (``Operand(pair=True)``) is a tensor list: ``[tail]`` or
``[key_ring, gate_ring]``. Everything an op writes is annotated mutable,
each with its own alias letter.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from ..ops import OPS
from ..ops.spec import REQUIRED, Operand, OpSpec, Option

# The ops torch.ops.kpool has. The FP8 ops (issue 12) write a cache or a
# (values, scales) pair, whose .out overload and partner rule are not
# written yet; until they are, they are the package's functions only.
SPECS: tuple[OpSpec, ...] = tuple(spec for spec in OPS if not spec.name.endswith("_fp8"))

NAMESPACE = "kpool"

# The results an overload returns, where they differ from the spec's: expand
# returns counts only when compacting, and a schema has one return type, so
# its torch op returns both (counts empty unless compacting).
RESULTS = {"kpool_expand_topk": ("positions", "counts")}

# Option annotations as schema types; a new annotation must be added here on
# purpose (a KeyError at import names it).
_OPTION_TYPES = {"bool": "bool", "int": "int", "int | None": "int?", "str": "str"}
_OPTION_TYPE_BY_NAME = {"out_dtype": "ScalarType?"}  # a torch dtype; the wrappers take names too


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


def given_outputs(spec: OpSpec) -> tuple[Operand, ...]:
    """The outputs a caller may hand the op (optional operands it writes)."""
    return tuple(o for o in spec.operands if o.optional and o.written)


def output_keys(spec: OpSpec, results: tuple[str, ...]) -> tuple[str, ...]:
    """The ``OpSpec.outputs`` entry behind each result: the output operand it fills (``pooled`` is ``out``)
    where the op can be handed its outputs, else the result's own name."""
    outputs = given_outputs(spec)
    return tuple(o.name for o in outputs) if outputs else results


def _option(option: Option) -> str:
    kind = _OPTION_TYPE_BY_NAME.get(option.name) or _OPTION_TYPES[option.annotation]
    if option.default is REQUIRED:
        return f"{kind} {option.name}"
    default = "None" if option.default is None else repr(option.default)
    return f"{kind} {option.name}={default}"


def _overload(spec: OpSpec, name: str) -> Overload:
    outputs = given_outputs(spec)
    letters = iter(string.ascii_lowercase)
    positional, keyword, operands = [], [], []
    for parameter in spec.parameters:
        if isinstance(parameter, Option):
            keyword.append(_option(parameter))
            continue
        if parameter in outputs and not name:
            continue
        operands.append(parameter)
        mutable = f"({next(letters)}!)" if parameter.written else ""
        if parameter in outputs:  # the .out overload: required, keyword-only
            keyword.append(f"Tensor{mutable} {parameter.name}")
        elif parameter.optional:
            keyword.append(f"Tensor? {parameter.name}=None")
        else:
            positional.append(f"Tensor{mutable}{'[]' if parameter.pair else ''} {parameter.name}")
    results = () if name else RESULTS.get(spec.name, spec.results)
    returns = "Tensor" if len(results) == 1 else f"({', '.join(['Tensor'] * len(results))})"
    listed = ", ".join([*positional, *(["*", *keyword] if keyword else [])])
    return Overload(name, f"({listed}) -> {returns}", tuple(operands), spec.options, results)


def overloads(spec: OpSpec) -> tuple[Overload, ...]:
    """The default overload, and ``out`` where the op can be handed outputs."""
    return (_overload(spec, ""), _overload(spec, "out")) if given_outputs(spec) else (_overload(spec, ""),)


# pool_row_offsets is a plain function, not an op spec.
POOL_ROW_OFFSETS_SCHEMA = "(Tensor input_row_offsets, Tensor cache_lengths, int kpool) -> Tensor"
