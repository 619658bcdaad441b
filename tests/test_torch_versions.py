"""The torch releases CI runs the torch tests on are the ends of the `torch` extra's range, and the `torch`
marker picks the tests that use torch (scripts/torch_versions.sh runs those)."""

from __future__ import annotations

import functools
import re
import types
from pathlib import Path

from conftest import _module_uses_torch, uses_torch

ROOT = Path(__file__).resolve().parent.parent


def _default_versions() -> list[str]:
    script = (ROOT / "scripts" / "torch_versions.sh").read_text()
    found = re.search(r'^versions="\$\{KPOOL_TORCH_VERSIONS-([^}]*)\}"$', script, re.MULTILINE)
    assert found, "scripts/torch_versions.sh sets its default releases in one line"
    return found.group(1).split()


def _release(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def test_ci_runs_the_torch_tests_on_the_extras_oldest_and_newest_release():
    extra = re.findall(r'^torch = \["torch([^"]*)"\]$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert len(extra) == 1, "one torch extra, one requirement (tomllib is Python 3.11's; the tests run on 3.10)"
    low, below = re.search(r">=\s*([\d.]+)", extra[0]), re.search(r"<\s*([\d.]+)", extra[0])
    assert low and below, f"the torch extra states both ends: {extra[0]}"
    versions = _default_versions()
    assert _release(versions[0]) == _release(low.group(1))
    newest, past = _release(versions[-1]), _release(below.group(1))
    assert (newest[0], newest[1] + 1) == past, f"{versions[-1]} is the newest release below {below.group(1)}"


def test_the_full_tier_runs_the_torch_versions_after_the_suite():
    script = (ROOT / "scripts" / "test.sh").read_text()
    suite = script.index("python -m pytest")
    assert script.index("torch_versions.sh", suite) > suite
    assert "bash scripts/test.sh --full" in (ROOT / ".ci" / "run").read_text()


def _item(function: types.FunctionType, **module_globals: object) -> types.SimpleNamespace:
    return types.SimpleNamespace(module=types.SimpleNamespace(**module_globals), function=function)


def _imports_torch():
    import pytest

    torch = pytest.importorskip("torch")
    return torch


def _imports_the_torch_ops():
    import kpool_cupy.torch as kt

    return kt


def _names_torch_in_a_string():
    return "torch.ops.kpool is registered by kpool_cupy.torch"


def test_the_torch_marker_takes_tests_that_import_torch_and_no_others():
    assert uses_torch(_item(_imports_torch))
    assert uses_torch(_item(_imports_the_torch_ops))
    assert not uses_torch(_item(_names_torch_in_a_string))
    held = types.ModuleType("torch")  # a module that imported torch at its top
    assert uses_torch(_item(_names_torch_in_a_string, torch=held))
    assert uses_torch(_item(_names_torch_in_a_string, kt=types.ModuleType("kpool_cupy.torch")))
    assert not uses_torch(_item(_names_torch_in_a_string, np=types.ModuleType("numpy")))


@functools.cache
def _model_through_a_cache():
    return _imports_torch()


def _builds_a_case():
    return _model_through_a_cache()


def _calls_a_helper_that_imports_torch():
    return _builds_a_case()


def _calls_a_helper_that_does_not():
    return _names_torch_in_a_string()


def test_a_test_whose_helpers_import_torch_or_whose_parameter_is_torchs_is_marked():
    # Left by the last review: tests/test_compress_backward.py's float64 torch model (reached through two helpers
    # and a functools.cache) and tests/test_public_functions.py's kpool_cupy.torch functions (parameters).
    helpers = {f.__name__: f for f in (_model_through_a_cache, _builds_a_case, _imports_torch)}
    helpers |= {"_names_torch_in_a_string": _names_torch_in_a_string}
    module = types.SimpleNamespace(__name__=__name__, **helpers)
    assert uses_torch(types.SimpleNamespace(module=module, function=_calls_a_helper_that_imports_torch))
    assert not uses_torch(types.SimpleNamespace(module=module, function=_calls_a_helper_that_does_not))
    parameter = types.FunctionType(_names_torch_in_a_string.__code__, {})
    parameter.__module__ = "kpool_cupy.torch.functions"
    callspec = types.SimpleNamespace(params={"function": parameter, "name": "kpool_compress"})
    assert uses_torch(types.SimpleNamespace(module=module, function=_calls_a_helper_that_does_not, callspec=callspec))
    callspec = types.SimpleNamespace(params={"function": _names_torch_in_a_string, "name": "kpool_compress"})
    assert not uses_torch(
        types.SimpleNamespace(module=module, function=_calls_a_helper_that_does_not, callspec=callspec)
    )


def test_a_module_about_torch_marks_all_its_tests(tmp_path):
    # A review's finding: a bare `pytest.importorskip("torch")` at a module's top binds no name, and a file
    # whose helpers import torch (test_bench_torch) held no test that did itself: neither was marked.
    top = tmp_path / "test_capture.py"
    top.write_text('import pytest\n\npytest.importorskip("torch")\n')
    helper = tmp_path / "test_rows.py"
    helper.write_text("def _helper():\n    import torch\n")
    named = tmp_path / "test_bench_torch.py"
    named.write_text("def _helper():\n    import torch\n")
    assert _module_uses_torch(str(top)) and _module_uses_torch(str(named))
    assert not _module_uses_torch(str(helper))
