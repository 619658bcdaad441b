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


USER_CODE = """
from typing import Any

import numpy as np

import kpool_cupy
import kpool_cupy.reference


class Interface:  # a device array as another framework hands it over
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {}


x = Interface()
kpool_cupy.kpool_compress(x, x, x, x, x)
kpool_cupy.kpool_ring_close((x, x), x, x, x, x, x, x, out=x)
kpool_cupy.reference.kpool_compress(*[np.zeros(1)] * 5)
kpool_cupy.kpool_compress(1, x, x, x, x)  # error: not an array
kpool_cupy.reference.kpool_compress(x, *[np.zeros(1)] * 4)  # error: not a NumPy array
kpool_cupy.kpool_tail_update_fp8(x, x, x, x, x, x, cache=[1])  # error: not an array
# What a call returns follows how it is called: a cache form, expand's compact.
host = np.zeros(1)
values, scales, closed = kpool_cupy.reference.kpool_tail_update_fp8(host, host, host, host, host, host)
closed = kpool_cupy.reference.kpool_tail_update_fp8(host, host, host, host, host, host, cache=host, block_table=host)
print(closed.shape)
kpool_cupy.reference.kpool_compress_fp8(host, host, host, host, host, cache=host, slots=host).shape  # error: None
positions, counts = kpool_cupy.reference.kpool_expand_topk(host, host, host, kpool=4, compact=True)
print(kpool_cupy.reference.kpool_expand_topk(host, host, host, kpool=4).shape)
kpool_cupy.reference.kpool_expand_topk(host, host, host, kpool=4, compact=True).shape  # error: a tuple
"""


def test_a_type_checker_tells_device_arrays_from_anything_else(tmp_path):
    # The GPU path takes an object with CUDA's array interface or DLPack
    # (kpool_cupy.arrays.DeviceArray); the CPU backends NumPy arrays.
    pytest.importorskip("mypy")
    import subprocess
    import sys
    from pathlib import Path

    user = tmp_path / "user.py"
    user.write_text(USER_CODE)
    root = Path(__file__).resolve().parents[1]
    stubs = [str(stub_path(name)) for name in MODULES if not name.endswith(".torch")]  # their overloads too
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--follow-imports=silent",
            "--no-incremental",
            "--no-error-summary",
            str(user),
            *stubs,
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard: 7 s here
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    flagged = sorted({int(line.split(":")[1]) for line in errors if line.startswith(str(user))})
    marked = [number for number, line in enumerate(USER_CODE.splitlines(), 1) if "# error" in line]
    assert len(marked) == 5 and flagged == marked, done.stdout + done.stderr
    assert all(line.startswith(str(user)) for line in errors), done.stdout  # nothing wrong in the stubs
