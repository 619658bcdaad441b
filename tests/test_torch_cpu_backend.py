"""``torch.ops.kpool`` on CPU tensors through the reference (the default) or the emulator, as chosen by
``kpool_cupy.torch.set_cpu_backend`` or ``KPOOL_CUPY_TORCH_CPU``."""

from __future__ import annotations

import numpy as np
import pytest
from index_cases import index_case

torch = pytest.importorskip("torch")

import kpool_cupy.torch as kt  # noqa: E402  (after the skip)
from kpool_cupy import emulate, reference  # noqa: E402
from kpool_cupy.torch.cpu_backend import CPU_BACKEND_VARIABLE  # noqa: E402


@pytest.fixture(autouse=True)
def _default_choice(monkeypatch):
    monkeypatch.delenv(CPU_BACKEND_VARIABLE, raising=False)
    kt.set_cpu_backend(None)
    yield
    kt.set_cpu_backend(None)


def _case():
    # 16 heads of head_dim 128: the emulator's float32 sums (the kernel's) and the reference's float64 ones round
    # apart somewhere, so the two backends are told apart by their bits.
    case = index_case(np.random.default_rng(3), heads=16, kpool=4, counts=(3, 9), cache_lengths=(40, 25))
    want = {m.__name__: m.kpool_index_logits_fp8(*case.args, kpool=4) for m in (reference, emulate)}
    assert not np.array_equal(want["kpool_cupy.reference"], want["kpool_cupy.emulate"])
    return [torch.from_numpy(a) for a in case.args], want


def _scores(args):
    return kt.kpool_index_logits_fp8(*args, kpool=4).numpy()


def test_the_reference_by_default_the_emulator_when_chosen_and_back():
    args, want = _case()
    assert kt.cpu_backend() == "reference"
    np.testing.assert_array_equal(_scores(args), want["kpool_cupy.reference"])
    kt.set_cpu_backend("emulate")
    assert kt.cpu_backend() == "emulate"
    np.testing.assert_array_equal(_scores(args), want["kpool_cupy.emulate"])
    kt.set_cpu_backend(None)
    np.testing.assert_array_equal(_scores(args), want["kpool_cupy.reference"])


def test_the_variable_chooses_and_the_function_overrides_it(monkeypatch):
    args, want = _case()
    monkeypatch.setenv(CPU_BACKEND_VARIABLE, "emulate")
    np.testing.assert_array_equal(_scores(args), want["kpool_cupy.emulate"])
    kt.set_cpu_backend("reference")
    np.testing.assert_array_equal(_scores(args), want["kpool_cupy.reference"])
    kt.set_cpu_backend(None)
    monkeypatch.setenv(CPU_BACKEND_VARIABLE, "gpu")
    with pytest.raises(ValueError, match=r"^Invalid KPOOL_CUPY_TORCH_CPU: expected one of reference, emulate"):
        _scores(args)
    with pytest.raises(ValueError, match=r"^Invalid name: expected one of reference, emulate, got 'cuda'"):
        kt.set_cpu_backend("cuda")


def test_a_compiled_step_follows_the_choice_when_it_runs():
    args, want = _case()
    compiled = torch.compile(_scores_tensor, backend="aot_eager", fullgraph=True)
    width = want["kpool_cupy.reference"].shape[1]
    np.testing.assert_array_equal(compiled(*args).numpy()[:, :width], want["kpool_cupy.reference"])
    kt.set_cpu_backend("emulate")
    np.testing.assert_array_equal(compiled(*args).numpy()[:, :width], want["kpool_cupy.emulate"])


def _scores_tensor(*args):
    return kt.kpool_index_logits_fp8(*args, kpool=4, max_pools=16)  # a fixed width: columns past a token's -inf
