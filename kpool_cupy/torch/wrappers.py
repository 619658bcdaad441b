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

from typing import Any

import numpy as np
import torch

from ..ops.binding import Binding, bind
from ..ops.checks import check_out_dtype, dtype_fail, fail
from ..ops.expand_topk import MAX_BLOCK_SIZE
from ..ops.spec import OpSpec, is_pair, pair_error
from ..pool_offsets import check_kpool
from .schema import NAMESPACE, RESULTS, cache_target, given_outputs, op_name
from .tensors import torch_dtype


def _check_tensor(name: str, value: Any) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"Invalid {name}: expected a torch.Tensor, got {type(value).__module__}.{type(value).__name__}")


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


def _out_dtype(value: Any) -> Any:
    """A torch dtype for the schema; a name or NumPy dtype is read as the other backends read it."""
    if value is None:
        return None
    if isinstance(value, torch.dtype):
        if value not in _OUT_DTYPES:
            raise dtype_fail("out_dtype", "one of bfloat16, float16, float32", repr(value))
        return value
    return torch_dtype(check_out_dtype(value, None, None))


_BOOLS = ("validate", "always_select_tail", "compact", "rotate", "round_scale")


def _option(name: str, value: Any) -> Any:
    """An option as the schema takes it, refused as the other backends refuse it: ints are integers (not
    bools), bools are read for their truth as Python reads them."""
    if name == "out_dtype":
        return _out_dtype(value)
    if name in _BOOLS:
        return bool(value)
    if value is None or name not in ("kpool", "block_size"):
        return value
    if name == "kpool":
        check_kpool(value)
    elif isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise dtype_fail(name, "an integer", type(value).__name__)
    elif not 1 <= int(value) <= MAX_BLOCK_SIZE:
        raise fail(name, f"an integer in [1, {MAX_BLOCK_SIZE}]", int(value))
    return int(value)


def _missing_outputs(spec: OpSpec, tensors: dict[str, Any], options: dict[str, Any]) -> None:
    """The outputs the caller left out when they passed a partner, zeroed as the op would allocate them, into
    ``tensors``. ``out`` and ``closed`` (ring close, tail update) each follow the other: ``closed`` has out's
    shape without the channels, ``out`` is closed's shape by head_dim. FP8 values and scales go together
    (one without the other is the package's error); ``closed`` follows them, or they follow it."""
    names = {o.name for o in given_outputs(spec)}
    k = tensors["k"] if "k" in tensors else tensors["x"]
    head_dim = k.shape[-1]
    if "out_scale" in names:
        if (tensors["out"] is None) != (tensors["out_scale"] is None):
            given, missing = ("out", "out_scale") if tensors["out"] is not None else ("out_scale", "out")
            raise fail(missing, f"an array with {given} (the two are written together)", "None")
        if tensors["out"] is None:  # closed alone
            shape, device = tensors["closed"].shape, tensors["closed"].device
            tensors["out"] = torch.zeros((*shape, head_dim), dtype=torch.uint8, device=device)
            tensors["out_scale"] = torch.zeros(shape, dtype=torch.float32, device=device)
    elif "closed" in names and tensors["out"] is None:
        closed = tensors["closed"]
        dtype = options.get("out_dtype") or k.dtype
        tensors["out"] = torch.zeros((*closed.shape, head_dim), dtype=dtype, device=closed.device)
    if "closed" in names and tensors["closed"] is None:
        out = tensors["out"]
        tensors["closed"] = torch.zeros(out.shape[:-1], dtype=torch.int32, device=out.device)


def _call(spec: OpSpec, arrays: tuple[Any, ...], options: dict[str, Any], extras: dict[str, Any]) -> Any:
    tensors = {o.name: _as_operand(spec, o.name, a) for o, a in zip(spec.operands, arrays, strict=True)}
    options = {name: _option(name, value) for name, value in options.items()}
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
        if spec.name in RESULTS and not options.get("compact"):
            return result[0]  # expand: counts only when compacting
        return result
    # Some output given: the others allocated here (torch ops only, so this
    # traces under torch.compile), then the .out overload.
    _missing_outputs(spec, tensors, options)
    op.out(*positional, **keyword, **{o.name: tensors[o.name] for o in outputs})
    written = [tensors[o.name] for o in outputs]  # the results, in order (out is pooled)
    return written[0] if len(written) == 1 else tuple(written)


BINDING = Binding(name="torch", module="kpool_cupy.torch", array="Any", optional_array="Any", options=(), call=_call)


def bind_all(specs: tuple[OpSpec, ...]) -> list[Any]:
    return [bind(spec, BINDING) for spec in specs]
