"""Launch plans of ``torch.ops.kpool``'s CUDA kernels: a hot call goes from its tensors to its kernel.

The CUDA kernel of an overload (``kernels.cuda_kernel``) reads each tensor
through DLPack inside a CuPy view of torch's stream, may run the op's checks
on metadata to size its outputs, and calls the CuPy function: tens of
microseconds of host work for a launch of a few. When that call ran a CuPy
launch plan (``backends.cupy_plans``: one launch and nothing else on the
host, so ``validate=False`` with every output that is not torch's given),
the tensors' signature gets a plan of its own: the CuPy plan, and where
each of its arrays comes from (an argument, an element of a ring list, or
an output torch makes). A later call of that signature makes torch's
outputs as the first call made them, applies the overlap rule to the
tensors' addresses, and launches the kernel with their data pointers on
torch's current stream: no DLPack, no check, no CuPy array.

The signature holds what the CuPy plan's key depends on, read off the
tensors: per argument its dtype, shape, strides, device and whether its
address is 16-byte aligned (a list: each tensor's), every option by type
and value, the keyword names, and for the ops that take an sm_90 build its
variable. Equal signatures make equal CuPy keys, so the first call's checks
hold for each later call. A plan is made only where every array of the CuPy
plan is one of the call's tensors, or one torch made, at the same address
and with the same extent: anything else the call did (an array converted,
copied or made by CuPy) has no plan.

The replay is written for few Python calls (tests/test_torch_host_path.py
counts them): one function and the overlap rule it shares with CuPy's plans
(``cupy_plans.may_overlap``), loops, no other helper.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from ..backends.cupy_plans import MISS, LaunchPlan, extent, may_overlap

ABSENT = (-2, -2)  # a source: no array (an optional operand left out)


@dataclass(frozen=True)
class TorchPlan:
    """A torch signature's launch: the CuPy plan, and each of its arrays' source in a call."""

    launch: LaunchPlan
    device: torch.device
    made: tuple[tuple[tuple[int, ...], torch.dtype, bool], ...]  # what torch makes each call: shape, dtype, zeroed
    # Per array of the launch plan (its extents' order): (argument, element) into the call's arguments (element
    # -1: the argument itself; otherwise an element of its list), (-1, k) for made[k], or ABSENT.
    sources: tuple[tuple[int, int], ...]
    written: tuple[int, ...]  # the arguments the op writes in place (a tensor or a ring list)
    returned: tuple[int, ...] | None  # the made tensors the call returns, in order; None: it returns None
    single: bool  # one result, returned bare


class TorchPlans:
    """One overload's plans by signature, bounded as CuPy's are (``cupy_plans.MAX_PLANS``)."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.plans: dict[tuple[Any, ...], TorchPlan] = {}
        self.lock = threading.Lock()

    def remember(self, key: tuple[Any, ...], plan: TorchPlan) -> None:
        with self.lock:
            if len(self.plans) >= self.most:
                self.plans.clear()
            self.plans[key] = plan

    def forget_all(self) -> None:
        with self.lock:
            self.plans.clear()


def signature(args: tuple[Any, ...], kwargs: dict[str, Any], build: str | None) -> tuple[Any, ...] | None:
    """The key of a call's plan: per argument what a CuPy key reads of its arrays and torch's negative bit (a
    negated view reads as its memory; the full path refuses it), or the option with its type; the keyword
    names; ``build``. None where an option cannot be hashed, or a tensor has no strides or storage
    (sparse, say): the full path names it."""
    key: list[Any] = [build, tuple(kwargs)]
    try:
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor):
                ptr, device, negated = value.data_ptr() & 15, value.get_device(), value.is_neg()
                key.append((value.dtype, value.shape, value.stride(), ptr, device, negated))
            elif isinstance(value, (list, tuple)):
                key.append(
                    tuple(
                        [(t.dtype, t.shape, t.stride(), t.data_ptr() & 15, t.get_device(), t.is_neg()) for t in value]
                        if all([isinstance(t, torch.Tensor) for t in value])
                        else [(type(t), t) for t in value]
                    )
                )
            else:
                key.append((type(value), value))
        signed = tuple(key)
        hash(signed)
    except (RuntimeError, TypeError):
        return None
    return signed


def tensor_extent(tensor: torch.Tensor | None) -> tuple[int, int]:
    """Bytes ``tensor`` spans around its data pointer, (low, high), as ``cupy_plans.extent`` measures an array."""
    if tensor is None:
        return (0, 0)
    size = tensor.element_size()
    strides = tuple(s * size for s in tensor.stride())
    return extent(SimpleNamespace(shape=tuple(tensor.shape), strides=strides, itemsize=size))


def source_tensor(source: tuple[int, int], values: tuple[Any, ...], made: list[torch.Tensor]) -> Any:
    """The tensor a source names in a call (None for ABSENT)."""
    argument, element = source
    if source == ABSENT:
        return None
    if argument < 0:
        return made[element]
    return values[argument] if element < 0 else values[argument][element]


def make_plan(
    launch: LaunchPlan,
    arrays: tuple[Any, ...],
    values: tuple[Any, ...],
    sources: tuple[tuple[int, int], ...],
    made: list[torch.Tensor],
    made_kinds: tuple[tuple[tuple[int, ...], torch.dtype, bool], ...],
    device: torch.device,
    written: tuple[int, ...],
    returned: tuple[int, ...] | None,
) -> TorchPlan | None:
    """The plan of a call whose CuPy call ran ``launch`` over ``arrays`` (its arrays one by one), where
    ``sources`` say which of the call's tensors each array should be; None unless each is that tensor's
    memory exactly (same address, same extent) and the launch read as many arrays."""
    if len(arrays) != len(sources) or len(launch.extents) != len(arrays):
        return None
    for array, source, span in zip(arrays, sources, launch.extents, strict=True):
        tensor = source_tensor(source, values, made)
        if (array is None) != (tensor is None):
            return None
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor) or array.data.ptr != tensor.data_ptr():
            return None
        if tensor_extent(tensor) != span:
            return None
    return TorchPlan(
        launch=launch,
        device=device,
        made=made_kinds,
        sources=sources,
        written=written,
        returned=returned,
        single=returned is not None and len(returned) == 1,
    )


def replay(plan: TorchPlan, values: tuple[Any, ...], cupy: Any, stream: Any) -> Any:
    """Launch ``plan`` with this call's tensors (``values``: its arguments, positional then keyword) on
    ``stream`` (a CuPy stream; None: CuPy's current one) and return its results, or MISS: a written tensor
    that requires grad in grad mode (the full path refuses it, naming it), or an output whose bytes may meet
    another array's (the full path applies the overlap rule exactly)."""
    if torch.is_grad_enabled():
        for i in plan.written:
            value = values[i]
            for tensor in value if isinstance(value, (list, tuple)) else (value,):
                if tensor.requires_grad:
                    return MISS
    made = []
    for shape, dtype, zeroed in plan.made:
        made.append((torch.zeros if zeroed else torch.empty)(shape, dtype=dtype, device=plan.device))
    pointers: list[Any] = []
    for argument, element in plan.sources:
        if argument == -2:
            pointers.append(None)
        elif argument < 0:
            pointers.append(made[element].data_ptr())
        elif element < 0:
            pointers.append(values[argument].data_ptr())
        else:
            pointers.append(values[argument][element].data_ptr())
    launch = plan.launch
    if may_overlap(pointers, launch.extents, launch.written):
        return MISS
    arguments = list(launch.constants)
    slots = launch.slots
    for position in range(len(slots)):
        if slots[position] >= 0:
            arguments[position] = pointers[slots[position]]
    with cupy.cuda.Device(launch.device_id):
        launch.function(launch.grid, launch.block, tuple(arguments), shared_mem=launch.shared_bytes, stream=stream)
    for i in plan.written:  # autograd's version counters, as an in-place torch op bumps them
        value = values[i]
        for tensor in value if isinstance(value, (list, tuple)) else (value,):
            torch.autograd.graph.increment_version(tensor)
    if plan.returned is None:
        return None
    if plan.single:
        return made[plan.returned[0]]
    return tuple([made[i] for i in plan.returned])
