"""The README's worked example runs on both CPU backends and asserts what it claims."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def example() -> str:
    text = README.read_text().split("## A whole request: chunked prefill, then decode", 1)[1]
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


@pytest.mark.parametrize("backend", ["emulate", "reference"])
def test_worked_example(backend):
    code = example().replace("kp = kpool_cupy.emulate", f"kp = kpool_cupy.{backend}")
    assert f"kpool_cupy.{backend}" in code
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)  # the example's own asserts check the pools
    assert len(namespace["pools"]) == 23 // 4


@pytest.mark.parametrize("backend", ["emulate", "reference"])
def test_the_example_runs_the_same_on_a_split_ring_with_float32_gate_scores(backend):
    # The README says swapping in a pair (key_ring, gate_ring) and float32 gates runs the same.
    code = example().replace("kp = kpool_cupy.emulate", f"kp = kpool_cupy.{backend}")
    split = "tail = (np.zeros((8, kpool, head_dim), ml_dtypes.bfloat16), np.zeros((8, kpool, head_dim), np.float32))"
    code = code.replace("tail = np.zeros((8, 2, kpool, head_dim), ml_dtypes.bfloat16)", split)
    gates = "gates = rng.standard_normal((length, head_dim)).astype(ml_dtypes.bfloat16)"
    code = code.replace(gates, "gates = rng.standard_normal((length, head_dim)).astype(np.float32)")
    code = code.replace("g = np.zeros_like(k)", "g = np.zeros((1, 2, head_dim), np.float32)")
    assert split in code and "astype(np.float32)" in code and "np.zeros((1, 2, head_dim), np.float32)" in code
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    assert len(namespace["pools"]) == 23 // 4
    assert namespace["tail"][1].dtype == np.float32 and namespace["tail"][1].any()  # the gate ring was written


def fp8_example() -> str:
    text = README.read_text().split("## An FP8 paged cache: prefill chunks, decode steps and the queries", 1)[1]
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


@pytest.mark.parametrize("backend", ["emulate", "reference"])
def test_the_fp8_cache_example(backend):
    code = fp8_example().replace("kp = kpool_cupy.emulate", f"kp = kpool_cupy.{backend}")
    assert f"kpool_cupy.{backend}" in code
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)  # its assert compares the whole cache
    cache, q_values, q_scales = namespace["cache"], namespace["q_values"], namespace["q_scales"]
    pages = namespace["table"][0]
    assert cache[pages].any() and not np.delete(cache, pages, axis=0).any()  # only the request's pages
    assert q_values.shape == (96, 64) and q_values.dtype == np.uint8 and q_scales.shape == (96,)
    logits = namespace["logits"]
    assert np.isfinite(logits[:, : namespace["visible"] - 1]).all()  # every token sees all but maybe the last


def indexer_example() -> str:
    text = README.read_text().split("## The indexer step: compress, quantize the queries, select", 1)[1]
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


@pytest.mark.parametrize("backend", ["emulate", "reference"])
def test_the_indexer_step_example(backend):
    code = indexer_example().replace("kp = kpool_cupy.emulate", f"kp = kpool_cupy.{backend}")
    assert f"kpool_cupy.{backend}" in code
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)  # its assert: the fused call equals the two calls
    slots, workspace = namespace["slots"], namespace["workspace"]
    assert slots.shape == (2, 256 * 4 + 3) and workspace.size > 0 and not workspace[:16].any()
    assert (slots[:, : 256 * 4] >= 0).all()  # 1,024 pools seen: 256 chosen, each slot in the KV table


def training_example() -> str:
    text = README.read_text().split("## Training: gradients through compress", 1)[1]
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def test_the_training_example():
    # CPU tensors: the NumPy reference forward and backward, compiled by inductor.
    pytest.importorskip("torch")
    import torch.compiler.config

    namespace: dict = {}
    with torch.compiler.config.patch(force_disable_caches=True):  # compile, not replay an older graph
        exec(compile(training_example(), str(README), "exec"), namespace)  # its asserts: dtypes, zero rows
    assert namespace["model"].ape.detach().any()  # trained from zeros
    assert namespace["k"].grad[3:].any()


def deep_gemm_example() -> str:
    text = README.read_text().split("### DeepGEMM's indexer calls", 1)[1]
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


@pytest.mark.parametrize("backend", ["reference", "emulate"])
def test_the_deep_gemm_example(backend):
    # CPU tensors: the reference (the default) and the emulator; its assert: DeepGEMM's call equals the native one.
    pytest.importorskip("torch")
    import kpool_cupy.torch as kt

    namespace: dict = {}
    kt.set_cpu_backend(backend)
    try:
        exec(compile(deep_gemm_example(), str(README), "exec"), namespace)
    finally:
        kt.set_cpu_backend(None)
    logits = namespace["logits"]
    assert logits.shape == (2, 320) and logits[:, :257].isfinite().all()
    assert namespace["kv_cache"][[3, 0, 4, 1, 2]].any()  # the prompt's pooled keys, in DeepGEMM's 4-D cache


def cupy_example() -> str:
    text = README.read_text().split("## CuPy\n", 1)[1]
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def test_the_cupy_example_runs_on_the_double_and_gives_the_references_pools():
    # The GPU path's Python as the README writes it, on the CuPy double (tests/cupy_double: its kernels on the
    # emulator); its pools against kpool_cupy.emulate on the same arrays, bit for bit: the same kernel on the
    # same emulator. (Not the reference bit for bit: its float32 sums may differ in the last bits, which a
    # cancellation can carry into the bfloat16 rounding; it is held to the error bound, README "Numerics".)
    from double import run_on_double

    check = """
assert cp.__version__.endswith("numpy-double"), cp.__file__
host = [cp.asnumpy(a) for a in (k, gate, ape, offsets)]
want = kpool_cupy.emulate.kpool_compress(*host, np.asarray(cached, np.int32))
got = cp.asnumpy(pooled)
assert got.dtype == ml_dtypes.bfloat16 and got.shape == (9 + 0 + 2, 128), got.shape  # pools whose members all arrive
assert got.tobytes() == want.tobytes()
print("ok")
"""
    done = run_on_double(cupy_example() + check, timeout=120)  # 3-12 s here with a warm build cache
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-3000:]
