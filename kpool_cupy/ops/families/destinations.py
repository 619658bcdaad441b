"""Where a pool-writing op's pooled rows go: typed rows, or FP8 bytes and scales into rows or a paged cache.

compress, ring close and tail update each pool some rows and hand them to a
destination; the destination decides the kernel of the family that writes
there, the outputs to allocate, the checks of ``validate=True`` on where
each pool lands, and its share of the launch (values, template, VECTOR
bit). So an op's ``_fp8`` form is the same op with ``Fp8Rows`` in place of
``PooledRows`` (``ops/families/fp8_form.py``), and a new destination is one class
here, not a copy of three ops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ...dtypes import FLOAT32
from ...kernel import codes
from ...kernel.declarations import Kernel
from ..framework.checks import fail
from ..framework.spec import Backend
from .fp8_target import ROWS, SLOTS, UINT8, Fp8Placement, check_destinations, sink_template, sink_values, sink_vector

# Which pools a call writes, for the checks of where they land (host arrays):
# each one's index into slots (its output row, or its request for ring
# close), its request and its pool number q.
Landing = tuple[np.ndarray, np.ndarray, np.ndarray]


class Destination(Protocol):
    """What a pool-writing op asks of where its pooled rows go."""

    kernel: Kernel  # the kernel of the op's family that writes here

    def allocates(self, arrays: dict[str, Any]) -> bool:
        """Whether ``allocate`` makes outputs (the caller gave none)."""
        ...

    def allocate(self, backend: Backend, arrays: dict[str, Any], shape: tuple[int, ...], zeroed: bool) -> None:
        """Put the outputs the caller left out into ``arrays``: pooled rows ``shape`` (``[..., head_dim]``)."""
        ...

    def room(self, arrays: dict[str, Any]) -> int | None:
        """How many pools the outputs have room for; None when any number lands (a block table)."""
        ...

    def check_landing(self, backend: Backend, arrays: dict[str, Any], landing: Callable[[], Landing]) -> None:
        """With validate=True: every pool written lands where the destination allows."""
        ...

    def launch_values(self, arrays: dict[str, Any]) -> dict[str, Any]: ...

    def launch_template(self, arrays: dict[str, Any]) -> dict[str, Any]: ...

    def results(self, arrays: dict[str, Any]) -> tuple[Any, ...]:
        """What the call returns for its pooled rows, before the op's other results."""
        ...


@dataclass(frozen=True)
class PooledRows:
    """Pooled rows in ``out_dtype`` into ``out`` (``rotate``: each pool's Hadamard rotation)."""

    kernel: Kernel
    out_dtype: np.dtype
    rotate: bool

    def allocates(self, arrays: dict[str, Any]) -> bool:
        return arrays["out"] is None

    def allocate(self, backend: Backend, arrays: dict[str, Any], shape: tuple[int, ...], zeroed: bool) -> None:
        if arrays["out"] is None:
            arrays["out"] = (backend.zeros if zeroed else backend.empty)(shape, self.out_dtype)

    def room(self, arrays: dict[str, Any]) -> int | None:
        return int(arrays["out"].shape[0])

    def check_landing(self, backend: Backend, arrays: dict[str, Any], landing: Callable[[], Landing]) -> None:
        return None  # rows the op's own checks sized

    def launch_values(self, arrays: dict[str, Any]) -> dict[str, Any]:
        # The family's kernels take the rows, their stride and their count
        # as each needs them: the declaration lists which.
        out = arrays["out"]
        offered = {"pooled": out, "pooled_row_stride": codes.stride(out), "pooled_rows": out.shape[0]}
        return {p.name: offered[p.name] for p in self.kernel.params if p.name in offered}

    def launch_template(self, arrays: dict[str, Any]) -> dict[str, Any]:
        vector = codes.vector_mask(out=arrays["out"])
        return {"OT": self.out_dtype, "ROTATE": self.rotate, "VECTOR": vector}

    def results(self, arrays: dict[str, Any]) -> tuple[Any, ...]:
        return (arrays["out"],)


@dataclass(frozen=True)
class Fp8Rows:
    """Each pool's FP8 epilogue (kernels/kpool_fp8.cuh): e4m3fn bytes and a scale, into ``out``/``out_scale``
    rows or a paged cache through ``slots`` or ``block_table`` (``fp8_target``)."""

    kernel: Kernel
    target: Fp8Placement
    round_scale: bool

    def allocates(self, arrays: dict[str, Any]) -> bool:
        return not self.target.to_cache and arrays["out"] is None

    def allocate(self, backend: Backend, arrays: dict[str, Any], shape: tuple[int, ...], zeroed: bool) -> None:
        if self.allocates(arrays):
            make = backend.zeros if zeroed else backend.empty
            arrays["out"], arrays["out_scale"] = make(shape, UINT8), make(shape[:-1], FLOAT32)

    def room(self, arrays: dict[str, Any]) -> int | None:
        if self.target.kind == ROWS:
            return int(arrays["out"].shape[0])
        if self.target.kind == SLOTS:
            return int(arrays["slots"].shape[0])
        return None

    def check_landing(self, backend: Backend, arrays: dict[str, Any], landing: Callable[[], Landing]) -> None:
        """Every pool written lands in the cache, each in a slot of its own (``fp8_target.check_destinations``)."""
        if not self.target.to_cache:
            return
        rows, requests, pools = landing()
        if self.target.kind == SLOTS:
            slots = arrays["slots"]
            needed = int(rows.max()) + 1 if rows.size else 0
            if slots.shape[0] < needed:
                raise fail("slots", f"at least {needed} entries (one per pool written)", f"{slots.shape[0]} entries")
            check_destinations(self.target, backend.host_copies([slots[:needed]])[0], None, rows, requests, pools)
        else:
            table = arrays["block_table"]
            host = backend.host_copies([table.reshape(-1)])[0].reshape(table.shape)
            check_destinations(self.target, None, host, rows, requests, pools)

    def launch_values(self, arrays: dict[str, Any]) -> dict[str, Any]:
        return sink_values(self.target, arrays)

    def launch_template(self, arrays: dict[str, Any]) -> dict[str, Any]:
        vector = sink_vector(self.target, arrays)
        return sink_template(self.target, arrays) | {"VECTOR": vector, "ROUND_SCALE": self.round_scale}

    def results(self, arrays: dict[str, Any]) -> tuple[Any, ...]:
        return () if self.target.to_cache else (arrays["out"], arrays["out_scale"])


def into_pooled_rows(kernel: Kernel, pool_into: Callable[..., Any]) -> Callable[..., Any]:
    """The ``run`` of a plain pool-writing op: its flow (``pool_into``) with rows in the call's ``out_dtype``
    (``rotate``: rotated) as the destination."""

    def run(backend: Backend, call: Any, arrays: dict[str, Any], *, validate: bool, **options: Any) -> Any:
        to = PooledRows(kernel, call.out_dtype, call.rotate)
        return pool_into(backend, call, arrays, validate=validate, to=to)

    return run


def launch_template(source: dict[str, Any], destination: Destination, arrays: dict[str, Any]) -> dict[str, Any]:
    """A pool-writing launch's template: the source's (what is pooled) and the destination's, their VECTOR
    bits joined."""
    own = destination.launch_template(arrays)
    return source | own | {"VECTOR": int(source.get("VECTOR", 0)) | int(own.get("VECTOR", 0))}


def returned(destination: Destination, arrays: dict[str, Any], *others: Any) -> Any:
    """What a pool-writing op returns: the destination's results, then the op's others (closed); one value
    alone, None for none."""
    values = (*destination.results(arrays), *others)
    return None if not values else values[0] if len(values) == 1 else values
