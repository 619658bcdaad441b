"""Launch plans: a GPU call that repeats a signature goes straight to its launch.

A signature is everything an op's checks and launch depend on but the
addresses: per operand its type, dtype, shape, strides, device and whether
its address is 16-byte aligned, plus the op's options. The first call of a
signature runs the op in full; if it made exactly one launch and nothing
else on the host (no copy, no allocation: ``validate=False`` with every
output and ``pool_row_offsets=`` given), its launch becomes the plan: the
kernel, the geometry, which argument is which operand, the constants, the
results. A later call with the same signature passes the same checks by
construction, so it only redoes what depends on the addresses: the overlap
rule (a byte-range test that sends any possible overlap back to the full
path, which decides and names the arguments) and the argument tuple. A
launch with dynamic shared memory replays with the same ``shared_mem``: the
full call launched through ``cupy_launch.launch_function``, which raised the
function's limit where it had to, and the function keeps it.

The fast path is written to make few Python calls (tests/test_host_path.py
counts them): one function and the overlap rule's, loops, no other helper.

A signature with no plan (a validated call, which reads the index arrays on
the host; a call that allocates) still passed its checks that read no data
the first time: ``CheckedCall`` keeps the call record they gave, so a later
call of the signature skips them and runs the op's own run (every check of
the data included) after the same overlap rule. Writeability is no part of a
signature: a CuPy array has none (its flags are contiguity and ownership;
the CuPy double's NumPy flags can say read-only, which plans and checked
signatures do not see).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..ops.framework.spec import Launch, OpSpec

MISS = object()  # replay() found no plan, or a possible overlap: run the full path


@dataclass(frozen=True)
class LaunchPlan:
    """One signature's launch, with the addresses left out."""

    function: Any  # the loaded kernel, on the signature's device
    device_id: int
    grid: tuple[int]
    block: tuple[int]
    shared_bytes: int  # dynamic shared memory a block; the full call opted the function in (cupy_launch)
    slots: tuple[int, ...]  # per kernel argument: the operand it passes, or -1 for a constant
    constants: tuple[Any, ...]  # per kernel argument: the constant, or None where an operand goes
    results: tuple[int, ...] | None  # the operands the call returns, in order; None: it returns None
    single: bool  # one result, returned bare
    extents: tuple[tuple[int, int], ...]  # per operand: bytes it spans from its data pointer, (0, 0) if none
    written: tuple[int, ...]  # the operands the kernel writes


_plans: dict[tuple[Any, ...], LaunchPlan] = {}
_plans_lock = threading.Lock()
# Signatures vary with batch size and lengths; past this many the cache starts
# over rather than grow without bound (a plan costs one full call to remake).
MAX_PLANS = 4096


def signature(spec: OpSpec, arrays: tuple[Any, ...], options: dict[str, Any], ndarray: type) -> tuple[Any, ...] | None:
    """The key of a call's plan, or None when some operand is not a CuPy array (DLPack inputs take the full path)."""
    # Each option with its type: 0 == False and 1 == True == 1.0 in Python, and the full path refuses some of them.
    key: list[Any] = [spec.name]
    for value in options.values():
        key.append((type(value), value))
    for array in arrays:
        if array is None:
            key.append(None)
        elif type(array) is ndarray:
            data = array.data  # its device_id is array.device's id, without making a Device
            key.append((array.dtype, array.shape, array.strides, data.ptr & 15, data.device_id))
        else:
            return None
    signed = tuple(key)
    try:
        hash(signed)
    except TypeError:  # an option no plan could be keyed by: the full path checks it and names it
        return None
    return signed


def extent(array: Any) -> tuple[int, int]:
    """Bytes ``array`` spans around its data pointer, (low, high); (0, 0) when it holds no element."""
    if array is None or 0 in array.shape:
        return (0, 0)
    low = sum(min(0, (n - 1) * s) for n, s in zip(array.shape, array.strides, strict=True))
    high = sum(max(0, (n - 1) * s) for n, s in zip(array.shape, array.strides, strict=True)) + array.itemsize
    return (low, high)


def may_overlap(bases: list[Any], extents: tuple[tuple[int, int], ...], written: tuple[int, ...]) -> bool:
    """Whether a written array's byte range (``extents`` around its data pointer in ``bases``; None: no array)
    meets another array's: the overlap rule of a signature's later calls, on addresses alone (torch's plans
    apply it too). A possible overlap goes back to the full checks, which decide exactly and name the
    arguments."""
    for w in written:
        w_low, w_high = extents[w]
        if w_high == w_low:
            continue
        w_base = bases[w]
        for i in range(len(bases)):
            base = bases[i]
            if i == w or base is None or extents[i][1] == extents[i][0]:
                continue
            if w_base + w_low < base + extents[i][1] and base + extents[i][0] < w_base + w_high:
                return True
    return False


def _same_start(view: Any, array: Any) -> bool:
    """Whether ``view`` is a view of ``array`` that starts where it does: the same pointer to a kernel (which
    takes a pointer and its sizes as values), so a replay may pass ``array`` in its place."""
    base = getattr(view, "base", None)
    return (
        array is not None
        and base is not None
        and (base is array or base is getattr(array, "base", None))
        and view.data.ptr == array.data.ptr
    )


def make_plan(
    arrays: tuple[Any, ...], writes: tuple[bool, ...], launch: Launch, function: Any, device_id: int, result: Any
) -> LaunchPlan | None:
    """The plan of a full call that made exactly ``launch``, or None when the call cannot be replayed.

    ``arrays`` are the call's arrays one by one (a split ring's two are two,
    ``ops.framework.spec.spread``), ``writes`` whether the op writes each. Every array
    argument of the launch must be one of them and every result one of them
    too; anything else (an array the op made) would have to be made again.
    One array passed as two operands makes no plan: the plan could not tell
    which operand an argument stands for.
    """
    given = [id(array) for array in arrays if array is not None]
    if len(set(given)) != len(given):
        return None
    slots, constants = [], []
    for argument in launch.arguments:
        owner = next((i for i, array in enumerate(arrays) if array is not None and argument is array), -1)
        if owner < 0:  # an engine form read through a view (DeepGEMM's 4-D cache): the kernel takes its pointer
            starts = [i for i, array in enumerate(arrays) if _same_start(argument, array)]
            if len(starts) > 1:  # which operand it stands for is not known: no plan
                return None
            owner = starts[0] if starts else -1
        if owner < 0 and hasattr(argument, "shape") and getattr(argument, "ndim", 0) > 0:
            return None
        slots.append(owner)
        constants.append(None if owner >= 0 else argument)
    results: list[int] | None = None  # a call that returns None (a cache form) replays to None
    if result is not None:
        returned = result if isinstance(result, tuple) else (result,)
        results = [next((i for i, array in enumerate(arrays) if r is not None and r is array), -1) for r in returned]
        if -1 in results:
            return None
    written = tuple(i for i, writes_it in enumerate(writes) if writes_it and arrays[i] is not None)
    return LaunchPlan(
        function=function,
        device_id=device_id,
        grid=(launch.geometry.grid,),
        block=(launch.geometry.block,),
        shared_bytes=launch.geometry.shared_bytes,
        slots=tuple(slots),
        constants=tuple(constants),
        results=None if results is None else tuple(results),
        single=not isinstance(result, tuple),
        extents=tuple(extent(a) for a in arrays),
        written=written,
    )


@dataclass(frozen=True)
class CheckedCall:
    """One signature whose checks that read no data passed: what ``binding.check_call`` gave, but the arrays."""

    call: Any  # the op's call record: metadata only (every op's ``check_args`` reads no contents, no address)
    device_id: int  # every array's device
    extents: tuple[tuple[int, int], ...]  # per array (``spread``'s): bytes it spans from its data pointer
    written: tuple[int, ...]  # the arrays the op writes


_checked: dict[tuple[Any, ...], CheckedCall] = {}


def remember_checked(key: tuple[Any, ...], checked: CheckedCall) -> None:
    with _plans_lock:
        if len(_checked) >= MAX_PLANS:
            _checked.clear()
        _checked[key] = checked


def checked_call(key: tuple[Any, ...], arrays: tuple[Any, ...], stream: Any = None) -> CheckedCall | None:
    """The checked signature of ``key`` where a call of it may skip the checks: None when there is none, when
    ``stream`` (a CuPy stream, or None) is another device's, or when a written array's bytes may meet another
    array's (the full checks then decide, and name the arguments)."""
    checked = _checked.get(key)
    if checked is None or (stream is not None and stream.device_id >= 0 and stream.device_id != checked.device_id):
        return None
    bases = [None if array is None else array.data.ptr for array in arrays]
    return None if may_overlap(bases, checked.extents, checked.written) else checked


# The plan this thread's latest call replayed or made, with its key: what torch.ops.kpool's CUDA kernels build
# their own plans on (kpool_cupy/torch/plans.py). An attribute, not a call, on the replay's path.
_ran = threading.local()


def remember(key: tuple[Any, ...], plan: LaunchPlan) -> None:
    with _plans_lock:
        if len(_plans) >= MAX_PLANS:
            _plans.clear()
        _plans[key] = plan
    _ran.entry = (key, plan)


def forget_ran() -> None:
    """Forget which plan this thread's latest call ran (before a call whose plan is wanted)."""
    _ran.entry = None


def ran() -> tuple[tuple[Any, ...], LaunchPlan] | None:
    """The key and plan this thread's latest call replayed or made since ``forget_ran``; None if it had none."""
    return getattr(_ran, "entry", None)


# Plans built on these elsewhere (torch.ops.kpool's: kpool_cupy/torch/plans.py), each forgotten with them.
_built_on: list[weakref.WeakMethod[Callable[[], None]]] = []


def also_forget(forget: Callable[[], None]) -> None:
    """Have ``forget_all`` call ``forget`` (a bound method, held weakly) too: plans built on these would
    otherwise replay a kernel a path switch meant to drop."""
    _built_on.append(weakref.WeakMethod(forget))  # type: ignore[arg-type]


def forget_all() -> None:
    """Drop every plan and checked signature, and every plan built on them (a path switch; tests; a plan holds
    a loaded kernel)."""
    with _plans_lock:
        _plans.clear()
        _checked.clear()
        _built_on[:] = [held for held in _built_on if held() is not None]
        forgets = [held() for held in _built_on]
    for forget in forgets:
        if forget is not None:
            forget()


def replay(key: tuple[Any, ...], arrays: tuple[Any, ...], cupy: Any, stream: Any = None) -> Any:
    """Launch the plan of ``key`` with this call's arrays on ``stream`` (a CuPy stream; None: the current one)
    and return its results, or MISS.

    MISS when there is no plan, when the stream is another device's (a
    ``device_id`` of -1, CuPy's null and per-thread streams, is the current
    device's), or when an output's bytes may meet another operand's: the full
    path then applies its rule exactly.
    """
    plan = _plans.get(key)
    if plan is None or (stream is not None and stream.device_id >= 0 and stream.device_id != plan.device_id):
        return MISS
    bases = []  # a loop, not a comprehension: no call on this path
    for array in arrays:
        bases.append(None if array is None else array.data.ptr)
    if may_overlap(bases, plan.extents, plan.written):
        return MISS
    _ran.entry = (key, plan)
    arguments = list(plan.constants)
    slots = plan.slots
    for position in range(len(slots)):
        if slots[position] >= 0:
            arguments[position] = arrays[slots[position]]
    with cupy.cuda.Device(plan.device_id):
        if stream is None:
            plan.function(plan.grid, plan.block, tuple(arguments), shared_mem=plan.shared_bytes)
        else:
            with stream:
                plan.function(plan.grid, plan.block, tuple(arguments), shared_mem=plan.shared_bytes)
    if plan.results is None:
        return None
    if plan.single:
        return arrays[plan.results[0]]
    return tuple([arrays[i] for i in plan.results])
