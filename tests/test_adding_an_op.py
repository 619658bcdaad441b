"""docs/architecture.md's "Adding an op" checklist, held against every op of the op list.

The checklist names each place an op must appear; this test reads the
names from the page and checks each op in each place, so the page and the
code cannot drift: a place the page gains without a check here fails, and so
does an op missing from any place.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import re
from pathlib import Path

import pytest
from garbage import garbage_ops
from validation_tables import read_tables

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


@functools.cache
def _leaf_specs() -> tuple[OpSpec, ...]:
    """Every spec a leaf op module defines (``SPEC``, ``FP8_SPEC``), whether the op list has it or not."""
    found = []
    for info in pkgutil.iter_modules(kpool_cupy.ops.__path__):
        if info.ispkg:
            continue
        module = importlib.import_module(f"kpool_cupy.ops.{info.name}")
        found += [value for name, value in vars(module).items() if name.endswith("SPEC") and isinstance(value, OpSpec)]
    return tuple(found)


def _short(spec: OpSpec) -> str:
    return spec.name.removeprefix("kpool_")


def _kernel(spec: OpSpec) -> bool:
    source = (kernels_dir() / spec.kernel.source).read_text()
    return re.search(rf"__global__[^;{{]*?\b{spec.kernel.name}\(", source, flags=re.S) is not None


def _op(spec: OpSpec) -> bool:
    """A leaf op module defines the spec, with its kernel and its example call."""
    defined = any(found is spec for found in _leaf_specs())
    return defined and spec.kernel is not None and spec.example is not None


@functools.cache
def _garbage_ops() -> frozenset[str]:
    return frozenset(garbage_ops())


def _garbage(spec: OpSpec) -> bool:
    return spec.name in _garbage_ops()


def _mentions(path: str):
    return lambda spec: re.search(rf"\b{spec.name}\b", (ROOT / path).read_text()) is not None


_OP_NAME = re.compile(r"\b(kpool_(?!cupy\b)[a-z_0-9]+|hadamard_quant_fp8)\b")


@functools.cache
def _validated() -> frozenset[str]:
    """The ops docs/validation.md has rows for: those its tables' ``function`` column names, and a one-op
    section's op (the first op its text names)."""
    text = (ROOT / "docs" / "validation.md").read_text()
    names = set()
    for section, rows in read_tables(text).items():
        functions = {row.function for row in rows if row.function}
        if functions:
            names |= {f if f.startswith("hadamard") else f"kpool_{f}" for f in functions}
        else:
            body = text[text.index(section) :]
            names.add(_OP_NAME.search(body[: body.index("\n|")]).group(1))
    return frozenset("hadamard_quant_fp8" if n == "hadamard_quant" else n for n in names)


def _own_tests(spec: OpSpec) -> list[Path]:
    """The test files an op owns: named ``test_<op>*.py`` where no longer op name fits (test_compress_fp8.py is
    the FP8 form's, not compress's)."""
    shorts = [_short(s) for s in OPS]
    owned = []
    for path in (ROOT / "tests").glob("test_*.py"):
        fitting = [s for s in shorts if path.stem == f"test_{s}" or path.stem.startswith(f"test_{s}_")]
        if fitting and max(fitting, key=len) == _short(spec):
            owned.append(path)
    return owned


# Each checklist place: does the op appear there?
PLACES = {
    "kernel": _kernel,
    "declaration": lambda spec: spec.kernel in KERNELS,
    "op": _op,
    "op list": lambda spec: spec in OPS,
    "def": lambda spec: spec.name in functions.DEFINITIONS,
    "reference": lambda spec: spec.kernel.name in reference_backend._KERNELS,
    "check": lambda spec: _short(spec) in OP_CHECKS,
    "validation": lambda spec: spec.name in _validated(),
    "tests": lambda spec: bool(_own_tests(spec)),
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
    # The checks can fail: an op with another name and an undeclared kernel is in no place at all.
    kernel = dataclasses.replace(OPS[0].kernel, name="kpool_ghost")
    ghost = OpSpec("kpool_ghost", (), (), OPS[0].check_args, OPS[0].run, {}, OPS[0].outputs, kernel=kernel)
    assert [place for place, present in PLACES.items() if present(ghost)] == []


def test_an_op_owns_its_tests_by_the_longest_name_that_fits():
    names = {spec.name: {path.name for path in _own_tests(spec)} for spec in OPS}
    assert (
        "test_compress_fp8.py" in names["kpool_compress_fp8"] and "test_compress_fp8.py" not in names["kpool_compress"]
    )
    assert "test_tail_update_fp8.py" not in names["kpool_tail_update"]
