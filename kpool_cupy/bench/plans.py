"""The bare launch behind a hot call: the floor the host costs are measured against (GPU only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def plan_launch(spec: Any, operands: dict[str, Any], options: dict[str, Any]) -> Callable[[], None] | str:
    """The launch kpool_cupy's plan makes for this call, as a bare CuPy launch, or why there is none.

    The plan (kpool_cupy.backends.cupy_plans) was made by an earlier call with
    the same signature; calling ``plan.function(plan.grid, plan.block, args,
    shared_mem=plan.shared_bytes)`` directly is the floor CuPy itself sets for
    this launch.
    """
    import cupy

    from ..backends import cupy_plans
    from ..backends.cupy import build_read, plan_key

    arrays = tuple(operands.get(operand.name) for operand in spec.operands)
    values = {option.name: options.get(option.name, option.default) for option in spec.options}
    plan = cupy_plans._plans.get(plan_key(spec, arrays, values, cupy.ndarray, build_read(spec)))
    if plan is None:
        return "no launch plan for this call's signature"
    pairs = zip(plan.slots, plan.constants, strict=True)
    args = tuple(arrays[slot] if slot >= 0 else constant for slot, constant in pairs)

    def launch() -> None:
        plan.function(plan.grid, plan.block, args, shared_mem=plan.shared_bytes)

    return launch
