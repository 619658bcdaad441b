"""``out=`` and ``counts=`` on the ops that expand selections (expand top-k, the top-k, the fused select): the
caller's arrays are written and returned, on every backend and through torch, and a call with them, its
workspace and ``validate=False`` on the GPU path replays one launch and makes nothing."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from double import run_on_double

from kpool_cupy import emulate, ops, reference
from kpool_cupy.ops.framework.examples import example_batch

SPECS = {spec.name: spec for spec in ops.OPS if spec.name in ("kpool_expand_topk", "kpool_index_topk",
                                                              "kpool_index_select_fp8")}  # fmt: skip
BACKENDS = [reference, emulate]
TIMEOUT_S = 120  # a guard against a hang; the script runs in a few seconds


def _call(name: str, compact: bool) -> tuple[tuple, dict]:
    """The op's example call (tests own copies), with ``compact``."""
    args, kwargs = SPECS[name].example(example_batch())
    return tuple(a.copy() for a in args), dict(kwargs, compact=compact)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__.rpartition(".")[2])
@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("compact", [False, True], ids=["positions", "compact"])
def test_given_outputs_are_written_and_returned(backend, name, compact):
    args, kwargs = _call(name, compact)
    function = getattr(backend, name)
    want = function(*args, **kwargs)
    want = want if compact else (want,)
    out = np.full(want[0].shape, -7, np.int32)  # every element written, or a -7 shows
    given = {"out": out} | ({"counts": np.full(want[1].shape, -7, np.int32)} if compact else {})
    got = function(*args, **kwargs, **given)
    got = got if compact else (got,)
    assert all(g is a for g, a in zip(got, given.values(), strict=True))  # the caller's own arrays
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    if compact:  # out alone: the call makes the counts
        alone = function(*args, **kwargs, out=np.full(want[0].shape, -7, np.int32))
        np.testing.assert_array_equal(alone[1], want[1])


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__.rpartition(".")[2])
@pytest.mark.parametrize("name", list(SPECS))
def test_bad_outputs_are_refused_naming_them(backend, name):
    args, kwargs = _call(name, True)
    function = getattr(backend, name)
    positions, counts = function(*args, **kwargs)
    rows, width = positions.shape
    ok = {"out": np.zeros_like(positions), "counts": np.zeros_like(counts)}
    read_only = np.zeros_like(positions)
    read_only.flags.writeable = False
    cases = [
        ({**ok, "out": ok["out"].astype(np.int64)}, TypeError, "^Invalid out: expected dtype int32, got int64"),
        ({**ok, "out": ok["out"][:, :-1]}, ValueError, rf"^Invalid out: expected shape \[{rows}, {width}\]"),
        ({**ok, "out": np.zeros((width, rows), np.int32).T}, ValueError, "^Invalid out: expected a C-contiguous"),
        ({**ok, "out": read_only}, ValueError, "^Invalid out: expected a writable array"),
        ({**ok, "counts": ok["counts"][:-1]}, ValueError, rf"^Invalid counts: expected shape \[{rows}\]"),
        ({"counts": ok["counts"]}, ValueError, "^Invalid counts: expected None without out"),
    ]
    for given, error, message in cases:
        with pytest.raises(error, match=message):
            function(*args, **kwargs, **given)
    with pytest.raises(ValueError, match=r"^Invalid counts: expected None without compact=True"):
        function(*args, **dict(kwargs, compact=False), **ok)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__.rpartition(".")[2])
def test_an_out_that_overlaps_an_input_is_refused(backend):
    args, kwargs = _call("kpool_expand_topk", False)
    ids = args[0]
    width = backend.kpool_expand_topk(*args, **kwargs).shape[1]
    buffer = np.zeros(ids.size + ids.shape[0] * width, np.int32)
    buffer[: ids.size] = ids.reshape(-1)
    shared_ids = buffer[: ids.size].reshape(ids.shape)
    out = buffer[ids.size - 1 : ids.size - 1 + ids.shape[0] * width].reshape(ids.shape[0], width)  # one id shared
    with pytest.raises(ValueError, match=r"^Invalid out: "):
        backend.kpool_expand_topk(shared_ids, *args[1:], **kwargs, out=out)


def test_torch_ops_take_the_outputs_and_make_the_missing_counts():
    torch = pytest.importorskip("torch")
    import kpool_cupy.torch as kt

    args, kwargs = _call("kpool_index_topk", True)
    tensors = [torch.from_numpy(a) for a in args]
    want = reference.kpool_index_topk(*args, **kwargs)
    out = torch.full(tuple(want[0].shape), -7, dtype=torch.int32)
    got = kt.kpool_index_topk(*tensors, **kwargs, out=out)  # compact, out alone: counts made beside it
    assert got[0] is out and np.array_equal(out.numpy(), want[0]) and np.array_equal(got[1].numpy(), want[1])
    plain = dict(kwargs, compact=False)
    out = torch.full(tuple(want[0].shape), -7, dtype=torch.int32)
    torch.ops.kpool.index_topk.out(*tensors, **plain, out=out)  # the .out overload: counts optional
    assert np.array_equal(out.numpy(), reference.kpool_index_topk(*args, **plain))
    with pytest.raises(ValueError, match=r"^Invalid counts: expected None without out"):  # the op's own words
        kt.kpool_index_topk(*tensors, **kwargs, counts=torch.zeros(len(want[1]), dtype=torch.int32))
    compiled = torch.compile(
        lambda *t: kt.kpool_index_topk(*t, **kwargs, out=torch.empty_like(out)), backend="aot_eager", fullgraph=True
    )
    got = compiled(*tensors)
    assert np.array_equal(got[0].numpy(), want[0]) and np.array_equal(got[1].numpy(), want[1])


def test_a_decode_step_with_its_outputs_replays_one_launch_and_allocates_nothing():
    # On the GPU path (the CuPy double: CuPy over NumPy, kernels on the emulator): the fused select with out,
    # counts, a workspace and validate=False makes a plan on its first call; the next calls, with new data
    # at the same signature, replay it: nothing is allocated and the results are the full path's.
    script = textwrap.dedent(
        """
        import numpy as np, cupy
        import kpool_cupy
        from kpool_cupy import emulate
        from kpool_cupy.backends import cupy_plans
        from kpool_cupy.ops.framework.examples import example_batch

        kwargs = {"kpool": 2, "pool_topk": 1, "always_select_tail": True, "compact": True}
        scoring = [cupy.asarray(a) for a in example_batch().scoring]
        want = emulate.kpool_index_select_fp8(*example_batch().scoring, **kwargs)
        workspace = cupy.zeros(kpool_cupy.index_select_workspace_bytes(len(want[1]), 1), cupy.uint8)
        out, counts = cupy.empty(want[0].shape, cupy.int32), cupy.empty(want[1].shape, cupy.int32)
        given = {"out": out, "counts": counts, "workspace": workspace, "validate": False}
        got = kpool_cupy.kpool_index_select_fp8(*scoring, **kwargs, **given)
        assert got[0] is out and got[1] is counts and len(cupy_plans._plans) == 1
        used = cupy.get_default_memory_pool().used_bytes()
        for seed in (1, 2):
            batch = example_batch(seed=seed).scoring
            again = [cupy.asarray(a) for a in batch]  # new data at new addresses, made before the call
            used = cupy.get_default_memory_pool().used_bytes()
            got = kpool_cupy.kpool_index_select_fp8(*again, **kwargs, **given)
            assert cupy.get_default_memory_pool().used_bytes() == used, "the call allocated"
            want = emulate.kpool_index_select_fp8(*batch, **kwargs)
            assert np.array_equal(np.asarray(out), want[0]) and np.array_equal(np.asarray(counts), want[1])
        assert len(cupy_plans._plans) == 1, cupy_plans._plans.keys()
        print("ok")
        """
    )
    done = run_on_double(script, timeout=TIMEOUT_S)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-3000:] + done.stderr[-3000:]
