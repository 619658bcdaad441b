"""The public modules' ``.pyi`` stubs say what the modules export, with the ops' real signatures.

The ops are bound at import from the op list, so editors and type checkers
learn them from the stubs alone; a stub left behind by a new op, keyword or
default would mislead them silently.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import replace

import pytest

from kpool_cupy.tools.stubs import MODULES, stub_path, stub_text


@pytest.mark.parametrize("module_name", MODULES)
def test_stub_is_the_one_written_from_the_module(module_name):
    if module_name.endswith(".torch"):
        pytest.importorskip("torch")
    assert stub_path(module_name).read_text() == stub_text(module_name), (
        f"{stub_path(module_name)} is stale: run python -m kpool_cupy.tools.stubs"
    )


@pytest.mark.parametrize("module_name", MODULES)
def test_stub_defines_every_export_and_each_op_with_its_parameters(module_name):
    if module_name.endswith(".torch"):
        pytest.importorskip("torch")
    module = importlib.import_module(module_name)
    tree = ast.parse(stub_path(module_name).read_text())
    defined = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined[node.name] = node
        elif isinstance(node, ast.AnnAssign):
            defined[node.target.id] = node
        elif isinstance(node, ast.ImportFrom):
            defined.update({alias.asname or alias.name: node for alias in node.names if node.module is None})
    assert set(module.__all__) <= set(defined), set(module.__all__) - set(defined)
    for name in module.__all__:
        if name.startswith("kpool_") or name == "hadamard_quant_fp8":
            node = defined[name]
            listed = [a.arg for a in [*node.args.args, *node.args.kwonlyargs]]
            assert listed == list(importlib.import_module(module_name).__dict__[name].__signature__.parameters)


def test_a_stale_stub_is_seen(monkeypatch):
    # The comparison can fail: an op that gains an option changes the text.
    import kpool_cupy
    from kpool_cupy.backends.cupy import BINDING
    from kpool_cupy.ops import OPS
    from kpool_cupy.ops.binding import bind
    from kpool_cupy.ops.spec import Option

    spec = OPS[0]
    grown = replace(spec, parameters=(*spec.parameters, Option("brand_new", "bool", False)))
    monkeypatch.setattr(kpool_cupy, spec.name, bind(grown, BINDING))
    assert stub_text("kpool_cupy") != stub_path("kpool_cupy").read_text()
