"""Arrays as engines hold them (``ops.framework.engine_forms``): e4m3fn values typed float8_e4m3fn and
DeepGEMM's 4-D paged cache give the bytes and logits the package's own forms give, on every backend, torch
included, and a given output comes back as the caller's array."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_fp8_validation import _cache, _slots, good

from kpool_cupy import emulate, reference
from kpool_cupy.ops.framework.examples import example_batch

FLOAT8 = np.dtype(ml_dtypes.float8_e4m3fn)
BACKENDS = [reference, emulate]


def _scoring():
    return [a.copy() for a in example_batch().scoring]  # q, weights, cache, table, offsets, lengths


def _deep_gemm_cache(cache: np.ndarray) -> np.ndarray:
    """The same bytes as DeepGEMM shapes them: ``[num_blocks, block_size, 1, head_dim + 4]``."""
    return cache.reshape(cache.shape[0], cache.shape[1], 1, cache.shape[2])


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__.rpartition(".")[2])
def test_the_scorer_and_the_select_take_float8_queries_and_deep_gemms_cache(backend):
    q, weights, cache, table, offsets, lengths = _scoring()
    want = backend.kpool_index_logits_fp8(q, weights, cache, table, offsets, lengths, kpool=2)
    engine = (q.view(FLOAT8), weights, _deep_gemm_cache(cache), table, offsets, lengths)
    np.testing.assert_array_equal(backend.kpool_index_logits_fp8(*engine, kpool=2), want)
    options = {"kpool": 2, "pool_topk": 1, "always_select_tail": True}
    plain = backend.kpool_index_select_fp8(q, weights, cache, table, offsets, lengths, **options)
    got = backend.kpool_index_select_fp8(*engine, **options)
    np.testing.assert_array_equal(got, plain)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__.rpartition(".")[2])
def test_fp8_writers_fill_float8_outputs_and_return_the_callers_arrays(backend):
    a = good("compress_fp8")
    values, scales = backend.kpool_compress_fp8(**a)
    out = np.full(values.shape, np.nan, FLOAT8)  # every byte written, or a NaN byte shows
    out_scale = np.zeros_like(scales)
    got = backend.kpool_compress_fp8(**a, out=out, out_scale=out_scale)
    assert got[0] is out and got[1] is out_scale  # the caller's arrays, not the uint8 views read
    np.testing.assert_array_equal(out.view(np.uint8), values)
    x = good("hadamard_quant")["x"]
    values, _ = backend.hadamard_quant_fp8(x)
    out = np.full(values.shape, np.nan, FLOAT8)
    assert backend.hadamard_quant_fp8(x, out=out, out_scale=np.zeros(len(x), np.float32))[0] is out
    np.testing.assert_array_equal(out.view(np.uint8), values)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__.rpartition(".")[2])
def test_an_fp8_writer_fills_deep_gemms_cache_with_the_same_bytes(backend):
    a = good("compress_fp8")
    want = _cache()
    backend.kpool_compress_fp8(**a, cache=want, slots=_slots())
    got = _deep_gemm_cache(_cache())
    backend.kpool_compress_fp8(**a, cache=got, slots=_slots())
    np.testing.assert_array_equal(got[:, :, 0], want)
    assert want.any()  # something was written


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__.rpartition(".")[2])
def test_other_forms_are_refused_naming_the_argument(backend):
    q, weights, cache, table, offsets, lengths = _scoring()
    wide = np.zeros((cache.shape[0], cache.shape[1], 2, cache.shape[2]), np.uint8)  # two heads a slot: not DeepGEMM's
    with pytest.raises(ValueError, match=r"^Invalid cache: expected shape \[num_blocks, block_size >= 1, 68\]"):
        backend.kpool_index_logits_fp8(q, weights, wide, table, offsets, lengths, kpool=2)
    e5m2 = q.view(ml_dtypes.float8_e5m2)
    with pytest.raises(TypeError, match=r"^Invalid q: expected dtype uint8 \(e4m3fn bytes\) or float8_e4m3fn, got"):
        backend.kpool_index_logits_fp8(e5m2, weights, cache, table, offsets, lengths, kpool=2)
    a = good("compress_fp8")
    with pytest.raises(TypeError, match=r"^Invalid k: expected"):  # float8 only where the op takes e4m3fn bytes
        backend.kpool_compress_fp8(**dict(a, k=a["k"].astype(FLOAT8)))


def _deep_gemm_refusals(cache: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """4-D caches each refused for one reason, and the refusal: it shows the shape or strides the caller passed
    (the checks see the caller's array, the kernels its 3-D view)."""
    blocks, size, entry = cache.shape
    wide = np.zeros((blocks, size, 1, entry + 4), np.uint8)
    spaced = np.zeros((blocks, size, 1, 2 * entry), np.uint8)[..., :entry]  # rows 2 entries apart
    shape = rf"expected shape \[num_blocks, block_size >= 1, {entry}\].*got \({blocks}, {size}, 1, {entry + 4}\)$"
    r = 2 * entry  # the row stride
    strides = rf"contiguous pages \(strides \[page, {entry}, any, 1\]\), got byte strides \({r * size}, {r}, {r}, 1\)$"
    return [(wide, shape), (spaced, "expected " + strides)]


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__.rpartition(".")[2])
def test_a_refused_4d_cache_is_shown_as_the_caller_passed_it(backend):
    q, weights, cache, table, offsets, lengths = _scoring()
    a = good("compress_fp8")
    for bad, message in _deep_gemm_refusals(cache):
        with pytest.raises(ValueError, match=r"^Invalid cache: " + message):
            backend.kpool_index_logits_fp8(q, weights, bad, table, offsets, lengths, kpool=2)
        with pytest.raises(ValueError, match=r"^Invalid cache: " + message):
            backend.kpool_index_select_fp8(q, weights, bad, table, offsets, lengths, kpool=2, pool_topk=1)
    for bad, message in _deep_gemm_refusals(_cache()):
        with pytest.raises(ValueError, match=r"^Invalid cache: " + message):
            backend.kpool_compress_fp8(**a, cache=bad, slots=_slots())


def test_torch_refuses_a_4d_cache_as_the_caller_passed_it():
    torch = pytest.importorskip("torch")
    import kpool_cupy.torch as kt

    q, weights, cache, table, offsets, lengths = _scoring()
    for bad, message in _deep_gemm_refusals(cache):
        tensors = (torch.from_numpy(a) for a in (q, weights, bad, table, offsets, lengths))
        with pytest.raises(ValueError, match=r"^Invalid cache: " + message):
            kt.kpool_index_logits_fp8(*tensors, kpool=2)


def test_torch_ops_take_float8_tensors_and_deep_gemms_cache_on_the_cpu_and_traced():
    torch = pytest.importorskip("torch")
    import kpool_cupy.torch as kt

    q, weights, cache, table, offsets, lengths = (torch.from_numpy(a) for a in _scoring())
    want = kt.kpool_index_logits_fp8(q, weights, cache, table, offsets, lengths, kpool=2)
    q8 = q.view(torch.float8_e4m3fn)  # what an engine's quantizer hands over
    cache4 = cache.view(cache.shape[0], cache.shape[1], 1, cache.shape[2])

    def step(q, cache):
        return kt.kpool_index_logits_fp8(q, weights, cache, table, offsets, lengths, kpool=2, max_pools=want.shape[1])

    assert torch.equal(step(q8, cache4), want)
    # The fake kernels read the same forms: a compiled step traces them with no graph break.
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True, dynamic=True)  # symbolic sizes too
    assert torch.equal(compiled(q8, cache4), want)
    x = torch.from_numpy(good("hadamard_quant")["x"].view(np.int16)).view(torch.bfloat16)
    values, _ = kt.hadamard_quant_fp8(x)
    out = torch.full(values.shape, float("nan")).to(torch.float8_e4m3fn)
    got = kt.hadamard_quant_fp8(x, out=out, out_scale=torch.zeros(len(x)))
    assert got[0] is out and torch.equal(out.view(torch.uint8), values)
    with pytest.raises(TypeError, match=r"^Invalid x: expected"):  # float8 only where the op takes e4m3fn bytes
        kt.hadamard_quant_fp8(x.to(torch.float8_e4m3fn))


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__.rpartition(".")[2])
def test_the_query_quantizer_returns_float8_values_when_asked(backend):
    x = good("hadamard_quant")["x"]
    values, scales = backend.hadamard_quant_fp8(x)
    for dtype in (FLOAT8, "float8_e4m3fn"):
        typed, typed_scales = backend.hadamard_quant_fp8(x, out_dtype=dtype)
        assert typed.dtype == FLOAT8
        np.testing.assert_array_equal(typed.view(np.uint8), values)
        np.testing.assert_array_equal(typed_scales, scales)
    assert backend.hadamard_quant_fp8(x, out_dtype=np.uint8)[0].dtype == np.uint8
    for bad in (ml_dtypes.float8_e5m2, np.array([1, 2])):  # an array is no dtype: named, not NumPy's own error
        with pytest.raises(TypeError, match=r"^Invalid out_dtype: expected uint8 or float8_e4m3fn"):
            backend.hadamard_quant_fp8(x, out_dtype=bad)
    # With out, out comes back as given (torch's CUDA path hands the op both: tests/test_torch_cuda.py).
    out = np.zeros(values.shape, FLOAT8)
    assert backend.hadamard_quant_fp8(x, out_dtype=FLOAT8, out=out, out_scale=scales.copy())[0] is out


def test_the_torch_query_quantizer_returns_float8_tensors_eager_and_compiled():
    torch = pytest.importorskip("torch")
    import kpool_cupy.torch as kt

    x = torch.from_numpy(good("hadamard_quant")["x"].view(np.int16)).view(torch.bfloat16)
    values, _ = kt.hadamard_quant_fp8(x)
    typed, _ = kt.hadamard_quant_fp8(x, out_dtype=torch.float8_e4m3fn)
    assert typed.dtype == torch.float8_e4m3fn and torch.equal(typed.view(torch.uint8), values)
    step = lambda x: kt.hadamard_quant_fp8(x, out_dtype=torch.float8_e4m3fn)  # noqa: E731
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got, _ = compiled(x)
    assert got.dtype == torch.float8_e4m3fn and torch.equal(got.view(torch.uint8), values)
    with pytest.raises(TypeError, match=r"^Invalid out_dtype: expected uint8 or float8_e4m3fn"):
        kt.hadamard_quant_fp8(x, out_dtype=torch.float8_e5m2)


@pytest.mark.parametrize("spare_columns", [0, 1], ids=["table-exact", "table-padded"])
def test_lengths_that_count_the_step_are_refused_naming_cache_lengths(spare_columns):
    # vLLM's seq_lens and DeepGEMM's context_lens include the step's tokens; passed as cache_lengths, each token
    # sees next_n pools more than were written. The table the engine sized stops short (too few columns, or -1
    # padding where the step's pools would be): the refusal says which length cache_lengths is.
    from index_cases import index_case

    rng = np.random.default_rng(13)
    case = index_case(rng, heads=2, head_dim=64, kpool=1, block_size=2, counts=(2, 2), cache_lengths=(2, 4),
                      spare_pages=0, spare_columns=spare_columns)  # fmt: skip
    seq_lens = case.cache_lengths + np.diff(case.input_row_offsets).astype(case.cache_lengths.dtype)
    args = (case.q, case.weights, case.cache, case.cache_block_table, case.input_row_offsets, seq_lens)
    for call in (
        lambda: reference.kpool_index_logits_fp8(*args, kpool=1),
        lambda: reference.kpool_index_select_fp8(*args, kpool=1, pool_topk=2),
    ):
        with pytest.raises(ValueError, match=r"^Invalid cache_block_table: .*cache_lengths counts each request's"):
            call()


def test_deep_gemms_cache_takes_a_launch_plan_on_the_gpu_path():
    # The kernel reads the 3-D view of the caller's 4-D cache; a plan passes the caller's array in its place (the
    # same pointer), so a hot call with it replays one launch like the 3-D cache's (on the CuPy double, an sm_90:
    # the emulator runs sm_90's path for the bits to compare).
    from double import run_on_double

    script = """
import os
os.environ["KPOOL_CUPY_EMULATE_MMA"] = "hmma"
import numpy as np, cupy
import kpool_cupy
from kpool_cupy import emulate
from kpool_cupy.backends import cupy_plans
from kpool_cupy.ops.framework.examples import example_batch

q, weights, cache, table, offsets, lengths = example_batch().scoring
cache4 = cupy.asarray(cache.reshape(cache.shape[0], cache.shape[1], 1, cache.shape[2]))
args = [cupy.asarray(a) for a in (q, weights)] + [cache4] + [cupy.asarray(a) for a in (table, offsets, lengths)]
want = emulate.kpool_index_logits_fp8(q, weights, cache, table, offsets, lengths, kpool=2)
out = cupy.empty(want.shape, cupy.float32)
for seed in range(3):
    got = kpool_cupy.kpool_index_logits_fp8(*args, kpool=2, max_pools=want.shape[1], out=out, validate=False)
    assert got is out and np.array_equal(np.asarray(out), want)
    out[...] = 0
assert len(cupy_plans._plans) == 1, cupy_plans._plans.keys()
key, = cupy_plans._plans
assert cupy_plans.replay(key, tuple(args) + (out,), cupy) is not cupy_plans.MISS
print("ok")
"""
    done = run_on_double(script, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-3000:]
