"""The FP8 ops as torch custom ops (issue 12 on issue 13's registration): rows, the cache forms, partners, compile.

CPU tensors run the NumPy reference on their own memory, so every result
here is compared with the reference bit for bit.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_torch_ops import BF16, F32, _same, _tensor, calls, fp8_cache  # noqa: E402

import kpool_cupy.torch as kt  # noqa: E402
from kpool_cupy import reference  # noqa: E402

FP8_OPS = ["kpool_compress_fp8", "kpool_ring_close_fp8", "kpool_tail_update_fp8"]


@pytest.fixture(autouse=True)
def _compile_afresh():
    import torch.compiler.config

    with torch.compiler.config.patch(force_disable_caches=True):  # see tests/test_torch_ops.py
        yield


@pytest.mark.parametrize("split", [False, True], ids=["one-ring", "split-ring"])
@pytest.mark.parametrize("name", FP8_OPS)
def test_writing_the_cache_equals_the_reference_and_leaves_the_rest(name, split):
    args, kwargs = calls(BF16 if not split else F32, split)[name]
    cache, table = fp8_cache()
    host = copy.deepcopy(args)
    want_cache = cache.copy()
    want = getattr(reference, name)(*host, **kwargs, cache=want_cache, block_table=table)
    assert not np.array_equal(want_cache, cache)  # the call wrote some pool
    tensors = tuple(_tensor(a) for a in args)
    got_cache = _tensor(cache)
    got = getattr(kt, name)(*tensors, **kwargs, cache=got_cache, block_table=_tensor(table))
    _same(got, want)  # closed (ring close, tail update) or None
    _same(got_cache, want_cache)


def test_the_cache_form_with_closed_given_writes_both():
    args, _ = calls(BF16)["kpool_tail_update_fp8"]
    cache, table = fp8_cache()
    want_cache = cache.copy()
    want_closed = reference.kpool_tail_update_fp8(*copy.deepcopy(args), cache=want_cache, block_table=table)
    closed = torch.full((2, 1), 7, dtype=torch.int32)
    got_cache = _tensor(cache)
    got = kt.kpool_tail_update_fp8(*map(_tensor, args), cache=got_cache, block_table=_tensor(table), closed=closed)
    assert got is closed
    _same(closed, want_closed)
    _same(got_cache, want_cache)


def test_rows_outputs_follow_their_partners():
    args, _ = calls(BF16)["kpool_ring_close_fp8"]
    want_values, want_scales, want_closed = reference.kpool_ring_close_fp8(*copy.deepcopy(args))
    closed = torch.zeros(2, dtype=torch.int32)
    values, scales, got_closed = kt.kpool_ring_close_fp8(*map(_tensor, args), closed=closed)  # values, scales made
    assert got_closed is closed
    _same((values, scales, got_closed), (want_values, want_scales, want_closed))
    out, out_scale = torch.zeros((2, 16), dtype=torch.uint8), torch.zeros(2, dtype=torch.float32)
    values, scales, _ = kt.kpool_ring_close_fp8(*map(_tensor, args), out=out, out_scale=out_scale)  # closed made
    assert values is out and scales is out_scale
    _same((values, scales), (want_values, want_scales))
    # One of values and scales alone: the reference's error, word for word.
    with pytest.raises(ValueError) as want:
        reference.kpool_ring_close_fp8(*copy.deepcopy(args), out=np.zeros((2, 16), np.uint8))
    with pytest.raises(ValueError) as got:
        kt.kpool_ring_close_fp8(*map(_tensor, args), out=torch.zeros((2, 16), dtype=torch.uint8))
    assert str(got.value) == str(want.value)


def test_an_output_made_to_follow_a_wrong_partner_is_refused_as_the_partner():
    # helper-58's finding: with out of the wrong rows, the wrapper made closed to match them, and the op refused
    # closed, which the caller never passed. The refusal now names out, as the reference names it.
    args, _ = calls(BF16)["kpool_tail_update_fp8"]
    wrong = np.zeros((2, 2, 16), np.uint8), np.zeros((2, 2), np.float32)  # a row a token; the step closes a pool
    with pytest.raises(ValueError) as want:
        reference.kpool_tail_update_fp8(*copy.deepcopy(args), out=wrong[0], out_scale=wrong[1])
    with pytest.raises(ValueError) as got:
        kt.kpool_tail_update_fp8(*map(_tensor, args), out=_tensor(wrong[0]), out_scale=_tensor(wrong[1]))
    assert str(want.value).startswith("Invalid out: ") and str(got.value) == str(want.value), got.value


def test_the_query_side_and_a_compiled_decode_step_equal_eager():
    # A decode step as an engine writes it: the keys into the FP8 cache, the
    # queries rotated and quantized; fullgraph, so no graph break hides a
    # Python fallback.
    args, _ = calls(BF16)["kpool_tail_update_fp8"]
    cache, table = fp8_cache()
    queries = torch.from_numpy(np.random.default_rng(3).standard_normal((2 * 4, 16)).astype(np.float32))

    def step(tail, k, gate, ape, positions, slots, cache, table, queries):
        closed = torch.ops.kpool.tail_update_fp8.cache(
            tail, k, gate, ape, positions, slots, cache=cache, block_table=table, validate=False
        )
        values, scales = torch.ops.kpool.hadamard_quant_fp8(queries)
        return closed, values, scales

    eager_cache, compiled_cache = _tensor(cache), _tensor(cache)
    eager_args = [[_tensor(args[0])], *map(_tensor, args[1:])]
    compiled_args = [[_tensor(args[0])], *map(_tensor, args[1:])]
    want = step(*eager_args, eager_cache, _tensor(table), queries)
    got = torch.compile(step, fullgraph=True)(*compiled_args, compiled_cache, _tensor(table), queries)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    assert torch.equal(compiled_cache, eager_cache) and not torch.equal(eager_cache, _tensor(cache))
    assert torch.equal(compiled_args[0][0], eager_args[0][0])  # the ring, written in place by both
    _same((want[1], want[2]), reference.hadamard_quant_fp8(queries.numpy()))


def test_row_forms_take_no_slots_or_block_table_and_tail_updates_cache_form_needs_its_table():
    # The schemas say what each overload takes: slots and a block table only
    # place pools in a cache, and tail update writes a cache through its
    # block table alone.
    import kpool_cupy.torch.registry  # noqa: F401  (defines torch.ops.kpool)

    kpool_cupy_torch_ops = torch.ops.kpool
    for name in ("compress_fp8", "ring_close_fp8", "tail_update_fp8"):
        op = getattr(kpool_cupy_torch_ops, name)
        for overload in ("default", "out"):
            arguments = {a.name for a in getattr(op, overload)._schema.arguments}
            assert not arguments & {"slots", "block_table"}, (name, overload, arguments)
        assert "block_table" in {a.name for a in op.cache._schema.arguments}
    table = next(a for a in kpool_cupy_torch_ops.tail_update_fp8.cache._schema.arguments if a.name == "block_table")
    assert str(table.type) == "Tensor" and not table.has_default_value()


@pytest.mark.parametrize(
    ("name", "given", "named"),
    [
        ("kpool_compress_fp8", {"slots": np.zeros(4, np.int64)}, "slots"),
        ("kpool_ring_close_fp8", {"block_table": np.zeros((2, 1), np.int32)}, "block_table"),
        ("kpool_tail_update_fp8", {"cache": "cache"}, "block_table"),
    ],
)
def test_a_placement_without_its_cache_or_a_cache_without_its_table_is_the_ops_error(name, given, named):
    args, kwargs = calls(BF16)[name]
    cache, _ = fp8_cache()
    given = {k: (cache if isinstance(v, str) else v) for k, v in given.items()}
    with pytest.raises(ValueError) as cpu:
        getattr(reference, name)(*copy.deepcopy(args), **kwargs, **given)
    with pytest.raises(ValueError) as on_torch:
        getattr(kt, name)(*(_tensor(a) for a in args), **kwargs, **{k: _tensor(v) for k, v in given.items()})
    assert str(on_torch.value) == str(cpu.value) and f"Invalid {named}" in str(cpu.value)


def test_a_string_for_a_bool_is_refused_by_the_torch_functions_too():
    args, kwargs = calls(BF16)["kpool_compress_fp8"]
    with pytest.raises(TypeError, match="Invalid round_scale: expected True or False"):
        kt.kpool_compress_fp8(*(_tensor(a) for a in args), **kwargs, round_scale="False")


def test_the_module_namespace_holds_no_stray_names():
    # dir(kpool_cupy.torch) showed a stray `annotations` (a __future__ import).
    assert "annotations" not in dir(kt)
