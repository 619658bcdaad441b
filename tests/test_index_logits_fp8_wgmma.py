"""The scorer's sm_90a path (kp::kMmaWgmma), emulated: garbage lands where the mma.sync path puts it, and the
tensor-core layout it relies on is the one the tests break."""

from __future__ import annotations

import numpy as np
import pytest
from garbage import index_garbage_cases

from kpool_cupy import emulate, reference
from kpool_cupy.backends.host import EMULATE_MMA_VARIABLE, emulated_tensor_core
from kpool_cupy.kernel.declarations import MMA_E4M3, MMA_E4M3_HMMA, MMA_F16, MMA_WGMMA


def _logits(monkeypatch, path: str, case: dict) -> np.ndarray:
    monkeypatch.setenv(EMULATE_MMA_VARIABLE, path)
    return emulate.kpool_index_logits_fp8(**case, validate=False)


# slow: its ~35 s are compiles of both paths' variants (the default tier's budget). The default tier still scores
# garbage on the wgmma path: the fused select's garbage agreement (tests/test_garbage_agreement.py, wgmma-0).
@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_garbage_writes_what_the_mma_sync_path_writes(monkeypatch, seed):
    # Garbage offsets, lengths, tables past the cache, random cache bytes and unaligned queries, without
    # validation (tests/garbage.py): the wgmma path writes the same -inf, NaN and infinities as the mma.sync path
    # and the reference (at these seeds every token of every case sees nothing: the rows are -inf; near-valid
    # garbage, which scores, is tests/test_index_logits_fp8_requests.py's, run on both paths), and reads nothing
    # outside its arrays (the sanitized run in tests/test_emulator_build.py).
    for i, (_, case) in enumerate(index_garbage_cases(seed, 40)):
        got = _logits(monkeypatch, "wgmma", dict(case, out=None if case.get("out") is None else case["out"].copy()))
        other = _logits(monkeypatch, "e4m3", dict(case, out=None if case.get("out") is None else case["out"].copy()))
        want = reference.kpool_index_logits_fp8(**dict(case, out=None), validate=False)
        label = f"seed {seed} case {i}"
        for special in (np.isneginf, np.isposinf, np.isnan):
            np.testing.assert_array_equal(special(got), special(other), err_msg=f"{label} {special.__name__}")
            np.testing.assert_array_equal(special(got), special(want), err_msg=f"{label} {special.__name__}")


def test_the_emulated_path_is_named_by_the_environment(monkeypatch):
    monkeypatch.delenv(EMULATE_MMA_VARIABLE, raising=False)
    assert emulated_tensor_core() == MMA_E4M3  # what sm_89 and newer run
    paths = (("e4m3", MMA_E4M3), ("f16", MMA_F16), ("hmma", MMA_E4M3_HMMA), ("wgmma", MMA_WGMMA), ("", MMA_E4M3))
    for value, mma in paths:
        monkeypatch.setenv(EMULATE_MMA_VARIABLE, value)
        assert emulated_tensor_core() == mma
    monkeypatch.setenv(EMULATE_MMA_VARIABLE, "sm_90a")
    expected = r"Invalid KPOOL_CUPY_EMULATE_MMA: expected one of e4m3, f16, hmma, wgmma.*'sm_90a'"
    with pytest.raises(ValueError, match=expected):
        emulated_tensor_core()
