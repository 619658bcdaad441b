"""Every public function is a plain ``def`` in a ``.py`` file of the package, and each op's def is its spec.

The ops are defined once in kpool_cupy/functions.py and bound to each
backend by copying the def (``ops.framework.binding.bind``); what a reader, an editor
or a type checker opens is that def. These tests hold the defs against the
specs, so a def that drops, reorders or misroutes an argument fails here.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import kpool_cupy
from kpool_cupy import functions
from kpool_cupy.backends import cupy as gpu_backend
from kpool_cupy.backends import emulate as emulate_backend
from kpool_cupy.backends import reference as reference_backend
from kpool_cupy.ops import OPS
from kpool_cupy.ops.framework.binding import BackendOptions, Binding, bind
from kpool_cupy.ops.framework.spec import Operand

PACKAGE = Path(kpool_cupy.__file__).resolve().parent
MODULES = ("kpool_cupy", "kpool_cupy.emulate", "kpool_cupy.reference", "kpool_cupy.torch")


def _public_modules():
    """The public modules, kpool_cupy.torch where torch is installed."""
    for module_name in MODULES:
        if not module_name.endswith(".torch") or importlib.util.find_spec("torch") is not None:
            yield importlib.import_module(module_name)


def _public_functions():
    return [
        pytest.param(getattr(module, name), name, id=f"{module.__name__}.{name}")
        for module in _public_modules()
        for name in module.__all__
        # a partial or a callable object is kept, and fails below
        if callable(getattr(module, name)) and not inspect.isclass(getattr(module, name))
    ]


@pytest.mark.parametrize(("function", "name"), _public_functions())
def test_every_public_function_is_a_def_of_its_name_in_a_py_file_of_the_package(function, name):
    assert inspect.isfunction(function), type(function)
    source = Path(inspect.getsourcefile(function)).resolve()
    assert source.suffix == ".py" and PACKAGE in source.parents, source
    (node,) = ast.parse(inspect.getsource(function)).body
    assert isinstance(node, ast.FunctionDef) and node.name == name


def test_every_op_has_one_def_and_the_public_modules_bind_them_all():
    assert list(functions.DEFINITIONS) == [spec.name for spec in OPS]
    assert sorted(functions.__all__) == sorted(functions.DEFINITIONS)
    for module in _public_modules():
        for name in functions.DEFINITIONS:
            bound = getattr(module, name)
            assert bound is not functions.DEFINITIONS[name] and bound.__code__ is functions.DEFINITIONS[name].__code__


def test_a_def_called_directly_names_the_modules_that_bind_it():
    with pytest.raises(RuntimeError, match=r"kpool_cupy\.reference"):
        functions.kpool_compress(*[None] * 5)


class _Recorded(Exception):
    """What the recording binding raises, with what the def handed on."""


def _recording_binding(name: str) -> Binding:
    def call(spec, arrays, options, extras):
        raise _Recorded(spec.named(arrays), options, extras)

    return Binding(name, "kpool_cupy.recorded", "object", "object", options=(), call=call)


@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
def test_each_def_hands_every_argument_on_under_its_own_name(spec):
    # A distinct marker per parameter: a def that passed out for closed, or
    # left an option out of its dict, hands on the wrong marker or none.
    recorded = bind(functions.DEFINITIONS[spec.name], _recording_binding("reference"))
    markers = {p.name: f"<{p.name}>" for p in spec.parameters}
    positional = [markers[o.name] for o in spec.operands if not o.optional]
    keyword = {name: marker for name, marker in markers.items() if marker not in positional}
    extras = {o.name: f"<{o.name}>" for o in spec.extras.get("reference", ())}
    with pytest.raises(_Recorded) as seen:
        recorded(*positional, **keyword, **extras)
    arrays, options, given = seen.value.args
    assert arrays == {o.name: markers[o.name] for o in spec.operands}
    assert options == {o.name: markers[o.name] for o in spec.options}
    assert given == extras


def test_a_def_that_differs_from_its_spec_is_refused_when_bound():
    # The binding check can fail: a def missing a parameter, one with a
    # default the spec does not have, one without **backend_options.
    def kpool_compress(k, gate, ape, input_row_offsets, cache_lengths, *, pool_row_offsets=None, out=None,
                       validate=True, out_dtype=None, **backend_options): ...  # fmt: skip

    with pytest.raises(ValueError, match=r"kpool_compress.*parameter 9: want \*, rotate=False, got none"):
        bind(kpool_compress, gpu_backend.BINDING, OPS[0])

    def kpool_expand_topk(pool_ids, input_row_offsets, cache_lengths, *, kpool=4, always_select_tail=False,
                          validate=True, block_table=None, block_size=None, compact=False,
                          **backend_options): ...  # fmt: skip

    expand = next(s for s in OPS if s.name == "kpool_expand_topk")
    with pytest.raises(ValueError, match=r"parameter 3: want \*, kpool, got \*, kpool=4"):
        bind(kpool_expand_topk, gpu_backend.BINDING, expand)

    def kpool_seed_tail(tail, k, gate, input_row_offsets, cache_lengths, slot_idx, *, validate=True, kpool=None): ...

    seed = next(s for s in OPS if s.name == "kpool_seed_tail")
    with pytest.raises(ValueError, match=r"\*\*backend_options last"):
        bind(kpool_seed_tail, gpu_backend.BINDING, seed)


def test_the_backend_keywords_a_type_checker_knows_are_the_backends_own():
    declared = {o.name for b in (gpu_backend.BINDING, emulate_backend.BINDING, reference_backend.BINDING)
                for o in b.options}  # fmt: skip
    declared |= {o.name for spec in OPS for extra in spec.extras.values() for o in extra}
    assert set(typing.get_type_hints(BackendOptions)) == declared


def test_a_bound_copy_refuses_another_backends_keyword_as_a_plain_function_would():
    import numpy as np

    k = np.zeros((4, 8), np.float32)
    with pytest.raises(TypeError, match=r"kpool_compress\(\) got an unexpected keyword argument 'stream'"):
        kpool_cupy.reference.kpool_compress(k, k, k[:4], np.array([0, 4]), np.array([0]), stream=None)
    with pytest.raises(TypeError, match=r"kpool_compress\(\) got an unexpected keyword argument 'accumulate'"):
        kpool_cupy.emulate.kpool_compress(k, k, k[:4], np.array([0, 4]), np.array([0]), accumulate="float64")


def test_every_operand_is_an_array_parameter_of_its_def():
    # The defs' annotations are what a type checker reads: an operand is an
    # Array (or a pair of them), never a bare Any.
    for spec in OPS:
        annotations = functions.DEFINITIONS[spec.name].__annotations__
        for p in spec.parameters:
            if isinstance(p, Operand):
                assert annotations[p.name].startswith("Array"), (spec.name, p.name, annotations[p.name])


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
host = np.zeros(1)
kpool_cupy.kpool_compress(x, x, x, x, x, stream=None)
kpool_cupy.kpool_ring_close((x, x), x, x, x, x, x, x, out=x)
kpool_cupy.reference.kpool_compress(host, host, host, host, host, accumulate="float64")
values, scales, closed = kpool_cupy.reference.kpool_tail_update_fp8(host, host, host, host, host, host)
kpool_cupy.kpool_compress(1, x, x, x, x)  # error: not an array
kpool_cupy.kpool_tail_update_fp8(x, x, x, x, x, x, cache=[1])  # error: not an array
kpool_cupy.reference.kpool_compress(host, host, host, host, host, validat=False)  # error: no such keyword
kpool_cupy.reference.kpool_compress(host, host, host, host, host, accumulate=64)  # error: not a str
kpool_cupy.kpool_compress(x, x, x, x, x, rotate="yes")  # error: not a bool
kpool_cupy.kpool_expand_topk(x, x, x)  # error: kpool is required
"""


def test_a_type_checker_reads_the_defs(tmp_path):
    # What a type checker can tell from one def serving every backend: what is
    # an array at all, every keyword's name and type, what is required. Which
    # array type a backend takes and what it returns each binding says at run
    # time (inspect.signature), not to the checker.
    pytest.importorskip("mypy")
    user = tmp_path / "user.py"
    user.write_text(USER_CODE)
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--no-incremental", "--no-error-summary", str(user)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard: 7 s here
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    flagged = sorted({int(line.split(":")[1]) for line in errors if line.startswith(str(user))})
    marked = [number for number, line in enumerate(USER_CODE.splitlines(), 1) if "# error" in line]
    assert len(marked) == 6 and flagged == marked, done.stdout + done.stderr


def test_a_backend_keyword_without_a_default_is_required_as_a_plain_function_would_require_it():
    # No backend has one today; the caller must still refuse a call without it, not pass the sentinel on.
    import dataclasses

    from kpool_cupy.ops.framework.spec import REQUIRED, Option

    seen = []
    binding = dataclasses.replace(_recording_binding("reference"), options=(Option("device_index", "int", REQUIRED),))
    bound = bind(functions.DEFINITIONS["hadamard_quant_fp8"], binding)
    with pytest.raises(
        TypeError, match=r"hadamard_quant_fp8\(\) missing 1 required keyword-only argument: 'device_index'"
    ):
        bound("<x>")
    with pytest.raises(_Recorded) as recorded:
        bound("<x>", device_index=3)
    seen.append(recorded.value.args[2])
    assert seen == [{"device_index": 3}]
