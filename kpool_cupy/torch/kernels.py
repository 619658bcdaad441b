"""The implementations behind each torch overload, written once for every op.

- CPU: the NumPy reference (``kpool_cupy.reference``) on the tensors' own
  memory, so an op equals the reference bit for bit and writes in place; or
  the emulator, the CUDA source built for the CPU (``cpu_backend``).
- CUDA: the GPU path (``kpool_cupy``) on torch's current stream of the
  tensors' device: the tensors are read through DLPack inside that stream
  (no host sync), so a call with ``out``, ``pool_row_offsets`` and
  ``validate=False`` captures in ``torch.cuda.graph``. Outputs of known size
  (ring close, tail update) come from torch's allocator; compress's (its row
  count is the data's) and expand's come from CuPy's and are handed over
  through DLPack.
- fake: output shapes from the op's own argument checks (``OpSpec.describe``
  on metadata-only arrays), compress's pool count an unbacked size.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from ..backends import cupy_plans
from ..backends.cupy import SM90_BUILD_VARIABLE, _takes_a_build
from ..backends.cupy_arrays import stream_of_handle
from ..backends.cupy_plans import MISS
from ..ops.framework.checks import check_aligned, check_out_dtype
from ..ops.framework.engine_forms import BEFORE_CHECKS, read_form
from ..ops.framework.results import given_outputs, output_keys
from ..ops.framework.spec import OpSpec, Option, spread
from . import plans
from .cpu_backend import cpu_module
from .schema import Overload
from .tensors import from_cupy, from_numpy, metadata, numpy_dtype, to_cupy, to_numpy, torch_dtype


def gather_arguments(overload: Overload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The overload's arguments by name, options at their defaults where the dispatcher left them out."""
    positional = [o.name for o in overload.operands if not o.optional]
    given = dict(zip(positional, args, strict=True)) | kwargs
    for option in overload.options:
        given.setdefault(option.name, option.default)
    return given


def check_devices(given: dict[str, Any], operands: tuple[str, ...]) -> torch.device:
    """The device of the first tensor; a ValueError naming any other tensor elsewhere."""
    tensors = [(name, t) for name in operands for t in _tensors(given.get(name))]
    first_name, first = tensors[0]
    for name, tensor in tensors[1:]:
        if tensor.device != first.device:
            raise ValueError(
                f"Invalid {name}: expected a tensor on {first.device} like {first_name}, got one on {tensor.device}"
            )
    return first.device


def _written(overload: Overload, given: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """The tensors the overload writes in place (rings, given outputs)."""
    return [(o.name, t) for o in overload.operands if o.written for t in _tensors(given.get(o.name))]


def _check_writable(written: list[tuple[str, torch.Tensor]]) -> None:
    """A tensor autograd tracks may not be written in place behind its back (torch's own in-place ops refuse
    a leaf that requires grad in grad mode too)."""
    if not torch.is_grad_enabled():
        return
    for name, tensor in written:
        if tensor.requires_grad:
            raise ValueError(
                f"Invalid {name}: expected a tensor that does not require grad (the op writes it in place), "
                "got one that does"
            )


def _bump_versions(written: list[tuple[str, torch.Tensor]]) -> None:
    """Tell autograd the tensors changed, as an in-place torch op does (a graph that saved one then refuses
    to backward through stale values)."""
    for _, tensor in written:
        torch.autograd.graph.increment_version(tensor)


def _tensors(value: Any) -> list[torch.Tensor]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def arguments(
    spec: OpSpec, given: dict[str, Any], convert: Callable[[str, torch.Tensor], Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The package function's arrays (in operand order, a ring list as one array or a pair) and options."""
    arrays = []
    for operand in spec.operands:
        value = read_form(operand, given.get(operand.name), torch.uint8, BEFORE_CHECKS)  # float8 q as bytes
        if isinstance(value, (list, tuple)):
            rings = tuple(convert(operand.name, t) for t in value)
            arrays.append(rings[0] if len(rings) == 1 else rings)
        else:
            arrays.append(None if value is None else convert(operand.name, value))
    options = {o.name: given[o.name] for o in spec.options}
    for option in spec.options:
        if option.kind == "dtype" and options[option.name] is not None:
            options[option.name] = _numpy_option(option, options[option.name])
    return tuple(arrays), options


def _numpy_option(option: Option, value: torch.dtype) -> np.dtype:
    """A dtype option's NumPy dtype. One NumPy has none for (float8_e5m2, complex32: no op takes one) is
    refused by the option's own rule, which names the option, as the wrappers and the other backends do."""
    try:
        return numpy_dtype(value)
    except TypeError:
        if option.check is not None:
            option.check(value)
        else:
            check_out_dtype(value, None, None)
        raise


def _results(spec: OpSpec, overload: Overload, result: Any, wrap: Callable[[Any], torch.Tensor], device: Any) -> Any:
    """The package function's result as the overload's: tensors, and expand's counts always there."""
    if not overload.results:
        return None
    listed = list(result) if isinstance(result, tuple) else [result]
    while len(listed) < len(overload.results):  # expand without compact: no counts
        listed.append(None)
    tensors = [wrap(r) if r is not None else torch.empty(0, dtype=torch.int32, device=device) for r in listed]
    return tensors[0] if len(tensors) == 1 else tuple(tensors)


def cpu_kernel(spec: OpSpec, overload: Overload) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        function = getattr(cpu_module(), spec.name)  # the reference, or the emulator (cpu_backend)
        given = gather_arguments(overload, args, kwargs)
        check_devices(given, tuple(o.name for o in overload.operands))
        written = _written(overload, given)
        _check_writable(written)
        arrays, options = arguments(spec, given, to_numpy)
        named = dict(zip(spec.operand_names, arrays, strict=True))
        result = function(**named, **options)
        _bump_versions(written)
        return _results(spec, overload, result, from_numpy, "cpu")

    return kernel


_streams: dict[tuple[int, int], Any] = {}
_streams_lock = threading.Lock()


def _external_stream(handle: int, device_id: int) -> Any:
    """CuPy's stream of a stream handle on device ``device_id`` (``cupy_arrays.stream_of_handle``), made once and
    kept."""
    stream = _streams.get((handle, device_id))
    if stream is None:
        stream = stream_of_handle(handle, device_id)
        with _streams_lock:
            if len(_streams) >= 64:  # handles of streams gone: start over rather than grow
                _streams.clear()
            _streams[(handle, device_id)] = stream
    return stream


def _launch_stream(device_id: int) -> Any:
    """CuPy's view of torch's current stream on device ``device_id``, for a plan's launch (the full call, which
    comes first, has initialised torch's CUDA state): the raw handle where the build has the call for it."""
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # a CUDA build's, without a Stream object
    handle = raw_stream(device_id) if raw_stream is not None else torch.cuda.current_stream(device_id).cuda_stream
    return _external_stream(handle, device_id)


@contextlib.contextmanager
def _torch_stream(device: torch.device) -> Iterator[Any]:
    """CuPy's current stream set to torch's current stream of ``device``, on that device."""
    import cupy

    handle = torch.cuda.current_stream(device).cuda_stream
    with cupy.cuda.Device(device.index), _external_stream(handle, device.index) as stream:
        yield stream


def _made_kind(make: Callable[..., torch.Tensor], shape: tuple[int, ...], dtype: torch.dtype) -> tuple[Any, ...]:
    return (tuple(shape), dtype, make is torch.zeros)


def _sources(
    spec: OpSpec, positions: dict[str, int], values: tuple[Any, ...], made_at: dict[str, int]
) -> tuple[tuple[int, int], ...]:
    """Per array of the CuPy call (``spread``'s order: a ring list of two is two), where a call finds it: an
    argument, an element of a ring list, a tensor torch made, or none (``plans.ABSENT``)."""
    sources: list[tuple[int, int]] = []
    for operand in spec.operands:
        if operand.name in made_at:
            sources.append((-1, made_at[operand.name]))
        elif operand.name in positions and values[positions[operand.name]] is not None:
            at = positions[operand.name]
            value = values[at]
            if isinstance(value, (list, tuple)):
                sources += [(at, 0)] if len(value) == 1 else [(at, i) for i in range(len(value))]
            else:
                sources.append((at, -1))
        else:
            sources.append(plans.ABSENT)
    return tuple(sources)


def _remember_plan(
    spec: OpSpec,
    overload: Overload,
    known: plans.TorchPlans,
    key: tuple[Any, ...] | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    named: dict[str, Any],
    made: dict[str, torch.Tensor],
    kinds: dict[str, tuple[Any, ...]],
    device: torch.device,
    returned: tuple[int, ...] | None,
) -> None:
    """Remember a full call's plan where its CuPy call ran one (``plans.make_plan`` says when it can)."""
    ran = cupy_plans.ran()
    if key is None or ran is None or ran[0][0] != spec.name:
        return
    if _takes_a_build(spec) and ran[0][-1] != key[0]:  # the CuPy call read another sm_90 build than this key's
        return
    values = (*args, *kwargs.values())
    positional = [o.name for o in overload.operands if not o.optional]
    positions = {name: i for i, name in enumerate([*positional[: len(args)], *kwargs])}
    made_at = {name: i for i, name in enumerate(made) if named[name] is not None}  # counts it does not write: none
    sources = _sources(spec, positions, values, made_at)
    flat = spread(spec.operands, tuple(named[n] for n in spec.operand_names)).arrays
    written_names = {o.name for o in overload.operands if o.written}
    written = tuple(i for name, i in positions.items() if name in written_names and values[i] is not None)
    plan = plans.make_plan(
        ran[1], flat, values, sources, list(made.values()), tuple(kinds.values()), device, written, returned
    )
    if plan is not None:
        known.remember(key, plan)


def cuda_kernel(spec: OpSpec, overload: Overload) -> Callable[..., Any]:
    known = plans.TorchPlans(cupy_plans.MAX_PLANS)
    cupy_plans.also_forget(known.forget_all)  # a path switch (cupy_plans.forget_all) drops these too
    builds = _takes_a_build(spec)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        import kpool_cupy

        build = os.environ.get(SM90_BUILD_VARIABLE) if builds else None
        key = plans.signature(args, kwargs, build)
        plan = known.plans.get(key) if key is not None else None
        if plan is not None:
            import cupy

            values = (*args, *kwargs.values())
            result = plans.replay(plan, values, cupy, _launch_stream(plan.launch.device_id))
            if result is not MISS:
                return result
        given = gather_arguments(overload, args, kwargs)
        device = check_devices(given, tuple(o.name for o in overload.operands))
        written = _written(overload, given)
        _check_writable(written)
        with _torch_stream(device):  # CuPy's current stream: the call (plans included) launches there
            arrays, options = arguments(spec, given, to_cupy)
            named = dict(zip(spec.operand_names, arrays, strict=True))
            # The outputs behind this overload's results (a cache replaces some), where the call's sizes are
            # known without the data (an op whose sizes the data decides may be told them: total_pools).
            call = spec.describe(*arguments(spec, given, metadata)) if spec.dynamic_sizes and overload.results else None
            fixed = call is None or all(bound(call) is None for bound in spec.dynamic_sizes.values())
            keys = output_keys(spec, overload.results) if fixed else ()
            outputs = tuple(o for o in given_outputs(spec) if o.name in keys)
            scratch = [o for o in spec.operands if o.scratch and named[o.name] is None] if spec.scratch_bytes else []
            if outputs or scratch:
                # Before torch allocates for a call the op's own checks would refuse; a call that allocates
                # nothing leaves this to the op alone (once, on the hot path of out=).
                check_aligned(spec.operands, named)
                if call is None:
                    call = spec.describe(*arguments(spec, given, metadata))
            made: dict[str, torch.Tensor] = {}
            kinds: dict[str, tuple[Any, ...]] = {}
            if outputs:
                # Outputs from torch's allocator, zeroed as the op would unless
                # it writes every element (Operand.filled): torch then owns them
                # (record_stream, memory stats, graph pools). An output the call
                # does not return (counts without compact) is empty.
                shapes = spec.outputs(call, **dict.fromkeys(spec.dynamic_sizes))
                for output in outputs:
                    if output.name not in shapes:
                        made[output.name] = torch.empty(0, dtype=torch.int32, device=device)
                        kinds[output.name] = _made_kind(torch.empty, (0,), torch.int32)
                        continue
                    shape, dtype = shapes[output.name]
                    whole = output.filled == "always" or (
                        output.filled == "validated" and options.get("validate", True)
                    )
                    make = torch.empty if whole else torch.zeros
                    made[output.name] = make(shape, dtype=torch_dtype(np.dtype(dtype)), device=device)
                    kinds[output.name] = _made_kind(make, shape, made[output.name].dtype)
                    named[output.name] = to_cupy(output.name, read_form(output, made[output.name], torch.uint8))
            for operand in scratch:  # the op's scratch from torch's allocator too (the backward's partial sums)
                size = max(spec.scratch_bytes(call), 1)
                made[operand.name] = torch.empty(size, dtype=torch.uint8, device=device)
                kinds[operand.name] = _made_kind(torch.empty, (size,), torch.uint8)
                named[operand.name] = to_cupy(operand.name, made[operand.name])
            cupy_plans.forget_ran()
            result = getattr(kpool_cupy, spec.name)(**named, **options)
            _bump_versions(written)
            if outputs or not overload.results:  # results torch made, or none: a plan can make them again
                returned = tuple(list(made).index(o.name) for o in outputs) if overload.results else None
                _remember_plan(spec, overload, known, key, args, kwargs, named, made, kinds, device, returned)
            if outputs:
                tensors = tuple(made[o.name] for o in outputs)
                return tensors[0] if len(tensors) == 1 else tensors
            return _results(spec, overload, result, from_cupy, device)

    kernel.plans = known  # type: ignore[attr-defined]  # tests read and clear them
    return kernel


def output_shapes(spec: OpSpec, given: dict[str, Any], sizes: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """The op's output shapes and dtypes from its argument checks on metadata alone."""
    arrays, options = arguments(spec, given, metadata)
    call = spec.describe(arrays, options)
    return spec.outputs(call, **sizes(call))


def _unbacked_sizes(spec: OpSpec) -> Callable[[Any], dict[str, Any]]:
    """The op's data-dependent sizes as unbacked symbolic sizes, bounded as the spec says."""

    def sizes(call: Any) -> dict[str, Any]:
        made = {}
        for name, bound in spec.dynamic_sizes.items():
            most = bound(call)
            if most is None:  # known from the call itself (the scorer's max_pools): nothing for the data to decide
                made[name] = None
            elif isinstance(most, torch.SymInt):  # a bound from symbolic sizes: torch takes only a known one
                made[name] = torch.library.get_ctx().new_dynamic_size(min=0)
            else:
                made[name] = torch.library.get_ctx().new_dynamic_size(min=0, max=most) if most > 0 else 0
        return made

    return sizes


def fake_kernel(spec: OpSpec, overload: Overload) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        given = gather_arguments(overload, args, kwargs)
        device = check_devices(given, tuple(o.name for o in overload.operands))
        if not overload.results:  # an .out overload: the checks alone (no size to make, none to return)
            spec.describe(*arguments(spec, given, metadata))
            return None
        shapes = output_shapes(spec, given, _unbacked_sizes(spec))
        made = {
            name: torch.empty(shape, dtype=torch_dtype(np.dtype(dtype)), device=device)
            for name, (shape, dtype) in shapes.items()
        }
        keys = output_keys(spec, overload.results)
        tensors = [made.get(key, torch.empty(0, dtype=torch.int32, device=device)) for key in keys]
        return tensors[0] if len(tensors) == 1 else tuple(tensors)

    return kernel
