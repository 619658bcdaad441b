"""The package's functions for torch tensors: the same signatures and errors, each a call of a torch op.

``kpool_cupy.torch.kpool_compress(k, gate, ape, ...)`` takes what
``kpool_cupy.kpool_compress`` takes, as tensors: a ring as one tensor or a
pair, ``out_dtype`` as a torch dtype or a name. A call with no output given
runs the op's default overload; one with ``out`` or ``closed`` runs its
``.out`` overload, the missing outputs allocated (zeroed) here, and returns
the outputs; one with ``cache`` (the FP8 ops) runs ``.cache`` or, with
``closed``, ``.cache_out``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..arrays import type_name
from ..ops.framework.binding import Binding
from ..ops.framework.checks import check_bool, check_out_dtype, dtype_fail, fail, given_without, missing_with
from ..ops.framework.results import all_results, cache_target, conditional_outputs, given_outputs
from ..ops.framework.spec import OpSpec, Option, is_pair, pair_error
from .kernels import arguments
from .schema import NAMESPACE, op_name
from .tensors import metadata, numpy_dtype, torch_dtype


def _check_tensor(name: str, value: Any) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"Invalid {name}: expected a torch.Tensor, got {type_name(value)}")
    # The kernels read a dense tensor's memory: another layout reached torch's dispatcher, which has no kernel
    # for it ("Could not run 'kpool::compress' with arguments from the 'SparseCPU' backend").
    if value.layout != torch.strided or value.is_quantized or value.is_nested:
        kind = "quantized" if value.is_quantized else "nested" if value.is_nested else str(value.layout)
        raise TypeError(f"Invalid {name}: expected a dense tensor (torch.strided), got a {kind} one")


def _as_operand(spec: OpSpec, name: str, value: Any) -> Any:
    """A tensor as the op takes it: a ring as a list of one tensor or two."""
    operand = next(o for o in spec.operands if o.name == name)
    if value is None:
        return None
    if operand.pair and is_pair(value):
        if len(value) != 2:
            raise pair_error(name, value)
        for i, ring in enumerate(value):
            _check_tensor(f"{name}[{i}]", ring)
        return list(value)
    _check_tensor(name, value)
    return [value] if operand.pair else value


_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _dtype(option: Option, value: Any) -> Any:
    """A torch dtype for the schema; a name or NumPy dtype is read as the other backends read it. An option with
    its own rule (``Option.check``: the FP8 values' dtype) takes what that rule takes, refused as it refuses."""
    if value is None:
        return None
    if option.check is not None:
        if isinstance(value, torch.dtype):
            try:
                option.check(numpy_dtype(value))
            except TypeError:  # refused, or a dtype NumPy lacks: the rule names the option and this value
                option.check(value)
            return value
        return torch_dtype(option.check(value))
    if isinstance(value, torch.dtype):
        if value not in _OUT_DTYPES:
            raise dtype_fail(option.name, "one of bfloat16, float16, float32", repr(value))
        return value
    return torch_dtype(check_out_dtype(value, None, None))


def _option(option: Option, value: Any) -> Any:
    """An option as the schema takes it, refused as the other backends refuse it (the option's own check):
    a bool must be True or False, integers must be integers."""
    if option.kind == "dtype":
        return _dtype(option, value)
    if option.annotation == "bool":
        check_bool(option.name, value)
        return bool(value)
    if value is None:
        return None
    traced_size = option.kind == "size" and torch.compiler.is_compiling()
    if traced_size and isinstance(value, int) and not isinstance(value, bool):
        # As it is: traced, a symbolic size (int() would fix the graph to one value, a comparison on one read
        # from the data fails the trace). The op's fake kernel checks its range.
        return value
    if option.check is not None:
        option.check(value)
    return int(value) if option.annotation in ("int", "int | None") else value


def _missing_outputs(spec: OpSpec, tensors: dict[str, Any], options: dict[str, Any]) -> list[str]:
    """The outputs the caller left out beside ones they gave, zeroed as the op allocates them, into
    ``tensors`` (in torch ops only, so this traces): each takes the leading shape of a given one (a
    ``closed`` of n entries gives ``out`` n rows, an ``out`` of n rows gives ``closed`` n entries), its rows'
    width and its dtype as its operand says (``Operand.rows_of``, ``dtype``). Outputs that go together
    (``Operand.together``: FP8 values and scales) are refused alone, as the op refuses them. An output the op
    returns only with an option set (expand's ``counts``) is made only with it; one only the call can size
    (``rows_of="*"``: positions) is not made: the op's own checks refuse the call. Returns the names made."""
    outputs = given_outputs(spec)
    conditional = conditional_outputs(spec)
    for o in outputs:
        if o.together and (tensors[o.name] is None) != (tensors[o.together] is None):
            given, missing = (o.name, o.together) if tensors[o.name] is not None else (o.together, o.name)
            raise fail(missing, f"an array with {given} (the two are written together)", "None")
    partner = next(o for o in outputs if tensors[o.name] is not None)
    given = tensors[partner.name]
    lead = tuple(given.shape[:-1] if partner.rows_of else given.shape)  # "*" too: positions' rows
    chosen = next((options[opt.name] for opt in spec.options if opt.kind == "dtype"), None)
    made = []
    for o in outputs:
        if tensors[o.name] is not None or (o.name in conditional and not options[conditional[o.name]]):
            continue
        if o.rows_of == "*":  # the op says why (expand's counts without out)
            spec.describe(*arguments(spec, tensors | options, metadata))
            raise fail(o.name, f"an array with {partner.name}", "None")
        width = (tensors[o.rows_of].shape[-1],) if o.rows_of else ()
        dtype = torch_dtype(o.dtype) if o.dtype else chosen or tensors[o.rows_of].dtype
        tensors[o.name] = torch.zeros((*lead, *width), dtype=dtype, device=given.device)
        made.append(o.name)
    return made


def _returned(spec: OpSpec, options: dict[str, Any], results: Iterable[tuple[str, Any]]) -> Any:
    """``results`` (name, tensor) as the package's function returns them: a conditional one (expand's counts)
    only with its option set; one alone, several as a tuple."""
    wanted = {name: options[option] for name, option in spec.conditional_results.items()}
    kept = [tensor for name, tensor in results if wanted.get(name, True)]
    return kept[0] if len(kept) == 1 else tuple(kept)


def _call(spec: OpSpec, arrays: tuple[Any, ...], options: dict[str, Any], extras: dict[str, Any]) -> Any:
    tensors = {o.name: _as_operand(spec, o.name, a) for o, a in zip(spec.operands, arrays, strict=True)}
    for o in spec.operands:  # inputs that go with another operand: the overload that takes them says
        if o.with_operand and tensors[o.name] is not None and tensors[o.with_operand] is None:
            raise given_without(o.name, o.with_operand)
        if o.required_with and tensors[o.with_operand] is not None and tensors[o.name] is None:
            raise missing_with(o.name, o.with_operand)
    declared = {o.name: o for o in spec.options}
    options = {name: _option(declared[name], value) for name, value in options.items()}
    outputs = given_outputs(spec)
    target = cache_target(spec)
    op = getattr(getattr(torch.ops, NAMESPACE), op_name(spec))
    apart = {o.name for o in outputs} | ({target.name} if target is not None else set())
    inputs = {name: t for name, t in tensors.items() if name not in apart}
    positional = [inputs.pop(o.name) for o in spec.operands if not o.optional]
    keyword = {name: t for name, t in inputs.items() if t is not None} | options
    if target is not None and tensors[target.name] is not None:
        # The cache in place of some outputs: .cache, or .cache_out with the rest given.
        for name in target.replaces:
            if tensors[name] is not None:
                raise fail(name, f"None with {target.name} (the cache holds the values and scales)", "an array")
        rest = {o.name: tensors[o.name] for o in outputs if o.name not in target.replaces}
        if not any(t is not None for t in rest.values()):
            return op.cache(*positional, **keyword, **{target.name: tensors[target.name]})
        op.cache_out(*positional, **keyword, **{target.name: tensors[target.name]}, **rest)
        given = tuple(rest.values())
        return given[0] if len(given) == 1 else given
    if not any(tensors.get(o.name) is not None for o in outputs):
        result = op.default(*positional, **keyword)
        if not spec.conditional_results:
            return result
        return _returned(spec, options, zip(all_results(spec), result, strict=True))
    # Some output given: the others allocated here (torch ops only, so this
    # traces under torch.compile), then the .out overload.
    made = _missing_outputs(spec, tensors, options)
    try:
        op.out(*positional, **keyword, **{o.name: tensors[o.name] for o in outputs})
    except (ValueError, TypeError) as error:
        if any(str(error).startswith(f"Invalid {name}:") for name in made):
            # A refusal of an output made here from a given one's leading shape: the op's checks of the call as
            # the caller made it refuse what the caller gave, by name (an out of the wrong rows, say).
            spec.describe(*arguments(spec, tensors | dict.fromkeys(made) | options, metadata))
        raise
    return _returned(spec, options, ((o.name, tensors[o.name]) for o in outputs))  # in order: out is pooled


BINDING = Binding(
    name="torch",
    module="kpool_cupy.torch",
    array="torch.Tensor",
    result="torch.Tensor",
    options=(),
    call=_call,
    names=(("torch", torch),),
)
