"""docs/architecture.md's "Adding an op" checklist, held against every op of the op list.

The checklist names each place an op must appear; this test reads the
names from the page and checks each op in each place, so the page and the
code cannot drift: a place the page gains without a check here fails, and so
does an op missing from any place.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest
from garbage import garbage_ops

import kpool_cupy.ops
from kpool_cupy import functions
from kpool_cupy.backends import reference as reference_backend
from kpool_cupy.kernel.declarations import KERNELS
from kpool_cupy.kernel.sources import kernels_dir
from kpool_cupy.ops import OPS
from kpool_cupy.ops.framework.spec import OpSpec
from kpool_cupy.tools.op_checks import OP_CHECKS

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"


def _checklist() -> dict[str, str]:
    """The checklist's places: their names and the paths the page gives for them."""
    text = PAGE.read_text()
    section = text[text.index("## Adding an op\n") :]
    section = section[: section.index("\n## ", 1)]
    return dict(re.findall(r"^\d+\. \*\*([a-z ]+)\*\* `([^`]+)`", section, flags=re.M))


def _leaf_specs() -> list[OpSpec]:
    """Every spec a leaf op module defines (``SPEC``, ``FP8_SPEC``), whether the op list has it or not."""
    found = []
    for info in pkgutil.iter_modules(kpool_cupy.ops.__path__):
        if info.ispkg:
            continue
        module = importlib.import_module(f"kpool_cupy.ops.{info.name}")
        found += [value for name, value in vars(module).items() if name.endswith("SPEC") and isinstance(value, OpSpec)]
    return found


def _short(spec: OpSpec) -> str:
    return spec.name.removeprefix("kpool_")


def _kernel(spec: OpSpec) -> bool:
    source = (kernels_dir() / spec.kernel.source).read_text()
    return re.search(rf"__global__[^;{{]*?\b{spec.kernel.name}\(", source, flags=re.S) is not None


def _op(spec: OpSpec) -> bool:
    """A leaf op module defines the spec, with its kernel and its example call."""
    defined = any(found is spec for found in _leaf_specs())
    return defined and spec.kernel is not None and spec.example is not None


_GARBAGE: set[str] = set()


def _garbage(spec: OpSpec) -> bool:
    if not _GARBAGE:
        _GARBAGE.update(garbage_ops())
    return spec.name in _GARBAGE


def _mentions(path: str):
    return lambda spec: re.search(rf"\b{spec.name}\b", (ROOT / path).read_text()) is not None


# Each checklist place: does the op appear there?
PLACES = {
    "kernel": _kernel,
    "declaration": lambda spec: spec.kernel in KERNELS,
    "op": _op,
    "op list": lambda spec: spec in OPS,
    "def": lambda spec: spec.name in functions.DEFINITIONS,
    "reference": lambda spec: spec.kernel.name in reference_backend._KERNELS,
    "check": lambda spec: _short(spec) in OP_CHECKS,
    "validation": _mentions("docs/validation.md"),
    "tests": lambda spec: any((ROOT / "tests").glob(f"test_{_short(spec)}*.py")),
    "garbage": _garbage,
    "readme": _mentions("README.md"),
    "changelog": _mentions("CHANGELOG.md"),
}


def test_the_checklist_names_exactly_the_places_this_test_checks():
    assert set(_checklist()) == set(PLACES)
    assert len(_checklist()) <= 12, "adding an op should touch at most 12 files"


def test_every_op_module_spec_is_in_the_op_list():
    # The op list can only be checked against the modules: a spec that no
    # list names would be missing from every public module.
    assert {spec.name for spec in _leaf_specs()} == {spec.name for spec in OPS}


@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
def test_every_op_is_in_every_place_of_the_checklist(spec, place):
    assert PLACES[place](spec), f"{spec.name} is missing from {place} ({_checklist()[place]})"


def test_a_missing_op_is_seen():
    # The checks can fail: an op with another name is in none of the places that name it.
    ghost = OpSpec("kpool_ghost", (), (), OPS[0].check_args, OPS[0].run, {}, OPS[0].outputs, kernel=OPS[0].kernel)
    missing = [place for place, present in PLACES.items() if not present(ghost)]
    assert set(missing) >= {"op list", "def", "check", "validation", "tests", "garbage", "readme", "changelog"}
