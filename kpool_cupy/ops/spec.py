"""What an op is: its parameters, its call flow, and the launches it asks a backend to run.

An op module (compress, ring close, seed tail, tail update, expand top-k)
builds one ``OpSpec``. Its ``run`` is the call flow every backend shares:
check the arguments into a call record, check array contents when asked,
size and allocate the outputs, and hand ``Launch`` records to the backend.
A backend only places memory and runs launches (``Backend``); the public
functions are bound from the spec (``ops.binding``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..kernel.geometry import LaunchGeometry


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
    """

    name: str
    rule: str
    optional: bool = False
    written: bool = False
    pair: bool = False
    replaces: tuple[str, ...] = ()


REQUIRED = object()  # an Option without a default: keyword-only and required


@dataclass(frozen=True)
class Option:
    """A keyword-only scalar parameter, such as ``validate`` or ``kpool``."""

    name: str
    annotation: str
    default: Any = REQUIRED


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

VALIDATE = Option("validate", "bool", True)


@dataclass(frozen=True)
class Launch:
    """One kernel launch an op asks for.

    ``kernel`` is the kernel template's name and ``instance`` its
    instantiation in ``source`` (a file under kernels/); ``arguments`` is the
    tuple in the kernel's parameter order, scalars as NumPy scalars of the
    exact C++ width. ``call`` and ``operands`` (the arrays by operand name)
    are for backends that run the kernel another way: the NumPy reference.
    """

    kernel: str
    source: str
    instance: str
    geometry: LaunchGeometry
    arguments: tuple[Any, ...]
    call: Any
    operands: Mapping[str, Any]


class Backend(Protocol):
    """What an op's call flow needs from a backend: memory and launches, nothing about ops."""

    def host_copies(self, arrays: list[Any]) -> list[np.ndarray]:
        """Host int64 copies of small index arrays, in one transfer where that matters."""
        ...

    def from_host(self, array: np.ndarray) -> Any: ...

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any: ...

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any: ...

    def launch(self, launch: Launch) -> None: ...


@dataclass(frozen=True)
class OpSpec:
    """One op, described once.

    ``parameters`` are in signature order: required operands (positional),
    then keyword-only operands and options. ``run(backend, arrays, **options)``
    is the call flow, with ``arrays`` the operands in parameter order, already
    placed by the backend. ``results`` names what it returns: one name
    returns one array, several a tuple, none returns None. ``docs`` holds the
    public docstring of each binding ("cupy", "emulate", "reference").
    ``outputs(call, **sizes)`` gives the shape and dtype of each output the op
    allocates when the caller passes none, from the call record alone (and
    compress's data-dependent ``total_pools``). ``describe(arrays, options)``
    runs the op's argument checks alone (metadata only: no values, no
    overlap) and returns the call record ``outputs`` takes: what a framework
    that traces shapes (torch's fake tensors) needs. ``extras`` are the
    options only one binding takes (the reference's ``accumulate``).
    ``dynamic_sizes`` names the sizes ``outputs`` takes that only the data
    decides, each with its upper bound from the call record.
    """

    name: str
    parameters: tuple[Parameter, ...]
    results: tuple[str, ...]
    run: Callable[..., Any]
    docs: Mapping[str, str]
    outputs: Callable[..., dict[str, OutputShape]]
    describe: Callable[[tuple[Any, ...], Mapping[str, Any]], Any]
    extras: Mapping[str, tuple[Option, ...]] = field(default_factory=dict)
    dynamic_sizes: Mapping[str, Callable[[Any], int]] = field(default_factory=dict)

    @functools.cached_property
    def operands(self) -> tuple[Operand, ...]:
        return tuple(p for p in self.parameters if isinstance(p, Operand))

    @functools.cached_property
    def operand_names(self) -> tuple[str, ...]:
        """The operands' names in parameter order: the order ``run`` receives them in."""
        return tuple(o.name for o in self.operands)

    @property
    def options(self) -> tuple[Option, ...]:
        return tuple(p for p in self.parameters if isinstance(p, Option))
