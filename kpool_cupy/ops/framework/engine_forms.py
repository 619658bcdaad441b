"""Arrays as engines hold them, taken as the arrays the checks and kernels read (``Operand.form``).

- ``E4M3``: e4m3fn values typed ``float8_e4m3fn`` (ml_dtypes' for NumPy, torch's) are read as their bytes,
  a uint8 view of the same memory: the ops read and write e4m3fn bytes either way.
- ``PAGED_CACHE``: DeepGEMM's paged FP8 cache ``[num_blocks, block_size, 1, head_dim + 4]`` is read as this
  package's ``[num_blocks, block_size, head_dim + 4]``: the same bytes (each page's values, then its float32
  scales), its unit axis dropped by a view. The checks see the caller's 4-D array, so a refusal shows the
  shape and strides the caller passed (``BEFORE_CHECKS`` / ``AFTER_CHECKS``); the kernels read the view.

A given output typed float8 comes back as the caller's own array, not the view.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from ...dtypes import FLOAT8_E4M3FN, UINT8

E4M3 = "e4m3"
PAGED_CACHE = "paged_cache"
FORMS = (E4M3, PAGED_CACHE)
BEFORE_CHECKS = (E4M3,)  # the checks read e4m3fn values as their bytes
AFTER_CHECKS = (PAGED_CACHE,)  # the checks read the caller's 4-D cache (``fp8_target.check_cache_layout``)


class Formed(Protocol):
    """What this module reads of an operand (``spec.Operand``, which imports this module)."""

    name: str
    form: str


def read_form(operand: Formed, array: Any, byte_dtype: Any = UINT8, forms: tuple[str, ...] = FORMS) -> Any:
    """``array`` as the op reads it: a view where ``operand.form`` takes an engine's form (one of ``forms``),
    else itself. ``array`` is a NumPy or CuPy array, or a torch tensor with ``byte_dtype`` torch.uint8."""
    if array is None or operand.form not in forms or isinstance(array, (tuple, list)):
        return array
    if operand.form == E4M3 and str(array.dtype).rpartition(".")[2] == FLOAT8_E4M3FN.name:
        return array.view(byte_dtype)
    if operand.form == PAGED_CACHE and array.ndim == 4 and array.shape[2] == 1:
        return array[:, :, 0, :]
    return array


def read_forms(
    operands: Iterable[Formed], named: Mapping[str, Any], forms: tuple[str, ...] = FORMS
) -> tuple[dict[str, Any], dict[int, Any]]:
    """Every operand in its read form (of ``forms``), and the array behind each view made (by the view's id)."""
    read = dict(named)
    behind = {}
    for operand in operands:
        given = named[operand.name]
        read[operand.name] = view = read_form(operand, given, forms=forms)
        if view is not given:
            behind[id(view)] = given
    return read, behind


def given_back(result: Any, behind: dict[int, Any]) -> Any:
    """``result`` with each view ``read_forms`` made in place of the caller's array (an output written in place
    comes back as the array the caller gave)."""
    if not behind:
        return result
    if isinstance(result, tuple):
        return tuple(behind.get(id(r), r) for r in result)
    return behind.get(id(result), result)
