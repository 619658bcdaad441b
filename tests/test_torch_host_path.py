"""torch.ops.kpool's CUDA kernels on a hot signature: its launch plan (kpool_cupy/torch/plans.py).

Run through the CuPy double (CuPy over NumPy, kernels on the emulator), CPU tensors standing in for CUDA ones,
as tests/test_torch_graph_capture.py runs them: what is measured is the package's own Python, calls counted
with sys.setprofile, never timed. A replay must give what the full path gives with new data at new addresses,
make torch's outputs afresh, and leave to the full path every call the full path would refuse.
"""

from __future__ import annotations

import textwrap

import pytest
from double import run_on_double

pytest.importorskip("torch")

TIMEOUT_S = 300  # a guard against a hang: a script takes seconds warm, up to a minute compiling its kernels

_SETUP = textwrap.dedent(
    """
    import copy, dataclasses, sys
    import numpy as np, torch, cupy
    sys.path.insert(0, "tests")
    import kpool_cupy
    from kpool_cupy.backends import cupy_plans
    from torch_on_double import op


    KPOOL, HEADS, D, TOPK = 2, 4, 64, 2
    table = torch.tensor([[1, 3], [0, 2]], dtype=torch.int32)  # 4 pages of 4 pooled keys
    offsets, lengths = torch.tensor([0, 3, 5], dtype=torch.int32), torch.tensor([5, 9], dtype=torch.int32)
    options = {"kpool": KPOOL, "pool_topk": TOPK, "always_select_tail": True, "validate": False}


    def inputs(seed):
        r = np.random.default_rng(seed)
        cache = r.integers(0, 0x7E, (4, 4, D + 4), dtype=np.uint8)
        cache.reshape(4, -1)[:, 4 * D :] = np.full((4, 4), 0.25, np.float32).view(np.uint8)
        return {
            "cache": torch.from_numpy(cache),
            "q": torch.from_numpy(r.integers(0, 0x7E, (5, HEADS, D), dtype=np.uint8)),
            "queries": torch.from_numpy(r.standard_normal((5 * HEADS, D)).astype(np.float32)),
            "weights": torch.from_numpy(r.standard_normal((5, HEADS)).astype(np.float32)),
        }


    def score_into(score, x, out, weights=None, validate=False):  # the scorer's .out overload on inputs x
        weights = x["weights"] if weights is None else weights
        score(x["q"], weights, x["cache"], table, offsets, lengths, kpool=KPOOL, max_pools=8, out=out,
              validate=validate)
    """
)


def _run(body: str) -> None:
    done = run_on_double(_SETUP + textwrap.dedent(body), timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ok" in done.stdout.split(), done.stdout[-3000:]


def test_a_hot_out_call_makes_at_most_5_python_calls_in_the_package():
    _run(
        """
        score = op("kpool_index_logits_fp8", "out")
        x = inputs(1)
        logits = torch.empty(5, 8)

        def call():
            score_into(score, x, logits)

        package = kpool_cupy.__path__[0]

        def counted():
            calls = []
            def profile(frame, event, arg):
                if event == "call" and frame.f_code.co_filename.startswith(package):
                    calls.append(f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}")
            sys.setprofile(profile)
            call()
            sys.setprofile(None)
            return calls

        first = counted()  # the full path, which makes the plan
        assert len(score.plans.plans) == 1
        (key, plan), = score.plans.plans.items()
        # The launch stubbed: only the package's own Python is left to count.
        score.plans.plans[key] = dataclasses.replace(
            plan, launch=dataclasses.replace(plan.launch, function=lambda *args, **keywords: None)
        )
        hot = counted()
        cupy_plans.forget_all()  # what a path switch calls (scripts/gpu_index_check.py): torch's plans go too
        assert not score.plans.plans
        print("calls", len(hot), hot, "full path", len(first))
        # 3 on 2026-12-07, 4 since the overlap rule is cupy_plans.may_overlap, shared with CuPy's plans.
        assert len(hot) <= 5, hot
        assert len(first) > 300, len(first)  # the counter sees the full path's calls
        print("ok")
        """
    )


def test_a_plan_gives_the_full_paths_bits_with_new_data_at_new_addresses_and_fresh_outputs():
    _run(
        """
        score, select = op("kpool_index_logits_fp8", "out"), op("kpool_index_select_fp8")
        quantize = op("hadamard_quant_fp8")
        workspace = torch.zeros(kpool_cupy.index_select_workspace_bytes(5, TOPK), dtype=torch.uint8)

        def step(x, logits):
            score_into(score, x, logits)
            chosen = select(x["q"], x["weights"], x["cache"], table, offsets, lengths, workspace=workspace, **options)
            return (logits, *chosen, *quantize(x["queries"], validate=False))

        first = step(inputs(1), torch.empty(5, 8))  # the full path: the plans made
        assert all(len(f.plans.plans) == 1 for f in (score, select, quantize))
        kept = [r.clone() for r in first]
        for seed in (2, 3):  # new data in new tensors: the plans' replays, then the full path's on the same
            fresh = inputs(seed)
            got = step(copy.deepcopy(fresh), torch.empty(5, 8))
            for f in (score, select, quantize):
                f.plans.forget_all()
            want = step(copy.deepcopy(fresh), torch.empty(5, 8))
            assert all(len(f.plans.plans) == 1 for f in (score, select, quantize))  # made again
            for a, b in zip(got, want, strict=True):
                assert torch.equal(a, b), seed
            assert not all(torch.equal(a, b) for a, b in zip(got, kept, strict=True))  # new data, new results
            # torch's outputs are made afresh: the first call's results are as they were.
            for a, b in zip(first, kept, strict=True):
                assert torch.equal(a, b)
            made = [(a, b) for a, b in zip(got[1:], first[1:], strict=True) if a.numel()]  # an empty one has no memory
            assert len(made) == 3 and all(a.data_ptr() != b.data_ptr() for a, b in made)

        # An output torch zeroes (rows the kernel leaves: compress's past the pools, total_pools 2 rows more).
        compress = op("kpool_compress")
        rows, cached = torch.tensor([0, 5, 11], dtype=torch.int32), torch.tensor([2, 7], dtype=torch.int32)
        pools = torch.from_numpy(np.asarray(kpool_cupy.pool_row_offsets(rows.numpy(), cached.numpy(), 4)))

        def pooled(seed):
            r = np.random.default_rng(seed)
            k, gate = (torch.from_numpy(r.standard_normal((11, 16)).astype(np.float32)) for _ in range(2))
            ape = torch.from_numpy(r.standard_normal((4, 16)).astype(np.float32))
            return compress(k, gate, ape, rows, cached, pool_row_offsets=pools, total_pools=int(pools[-1]) + 2,
                            validate=False)

        pooled(1)
        assert len(compress.plans.plans) == 1
        got = pooled(2)
        compress.plans.forget_all()
        assert torch.equal(got, pooled(2)) and not got[-2:].any()
        print("ok")
        """
    )


def test_a_hot_signature_leaves_what_the_full_path_refuses_to_it():
    _run(
        """
        score = op("kpool_index_logits_fp8", "out")
        x = inputs(1)
        buffer = torch.zeros(2 * 5 * 8)

        def call(weights, out):
            score_into(score, x, out, weights)

        # Weights and out in one buffer, apart: the plan is made, and a replay bumps out's version as torch's
        # in-place ops do.
        weights, out = buffer[:20].view(5, 4), buffer[40:].view(5, 8)
        call(weights, out)
        assert len(score.plans.plans) == 1
        before = out._version
        call(weights, out)
        assert out._version == before + 1, (before, out._version)

        # The same signature with out over the weights: the full path's refusal, naming out.
        weights[:] = torch.from_numpy(np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32))
        kept = buffer.clone()
        overlapping = buffer[16:56].view(5, 8)  # 16 * 4 bytes: 16-byte aligned, as out was
        try:
            call(weights, overlapping)
        except ValueError as error:
            assert "out" in str(error) and "sharing bytes" in str(error), error
        else:
            raise AssertionError("an out over the weights was launched")
        assert torch.equal(buffer, kept)  # nothing written

        # An out that requires grad, in grad mode: the full path's refusal, naming out.
        tracked = torch.zeros(5, 8, requires_grad=True)
        call(weights, tracked.detach())  # the plan of its signature
        try:
            call(weights, tracked)
        except ValueError as error:
            assert "out" in str(error) and "require" in str(error), error
        else:
            raise AssertionError("an out that requires grad was written")
        with torch.no_grad():
            call(weights, tracked)  # no grad mode: written, as the full path writes it
        print("ok")
        """
    )


def test_a_tensor_torch_negates_lazily_is_refused_plan_or_not():
    # helper-57's finding: the plan key read no negative bit, so after a plan a negated view (the imaginary part
    # of a conjugate, torch._neg_view) of the same layout replayed on its memory, which holds the values' negation,
    # where the full path failed in .numpy() with torch's RuntimeError. Now the key has the bit and the full
    # path refuses the tensor by name.
    _run(
        """
        score = op("kpool_index_logits_fp8", "out")
        x = inputs(1)
        plain = x["weights"]
        negated = torch._neg_view(-plain)  # the same values, their memory negated (as a conjugate's .imag is)
        assert negated.is_neg() and torch.equal(negated, plain) and negated.stride() == plain.stride()
        out = torch.zeros(5, 8)
        for _ in range(2):
            score_into(score, x, out, plain)
        assert len(score.plans.plans) == 1
        want = out.clone()
        for call in range(2):
            try:
                score_into(score, x, torch.zeros(5, 8), negated)
            except ValueError as error:
                assert str(error).startswith("Invalid weights: expected a tensor whose memory holds its values")
            else:
                raise AssertionError(f"a negated view was taken (call {call})")
        score_into(score, x, out, negated.resolve_neg())
        assert torch.equal(out, want)
        print("ok")
        """
    )


def test_a_torch_plan_is_kept_only_where_its_cupy_call_read_the_same_build():
    # helper-59's finding, torch's side: the torch key reads KPOOL_CUPY_SM90_BUILD, and the CuPy call it makes
    # reads it again; another thread's write between the two filed the CuPy plan of one build under a torch key
    # of the other. The write here lands right after the torch key is made (the double cannot load an sm_90a
    # cubin: the wgmma instance is built from source).
    _run(
        """
        import os
        from kpool_cupy.backends import cupy as backend
        from kpool_cupy.torch import plans as torch_plans

        built = backend.kernel_function
        backend.kernel_function = lambda source, name, device_id, sm90a=False: built(source, name, device_id, False)
        signature = torch_plans.signature

        def signed_then_switched(*args):
            key = signature(*args)
            os.environ["KPOOL_CUPY_SM90_BUILD"] = "sm_90a"  # another thread's write
            return key

        torch_plans.signature = signed_then_switched
        os.environ["KPOOL_CUPY_SM90_BUILD"] = "sm_90"
        score = op("kpool_index_logits_fp8", "out")
        score_into(score, inputs(1), torch.zeros(5, 8))
        (cupy_key, _), = cupy_plans._plans.items()
        assert cupy_key[-1] == "sm_90a", cupy_key[-1]
        assert not score.plans.plans, list(score.plans.plans)  # no torch plan under "sm_90" for it
        print("ok")
        """
    )


def test_a_call_whose_cupy_call_has_no_plan_has_none_of_torchs():
    _run(
        """
        score = op("kpool_index_logits_fp8", "out")
        x = inputs(1)
        logits = torch.empty(5, 8)
        for _ in range(2):  # validate=True reads the lengths back: no CuPy plan, so none of torch's
            score_into(score, x, logits, validate=True)
        assert not score.plans.plans
        # Compress sizes its result by the pools the data holds: CuPy reads the count back and makes the
        # array, and no plan replays that; told the count (total_pools), torch makes it, and a plan replays.
        compress = op("kpool_compress")
        r = np.random.default_rng(0)
        k, gate = (torch.from_numpy(r.standard_normal((11, 16)).astype(np.float32)) for _ in range(2))
        ape = torch.from_numpy(r.standard_normal((4, 16)).astype(np.float32))
        rows, cached = torch.tensor([0, 5, 11], dtype=torch.int32), torch.tensor([2, 7], dtype=torch.int32)
        pools = torch.from_numpy(np.asarray(kpool_cupy.pool_row_offsets(rows.numpy(), cached.numpy(), 4)))
        for _ in range(2):
            compress(k, gate, ape, rows, cached, pool_row_offsets=pools, validate=False)
        assert not compress.plans.plans
        for _ in range(2):
            compress(k, gate, ape, rows, cached, pool_row_offsets=pools, total_pools=int(pools[-1]), validate=False)
        assert len(compress.plans.plans) == 1
        print("ok")
        """
    )


def test_a_plan_launches_on_torchs_current_stream_through_the_real_stream_lookup():
    # kernels._launch_stream itself (every other test stubs it): torch's current stream's handle (here through
    # torch.cuda.current_stream, which a build without the raw call uses), one CuPy stream kept per handle, and
    # the plan's launch queued on that stream, not run on the null stream. Made by Stream.from_external: CuPy 14's
    # ExternalStream warns that it is deprecated (as the double's does), which is an error here.
    _run(
        """
        import warnings
        from types import SimpleNamespace
        from cupy import cuda
        from kpool_cupy.torch import kernels

        warnings.simplefilter("error", DeprecationWarning)

        def torch_stream(handle):
            return cuda.Stream.from_external(SimpleNamespace(__cuda_stream__=lambda: (0, handle)))

        import torch_on_double  # stubbed both stream lookups: the plan's is put back
        kernels._launch_stream = torch_on_double.real_launch_stream

        # torch's current stream as a CUDA build gives its handle (some CPU builds have the raw call too, whose
        # CUDA state they lack), and as torch.cuda.current_stream does (the lookup's other branch, below).
        handle = [0x5000]
        torch._C._cuda_getCurrentRawStream = lambda device_id: handle[0]
        torch.cuda.current_stream = lambda device=None: SimpleNamespace(cuda_stream=handle[0] + 0x100)
        kernels._torch_stream = lambda device: torch_stream(handle[0])  # the full call on it too
        score = op("kpool_index_logits_fp8", "out")
        x = inputs(1)
        logits = torch.zeros(5, 8)

        def call():
            score_into(score, x, logits)

        call()
        torch_stream(handle[0]).synchronize()
        want = logits.clone()
        logits.zero_()
        assert len(score.plans.plans) == 1
        call()  # the plan's launch
        assert cuda.launch_log[-1][1:] == (0x5000, "queued"), cuda.launch_log[-1]
        assert not logits.any()  # queued on torch's stream, not run on the null stream
        torch_stream(handle[0]).synchronize()
        assert torch.equal(logits, want)
        first = kernels._launch_stream(0)
        assert first is kernels._launch_stream(0) and first.ptr == 0x5000 and first.device_id == 0
        handle[0] = 0x6000
        assert kernels._launch_stream(0).ptr == 0x6000
        del torch._C._cuda_getCurrentRawStream  # a build without the raw call: torch.cuda.current_stream's handle
        assert kernels._launch_stream(0).ptr == 0x6100
        print("ok")
        """
    )
