"""What an op is: its parameters, its call flow, and the launches it asks a backend to run.

Each op module of ``ops.OPS`` builds one ``OpSpec`` (an ``_fp8`` form builds
its spec from its plain op's, ``fp8_form``). Its ``check`` turns the arrays
(by name) and options into a call record; its ``run`` checks array contents
when asked, sizes and allocates the outputs, and hands ``Launch`` records
to the backend (``ops.framework.binding.execute`` runs the two, with the overlap rule
between them). A backend only places memory and runs launches
(``Backend``); the public functions are bound from the spec
(``ops.framework.binding``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Protocol

import numpy as np

from ...kernel.declarations import Kernel
from ...kernel.geometry import LaunchGeometry, groups_launch
from .engine_forms import BEFORE_CHECKS, read_forms


@dataclass(frozen=True)
class Operand:
    """An array parameter.

    ``rule`` is its dtype and shape rule in one line, for documentation and
    generated schemas. An optional operand is keyword-only and defaults to
    None; ``written`` says the op writes into it (an ``out=``, a ring);
    ``pair`` that it may also be given as a pair of arrays (a split ring:
    ``(key_ring, gate_ring)``). ``replaces`` names the outputs an array
    written in place takes the place of (an FP8 cache replaces ``out`` and
    ``out_scale``): it is never allocated, and with it the op returns the
    other results only.

    For an output a frontend may have to make beside one the caller gave
    (torch's wrappers, which must stay traceable, so cannot run the checks):
    ``rows_of`` names the operand whose last dim is the width of its rows
    (pooled rows ``[..., head_dim]``; empty: no rows, the partner's leading
    shape alone; ``"*"``: rows as wide as the call says, which a frontend
    cannot make alone), ``dtype`` its fixed dtype (empty: the op's dtype option,
    else ``rows_of``'s dtype), ``together`` the output it is only given with
    (FP8 values and scales).

    ``scratch``: working memory the op writes and leaves as it found it (the
    fused select's ``workspace``), never an output. ``filled``: whether the op
    writes every element of an output, so that a frontend making it need not
    zero it: ``"always"``, ``"validated"`` (when its call validates: garbage
    offsets may leave rows unwritten), or ``""`` (not known to).

    ``form`` says which engine form the operand takes beside its own
    (``engine_forms``): ``"e4m3"`` an array typed float8_e4m3fn for its
    uint8 bytes, ``"paged_cache"`` DeepGEMM's 4-D paged cache for the 3-D one.

    ``with_operand`` names the operand an input is only taken with (an FP8
    op's slots and block table go with its cache): a torch overload without
    that operand leaves this one out of its schema; ``required_with`` makes
    it required there (tail update writes a cache through a block table
    only).
    """

    name: str
    rule: str
    optional: bool = False
    written: bool = False
    pair: bool = False
    replaces: tuple[str, ...] = ()
    rows_of: str = ""
    dtype: str = ""
    together: str = ""
    with_operand: str = ""
    required_with: bool = False
    scratch: bool = False
    form: str = ""
    filled: str = ""


REQUIRED = object()  # an Option without a default: keyword-only and required


@dataclass(frozen=True)
class Option:
    """A keyword-only scalar parameter, such as ``validate`` or ``kpool``.

    ``kind`` says what the value is where ``annotation`` does not: ``"dtype"``
    (a dtype or its name), ``"size"`` (an integer that sizes a result, which
    torch.compile may keep symbolic: ``SymInt`` in a torch schema). ``check`` is the op's own check of a value that
    is not None, for a frontend that converts the value before the op sees
    it (torch's schema types): the same error there as from the op.
    """

    name: str
    annotation: str
    default: Any = REQUIRED
    kind: str = ""
    check: Callable[[Any], None] | None = None


Parameter = Operand | Option


@dataclass(frozen=True)
class Spread:
    """A call's operands one array each, as a backend places them: a pair is two entries."""

    names: tuple[str, ...]  # "tail[0]", "tail[1]" for the two arrays of a pair
    arrays: tuple[Any, ...]
    written: tuple[bool, ...]


def is_pair(value: Any) -> bool:
    """Whether an operand's value is a pair of arrays rather than one array (tuple or list; arrays have shape)."""
    return isinstance(value, (tuple, list)) and not hasattr(value, "shape")


def pair_error(name: str, value: Any) -> TypeError:
    """The error for a tuple or list that is no pair: what every backend says."""
    return TypeError(
        f"Invalid {name}: expected an array or a pair (key_ring, gate_ring), got a {type(value).__name__} "
        f"of {len(value)}"
    )


def spread(operands: tuple[Operand, ...], arrays: tuple[Any, ...]) -> Spread:
    """The arrays of a call one by one, a pair given for a ``pair`` operand as two; a TypeError naming the
    operand for a tuple of the wrong length."""
    names, flat, written = [], [], []
    for operand, value in zip(operands, arrays, strict=True):
        if operand.pair and is_pair(value):
            if len(value) != 2:
                raise pair_error(operand.name, value)
            names += [f"{operand.name}[0]", f"{operand.name}[1]"]
            flat += list(value)
            written += [operand.written] * 2
        else:
            names.append(operand.name)
            flat.append(value)
            written.append(operand.written)
    return Spread(tuple(names), tuple(flat), tuple(written))


def gather(operands: tuple[Operand, ...], given: tuple[Any, ...], flat: tuple[Any, ...]) -> tuple[Any, ...]:
    """``spread``'s arrays back in operand order (a pair as a tuple), where ``given`` was the call's."""
    arrays, i = [], 0
    for operand, value in zip(operands, given, strict=True):
        if operand.pair and is_pair(value):
            arrays.append((flat[i], flat[i + 1]))
            i += 2
        else:
            arrays.append(flat[i])
            i += 1
    return tuple(arrays)


OutputShape = tuple[tuple[int, ...], np.dtype]


class CallArgs(SimpleNamespace):
    """A call's arrays and options by name, read as attributes (``a.k``, ``a.rotate``): what an op's
    argument check takes, so that it names no parameter list of its own."""


VALIDATE = Option("validate", "bool", True)


@dataclass(frozen=True)
class Launch:
    """One kernel launch an op asks for.

    ``kernel`` is the kernel's declaration (``kernel.declarations``);
    ``template`` and ``values`` are its template parameters and parameters by
    name, from which ``instance`` (the instantiation in ``kernel.source``) and
    ``arguments`` (the tuple in the kernel's order, scalars as NumPy scalars
    of the exact C++ width) are built here, so a launch never lists
    arguments by position. ``operands`` are the op's arrays by operand name
    (a ring as the caller gave it): with ``template`` and ``values``, what a
    backend that runs the kernel another way (the NumPy reference) reads.
    """

    kernel: Kernel
    template: Mapping[str, Any]
    values: Mapping[str, Any]
    geometry: LaunchGeometry
    operands: Mapping[str, Any]
    instance: str = field(init=False)
    arguments: tuple[Any, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "template", self.kernel.resolve(self.template))
        object.__setattr__(self, "instance", self.kernel.resolved_instance(self.template))
        object.__setattr__(self, "arguments", self.kernel.arguments(self.values))


class Backend(Protocol):
    """What an op's call flow needs from a backend: memory and launches, nothing about ops."""

    def host_copies(self, arrays: list[Any]) -> list[np.ndarray]:
        """Host int64 copies of small index arrays, in one transfer where that matters."""
        ...

    def from_host(self, array: np.ndarray) -> Any: ...

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any: ...

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any: ...

    def launch(self, launch: Launch) -> None: ...

    def tensor_core(self) -> int:
        """The tensor-core instruction the scorer's kernels are built for on this backend's device
        (``kernel.declarations.MMA_E4M3``, ``MMA_E4M3_HMMA``, ``MMA_F16`` or ``MMA_WGMMA``: the ``MMA`` template
        argument); a ValueError naming the device where it has none."""
        ...


@dataclass(frozen=True)
class Gradient:
    """What an op's backward is, declared beside the op (by the backward's spec name, so the op's module
    need not import the backward's, which imports it).

    ``op`` is the backward op's spec name; it takes the forward's operands and
    options by name where it has them (the inputs, never the forward's
    results: it recomputes what it needs). ``inputs`` are the operands that
    get gradients, in the order of the backward's results; ``outputs`` is
    the backward's operand that takes each forward result's gradient, in
    the order of ``results``. ``refused`` are options with no backward: a
    call that sets one (truthy) is not differentiable, and asking for its
    gradient raises, naming the option.
    """

    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    refused: tuple[str, ...] = ()


@dataclass(frozen=True)
class OpSpec:
    """One op, described once.

    ``parameters`` are in signature order: required operands (positional),
    then keyword-only operands and options. Arrays travel by operand name
    (``named``). ``check(arrays, options)`` runs the op's argument checks
    on metadata alone (no values, no overlap) and returns the call record;
    ``run(backend, call, arrays, **options)`` is the rest of the call flow,
    with the arrays already placed by the backend. Between the two the
    framework refuses outputs that share memory with anything else, from
    what ``parameters`` say each operand is (``ops.framework.binding.execute``).
    ``results`` names what the op returns: one name returns one array,
    several a tuple, none returns None. ``docs`` holds the public docstring
    of each binding ("cupy", "emulate", "reference"). ``outputs(call,
    **sizes)`` gives the shape and dtype of each output the op allocates
    when the caller passes none, from the call record alone (and compress's
    data-dependent ``total_pools``). ``extras`` are the options only one
    binding takes (the reference's ``accumulate``). ``dynamic_sizes`` names
    the sizes ``outputs`` takes that only the data decides, each with its
    upper bound from the call record, or None where the call record fixes
    the size itself (``outputs`` then gets None for it; the scorer's
    ``max_pools``). ``conditional_results`` are results
    returned after ``results`` only when a bool option is set (expand's
    ``counts`` with ``compact``), each with that option's name. ``kernel`` is
    the kernel the op launches (what ``kpool-cupy ptx --op`` compiles).
    ``gradient`` declares the op differentiable and names its backward
    (``Gradient``); None: no gradient (a frontend refuses to differentiate).
    For the developer tools that build a variant without a call (``kpool-cupy
    ptx``, the SASS report): ``large_launch(head_dim)``, the geometry of the
    op's (main) kernel over a batch that fills its blocks,
    ``large_dynamic_shared(head_dim, mma)``, the dynamic shared memory a block
    of it takes at the engines' shape (64 heads, a token a block; ``mma``: the
    scorer's path, ``kernel.declarations.MMA_*``), and
    ``check_head_dim(name, head_dim)``, the head_dim rule of its kernel beyond
    every kernel's (a multiple of 8 up to MAX_HEAD_DIM; None: no more).
    ``example(batch)``: a small valid call, (args, kwargs), from the arrays of
    an ``ops.framework.examples.ExampleBatch``; what the op tests and the
    torch samples run. ``scratch_bytes(call)``: the bytes of its scratch
    operand a call needs, where a frontend may make it uninitialized (the
    backward's partial sums; None: the op makes its own).
    """

    name: str
    parameters: tuple[Parameter, ...]
    results: tuple[str, ...]
    check_args: Callable[[CallArgs], Any]
    run: Callable[..., Any]
    docs: Mapping[str, str]
    outputs: Callable[..., dict[str, OutputShape]]
    extras: Mapping[str, tuple[Option, ...]] = field(default_factory=dict)
    dynamic_sizes: Mapping[str, Callable[[Any], int]] = field(default_factory=dict)
    conditional_results: Mapping[str, str] = field(default_factory=dict)
    kernel: Kernel | None = None
    gradient: Gradient | None = None
    large_launch: Callable[[int], LaunchGeometry] = groups_launch
    large_dynamic_shared: Callable[[int, int], int] = lambda head_dim, mma: 0
    check_head_dim: Callable[[str, int], None] | None = None
    example: Callable[[Any], tuple[tuple[Any, ...], dict[str, Any]]] | None = None
    scratch_bytes: Callable[[Any], int] | None = None

    @functools.cached_property
    def operands(self) -> tuple[Operand, ...]:
        return tuple(p for p in self.parameters if isinstance(p, Operand))

    @functools.cached_property
    def operand_names(self) -> tuple[str, ...]:
        """The operands' names in parameter order: the order a bound function gathers them in."""
        return tuple(o.name for o in self.operands)

    @functools.cached_property
    def formed(self) -> tuple[Operand, ...]:
        """The operands that take an engine's form (``engine_forms``): all ``read_forms`` needs to visit."""
        return tuple(o for o in self.operands if o.form)

    @property
    def options(self) -> tuple[Option, ...]:
        return tuple(p for p in self.parameters if isinstance(p, Option))

    def named(self, arrays: tuple[Any, ...]) -> dict[str, Any]:
        """A call's arrays, in parameter order, by operand name."""
        return dict(zip(self.operand_names, arrays, strict=True))

    def check(self, arrays: Mapping[str, Any], options: Mapping[str, Any]) -> Any:
        """The call record of a call's arrays by name and its options (``check_args``)."""
        return self.check_args(CallArgs(**arrays, **options))

    def describe(self, arrays: tuple[Any, ...], options: Mapping[str, Any]) -> Any:
        """The call record from the arrays in parameter order (or their metadata): what a framework that
        traces shapes (torch's fake tensors) needs, with ``outputs``."""
        return self.check(read_forms(self.formed, self.named(arrays), BEFORE_CHECKS)[0], options)
