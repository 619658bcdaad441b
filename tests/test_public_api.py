"""The public functions keep the signatures and docstrings they had before the op-spec redesign.

tests/data/public_api.json was written from the package before the op specs
existed. Later issues may add keyword-only parameters with defaults; nothing
recorded there may be removed, renamed or reordered. A docstring or an
annotation that changes on purpose (a new keyword documented; the array
types of issue 20) is updated in the file by hand.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import pytest

RECORDED = json.loads((Path(__file__).parent / "data" / "public_api.json").read_text())
FUNCTIONS = sorted(name for name in RECORDED if name != "__all__")


def _function(qualified: str):
    module, _, name = qualified.rpartition(".")
    return importlib.import_module(module), getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("qualified", FUNCTIONS)
def test_signature_keeps_every_recorded_parameter_in_order(qualified):
    _, function = _function(qualified)
    signature = inspect.signature(function)
    now = {p.name: p for p in signature.parameters.values()}
    recorded = RECORDED[qualified]["parameters"]
    assert [name for name in now if name in {r[0] for r in recorded}] == [r[0] for r in recorded], qualified
    for name, kind, default, annotation in recorded:
        p = now[name]
        got_default = None if p.default is p.empty else repr(p.default)
        assert (p.kind.name, got_default, p.annotation) == (kind, default, annotation), (qualified, name)
    for name, p in now.items():  # additions: keyword-only, with a default
        if name not in {r[0] for r in recorded}:
            assert p.kind is p.KEYWORD_ONLY and p.default is not p.empty, (qualified, name)
    assert signature.return_annotation == RECORDED[qualified]["returns"]


@pytest.mark.parametrize("qualified", FUNCTIONS)
def test_docstring_is_the_recorded_one(qualified):
    _, function = _function(qualified)
    assert inspect.getdoc(function) == RECORDED[qualified]["doc"]


@pytest.mark.parametrize("qualified", FUNCTIONS)
def test_help_names_the_public_module(qualified):
    module, function = _function(qualified)
    assert function.__name__ == qualified.rpartition(".")[2]
    if qualified.rpartition(".")[2].startswith("kpool_"):  # the ops, bound from their specs
        assert function.__module__ == module.__name__


@pytest.mark.parametrize("qualified", FUNCTIONS)
def test_tools_that_read_functions_can_read_these(qualified):
    # Sphinx, beartype and torch's schema inference resolve the annotations;
    # debuggers and inspect read the source.
    import typing

    _, function = _function(qualified)
    hints = typing.get_type_hints(function)
    assert set(hints) == {*inspect.signature(function).parameters, "return"}
    assert inspect.getsource(function)


def test_every_recorded_public_name_is_still_exported():
    for module_name, names in RECORDED["__all__"].items():
        module = importlib.import_module(module_name)
        assert set(names) <= set(module.__all__), module_name
        for name in names:
            assert hasattr(module, name), (module_name, name)


def test_a_wrong_call_fails_like_a_plain_function():
    import numpy as np

    from kpool_cupy import reference

    k = np.zeros((4, 8), np.float32)
    with pytest.raises(TypeError, match=r"kpool_compress\(\) missing 1 required positional argument: 'ape'"):
        reference.kpool_compress(k, k, input_row_offsets=np.array([0, 4]), cache_lengths=np.array([0]))
    with pytest.raises(TypeError, match="takes 5 positional arguments"):
        reference.kpool_compress(k, k, k[:4], np.array([0, 4]), np.array([0]), None)
    with pytest.raises(TypeError, match="unexpected keyword argument 'stream'"):
        reference.kpool_compress(k, k, k[:4], np.array([0, 4]), np.array([0]), stream=None)


@pytest.mark.parametrize("qualified", FUNCTIONS)
def test_every_public_function_says_what_it_raises(qualified):
    _, function = _function(qualified)
    doc = inspect.getdoc(function)
    assert "\nRaises\n------\n" in doc and "ValueError" in doc.split("\nRaises\n------\n")[1], qualified
