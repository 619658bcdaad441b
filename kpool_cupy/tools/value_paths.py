"""A kernel's text with the path of a group of stored bfloat16 values holding a NaN cut out (kernels/
kpool_common.cuh's ``kp::pack_bf16x8``, which rounds a group without one by the hardware's instruction), so the
SASS of what remains is what a bench's finite data runs: ``scripts/bench_model.py`` counts it."""

from __future__ import annotations

from .scorer_paths import cut_once

NAN_GROUP = "if (!any_nan) {"


def finite_values_code(code: str) -> str:
    """``code`` (a whole kernel text, headers inlined) with every group of stored bfloat16 values taken to hold
    no NaN: a ValueError unless the text holds the statement exactly once (the header changed and the cut must
    follow it)."""
    return cut_once(code, NAN_GROUP, "if (true) {")
