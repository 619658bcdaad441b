"""The package's functions for torch tensors: the same signatures and errors, each a call of a torch op.

``kpool_cupy.torch.kpool_compress(k, gate, ape, ...)`` takes what
``kpool_cupy.kpool_compress`` takes, as tensors: a ring as one tensor or a
pair, ``out_dtype`` as a torch dtype or a name. A call with no output given
runs the op's default overload; one with ``out`` or ``closed`` runs its
``.out`` overload, the missing output allocated (zeroed) here, and returns
the outputs.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ops.binding import Binding, bind
from ..ops.checks import check_out_dtype
from ..ops.spec import OpSpec, is_pair
from .kernels import output_shapes
from .schema import NAMESPACE, RESULTS, given_outputs, op_name
from .tensors import torch_dtype


def _check_tensor(name: str, value: Any) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"Invalid {name}: expected a torch.Tensor, got {type(value).__module__}.{type(value).__name__}")


def _as_operand(spec: OpSpec, name: str, value: Any) -> Any:
    """A tensor as the op takes it: a ring as a list of one or two tensors."""
    operand = next(o for o in spec.operands if o.name == name)
    if value is None:
        return None
    if operand.pair:
        rings = list(value) if is_pair(value) else [value]
        if len(rings) not in (1, 2):
            raise TypeError(
                f"Invalid {name}: expected an array or a pair (key_ring, gate_ring), "
                f"got a {type(value).__name__} of {len(rings)}"
            )
        for i, ring in enumerate(rings):
            _check_tensor(f"{name}[{i}]" if len(rings) == 2 else name, ring)
        return rings
    _check_tensor(name, value)
    return value


def _out_dtype(value: Any) -> Any:
    """A torch dtype for the schema; a name or NumPy dtype is read as the other backends read it."""
    if value is None or isinstance(value, torch.dtype):
        return value
    return torch_dtype(check_out_dtype(value, None, None))


def _call(spec: OpSpec, arrays: tuple[Any, ...], options: dict[str, Any], extras: dict[str, Any]) -> Any:
    tensors = {o.name: _as_operand(spec, o.name, a) for o, a in zip(spec.operands, arrays, strict=True)}
    options = dict(options)
    if "out_dtype" in options:
        options["out_dtype"] = _out_dtype(options["out_dtype"])
    outputs = given_outputs(spec)
    op = getattr(getattr(torch.ops, NAMESPACE), op_name(spec))
    inputs = {name: t for name, t in tensors.items() if name not in {o.name for o in outputs}}
    positional = [inputs.pop(o.name) for o in spec.operands if not o.optional]
    keyword = {name: t for name, t in inputs.items() if t is not None} | options
    if not any(tensors.get(o.name) is not None for o in outputs):
        result = op.default(*positional, **keyword)
        if spec.name in RESULTS and not options.get("compact"):
            return result[0]  # expand: counts only when compacting
        return result
    # Some output given: allocate the others as the op would (zeroed), then the .out overload.
    given = {name: t for name, t in tensors.items() if t is not None} | options
    missing = {o.name for o in outputs if tensors.get(o.name) is None}
    if missing:
        device = positional[1].device if isinstance(positional[0], list) else positional[0].device
        shapes = output_shapes(spec, given, lambda call: {})
        for name in missing:
            shape, dtype = shapes[name]
            tensors[name] = torch.zeros(shape, dtype=torch_dtype(dtype), device=device)
    op.out(*positional, **keyword, **{o.name: tensors[o.name] for o in outputs})
    written = [tensors[o.name] for o in outputs]  # the results, in order (out is pooled)
    return written[0] if len(written) == 1 else tuple(written)


BINDING = Binding(name="torch", module="kpool_cupy.torch", array="Any", optional_array="Any", options=(), call=_call)


def bind_all(specs: tuple[OpSpec, ...]) -> list[Any]:
    return [bind(spec, BINDING) for spec in specs]
