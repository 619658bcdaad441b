"""The op specs: what each declares holds for what it does, and a keyword is one edit to a spec."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

from kpool_cupy import emulate, reference
from kpool_cupy.backends import cupy as gpu_backend
from kpool_cupy.backends import emulate as emulate_backend
from kpool_cupy.backends import reference as reference_backend
from kpool_cupy.functions import call_backend, definition
from kpool_cupy.ops import COMPRESS, OPS
from kpool_cupy.ops.compress_backward import partials_shape
from kpool_cupy.ops.families.split_selection import workspace_bytes
from kpool_cupy.ops.framework.binding import bind, execute
from kpool_cupy.ops.framework.examples import example_batch, named
from kpool_cupy.ops.framework.spec import Operand, Option
from kpool_cupy.ops.index_select_fp8 import select_splits
from kpool_cupy.ops.index_topk import topk_splits

BINDINGS = (gpu_backend.BINDING, emulate_backend.BINDING, reference_backend.BINDING)

# The working memory an op with a scratch operand allocates when the caller gives none.
# What a call allocates when no workspace is given: its own need (the public sizings cover smaller batches too).
SCRATCH_BYTES = {
    "kpool_index_select_fp8": lambda call: workspace_bytes(
        call.num_tokens, select_splits(call.num_tokens, call.pool_topk), call.pool_topk
    ),
    "kpool_index_topk": lambda call: workspace_bytes(
        call.num_tokens, topk_splits(call.num_tokens, call.logits_width, call.pool_topk), call.pool_topk
    ),
}


def _calls():
    """One small valid call per op, as keyword arguments of the reference function: each op's own example."""
    batch = example_batch()
    return {spec.name: named(spec.operand_names, spec.example(batch)) for spec in OPS}


def _dynamic_sizes(spec, call, allocated: tuple[int, ...]) -> dict[str, int]:
    """The sizes only the data decides (``spec.dynamic_sizes``), read back from the first output the run
    allocated: the value among its dims for which the spec's ``outputs`` gives that shape."""
    sizes = {}
    for name in spec.dynamic_sizes:
        fits = [
            n for n in set(allocated) if tuple(next(iter(spec.outputs(call, **{name: n}).values()))[0]) == allocated
        ]
        assert len(fits) == 1, (spec.name, name, allocated, fits)
        sizes[name] = fits[0]
    return sizes


@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
def test_run_allocates_exactly_the_declared_outputs(spec):
    # A shape-only (fake) implementation will size outputs from spec.outputs
    # and the call record alone, so run may allocate nothing else.
    arguments = _calls()[spec.name]
    recorded = {}

    class Recording(reference_backend.ReferenceBackend):
        def empty(self, shape, dtype):
            recorded.setdefault("allocated", []).append((tuple(shape), np.dtype(dtype)))
            return super().empty(shape, dtype)

        zeros = empty

    arrays = tuple(arguments.get(o.name) for o in spec.operands)
    options = {o.name: arguments.get(o.name, o.default) for o in spec.options}
    execute(spec, Recording(), arrays, options)
    call = spec.describe(arrays, options)  # the checks alone give the record the shapes come from
    sizes = _dynamic_sizes(spec, call, recorded["allocated"][0][0]) if spec.dynamic_sizes else {}
    declared = [(tuple(s), np.dtype(d)) for s, d in spec.outputs(call, **sizes).values()]
    if any(o.scratch for o in spec.operands) and spec.name in SCRATCH_BYTES:  # the selections' zeroed workspace
        scratch = SCRATCH_BYTES[spec.name](call)
        declared += [((scratch,), np.dtype(np.uint8))] if scratch else []
    if spec.name == "kpool_compress_backward":  # d ape's block partials, working memory of the call's own
        declared.append(partials_shape(call, arguments["grad_pooled"].shape[0]))  # a row a pool
    assert recorded.get("allocated", []) == declared


@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
def test_results_name_what_the_function_returns(spec):
    result = getattr(reference, spec.name)(**_calls()[spec.name])
    if not spec.results:
        assert result is None
    elif len(spec.results) == 1:
        assert isinstance(result, np.ndarray)
    else:
        assert isinstance(result, tuple) and len(result) == len(spec.results)


@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
def test_required_operands_come_first_and_written_ones_are_arrays_the_op_writes(spec):
    kinds = [isinstance(p, Operand) and not p.optional for p in spec.parameters]
    assert kinds == sorted(kinds, reverse=True), spec.name  # all required operands before the rest
    written = {o.name for o in spec.operands if o.written}
    assert written <= {
        "out",
        "out_scale",
        "closed",
        "counts",
        "tail",
        "cache",
        "workspace",
        "grad_k",
        "grad_gate",
        "grad_ape",
    }


def test_a_keyword_added_to_a_spec_and_its_def_reaches_every_backend():
    # The worked example of docs/architecture.md, as a test: one Option in the
    # spec and one parameter in the op's def (kpool_cupy/functions.py), and
    # the GPU, emulate and reference functions all take it.
    seen = []

    def run(backend, call, arrays, *, scale, **options):
        seen.append(scale)
        return COMPRESS.run(backend, call, arrays, **options)

    scaled = dataclasses.replace(COMPRESS, parameters=(*COMPRESS.parameters, Option("scale", "float", 1.0)), run=run)

    def kpool_compress(k, gate, ape, input_row_offsets, cache_lengths, *, pool_row_offsets=None, out=None,
                       validate=True, out_dtype=None, rotate=False, total_pools=None, scale=1.0,
                       **backend_options):  # fmt: skip
        arrays = (k, gate, ape, input_row_offsets, cache_lengths, pool_row_offsets, out)
        options = {"validate": validate, "out_dtype": out_dtype, "rotate": rotate, "total_pools": total_pools,
                   "scale": scale}  # fmt: skip
        return call_backend(arrays, options, backend_options)

    for binding in BINDINGS:
        parameter = inspect.signature(bind(kpool_compress, binding, scaled)).parameters["scale"]
        assert parameter.kind is parameter.KEYWORD_ONLY and parameter.default == 1.0, binding.name
    arguments = _calls()["kpool_compress"]
    for module, binding in ((emulate, emulate_backend.BINDING), (reference, reference_backend.BINDING)):
        got = bind(kpool_compress, binding, scaled)(**arguments, scale=2.5)
        want = module.kpool_compress(**arguments)
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    assert seen == [2.5, 2.5]


def test_a_keyword_added_to_a_spec_alone_is_refused_when_bound():
    # The spec and the def are one edit: a spec that gains an option its def
    # lacks fails at import (bind), naming the option.
    scaled = dataclasses.replace(COMPRESS, parameters=(*COMPRESS.parameters, Option("scale", "float", 1.0)))
    with pytest.raises(ValueError, match=r"want \*, scale=1\.0, got none"):
        bind(definition(COMPRESS), reference_backend.BINDING, scaled)
