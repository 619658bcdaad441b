"""kpool_compress_backward on the CPU: the emulated CUDA kernels and the NumPy reference against float64 autograd.

The model is kpool_compress written the plain way in torch float64 (a loop
over requests and pools, ``softmax = exp(l) / sum exp(l)`` with no
max-subtraction), differentiated by autograd: an independent statement of
the gradients, not a second copy of the kernel's formulas.

Policy the tests below hold (both backends):

- a token in no complete pool gets exact +0 in grad_k and grad_gate, also
  where the caller hands in outputs full of garbage; given outputs are
  written in place and returned;
- a NaN in k at (token, channel c) makes its pool's d gate NaN in channel c
  for every member of that pool, and grad_ape[:, c] NaN; d k (w * g) never
  reads k and stays finite, and every other pool and channel stays finite;
- float32-subnormal inputs (k, gate, ape, grad_pooled) act as zero, and a
  result that would be float32-subnormal is zero (flush-to-zero, as the GPU
  builds with -ftz=true);
- grad_ape has the same bits on every run and under the emulator's reversed
  thread schedule.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from model import BF16, F16, F32, make_batch, standard_lengths

from kpool_cupy import emulate, pool_row_offsets, reference
from kpool_cupy.backends.emulate import EmulateBackend
from kpool_cupy.backends.host import HostMemory, host_binding
from kpool_cupy.backends.reference import ReferenceBackend
from kpool_cupy.emulator.launch import recording
from kpool_cupy.functions import definition
from kpool_cupy.kernel.geometry import (
    APE_SLICES,
    CHANNELS_PER_THREAD,
    STREAM_BYTES,
    WHOLE_POOL_BYTES,
    group_geometry,
)
from kpool_cupy.ops import COMPRESS_BACKWARD
from kpool_cupy.ops.framework.binding import bind

BACKENDS = [emulate, reference]
IDS = ["emulate", "reference"]
U = 2.0**-24  # float32's unit roundoff: the kernels' arithmetic
# Half an ulp at 1 of each output dtype (one rounding to it), and half its smallest subnormal step, the
# absolute part of that rounding near zero (float16's subnormals are normal float32s, kept as such).
ROUND = {BF16: 2.0**-8, F16: 2.0**-11, F32: 2.0**-24}
SUBNORMAL_HALF_STEP = {BF16: 2.0**-134, F16: 2.0**-25, F32: 2.0**-150}
FTZ = 2.0**-126  # a float32 result below the smallest normal is flushed: this much, absolutely


def chunks(kpool: int, k_dtype: np.dtype, gate_dtype: np.dtype) -> int:
    """The prefetch chunks a pool is reduced in (kp::chunk_members): 1 for a whole pool, else streamed."""
    member_bytes = CHANNELS_PER_THREAD * (np.dtype(k_dtype).itemsize + np.dtype(gate_dtype).itemsize + 4)
    if kpool * member_bytes <= WHOLE_POOL_BYTES:
        return 1
    return -(-kpool // max(1, STREAM_BYTES // member_bytes))


@dataclass(frozen=True)
class Model:
    """float64 autograd gradients, and per token what the bounds scale with."""

    grad_k: np.ndarray  # [tokens, head_dim]: w * g
    grad_gate: np.ndarray
    grad_ape: np.ndarray  # [kpool, head_dim]
    member: np.ndarray  # [tokens]: the token's place in its pool, -1 in none
    key_max: np.ndarray  # [tokens, head_dim]: max over the token's pool of |k| per channel (0 in none)
    pools: int
    logit_max: float  # max |gate + ape| over every pooled member
    logit_span: float  # max over pools and channels of (largest - smallest logit)


def model(grad, k, gate, ape, input_row_offsets, cache_lengths) -> Model:
    torch = pytest.importorskip("torch")
    kpool = ape.shape[0]
    kk, gg, aa = (torch.tensor(np.asarray(a, np.float64), requires_grad=True) for a in (k, gate, ape))
    member = np.full(k.shape[0], -1)
    key_max = np.zeros(k.shape)
    logits_seen, spans, pooled = [0.0], [0.0], []
    for b in range(len(cache_lengths)):
        start, end, cached = int(input_row_offsets[b]), int(input_row_offsets[b + 1]), int(cache_lengths[b])
        for q in range(-(-cached // kpool), (cached + end - start) // kpool):
            first = start + q * kpool - cached
            logits = gg[first : first + kpool] + aa
            weights = torch.exp(logits) / torch.exp(logits).sum(0)
            pooled.append((weights * kk[first : first + kpool]).sum(0))
            member[first : first + kpool] = np.arange(kpool)
            key_max[first : first + kpool] = np.abs(np.asarray(k[first : first + kpool], np.float64)).max(0)
            values = logits.detach().numpy()
            logits_seen.append(float(np.abs(values).max()))
            spans.append(float((values.max(0) - values.min(0)).max()))
    if pooled:
        g = torch.tensor(np.asarray(grad[: len(pooled)], np.float64))
        (torch.stack(pooled) * g).sum().backward()
    grads = [np.zeros(a.shape) if a.grad is None else a.grad.numpy() for a in (kk, gg, aa)]
    return Model(*grads, member, key_max, len(pooled), max(logits_seen), max(spans))


def bounds(m: Model, kpool: int, chunk_count: int, k_dtype, gate_dtype, weight_ulps: float, roundings: int):
    """Per element |got - want| allowed for (grad_k, grad_gate, grad_ape), from float32 arithmetic.

    ``weight_ulps``: the relative error of a weight w, in units of 2^-24.
    The rest follows from it, elementwise (starred values are the model's):

    - d k = w * g: one more product, then ``roundings`` roundings to k's
      dtype: (c + 2) u |dk*| + roundings * ROUND |dk*|;
    - d gate = w * g * (k - pooled): pooled, a weighted mean, errs by at most
      (c + kpool + 2) u max|k| over the pool (the weights' error and the
      kpool additions), and k - pooled cancels, so that error is taken at
      the scale |w * g| * max|k| = |dk*| * max|k|, not at |d gate*|; the
      subtraction and the products add 3 u |d gate*|; then gate's
      rounding(s);
    - d ape[m] = the sum over pools of member m's float32 d gate (not
      rounded): each term's error as above, plus pools * u * sum |d gate*|
      for the additions.

    Everything also gets the absolute FTZ (a float32 result below 2^-126
    may be flushed) and half the output dtype's smallest subnormal step.
    """
    c = weight_ulps
    scale = m.grad_k.shape[0] and np.abs(m.grad_k) * m.key_max
    dk = (c + 2) * U * np.abs(m.grad_k) + roundings * ROUND[np.dtype(k_dtype)] * np.abs(m.grad_k)
    dk += FTZ + SUBNORMAL_HALF_STEP[np.dtype(k_dtype)]
    term = (c + 3) * U * np.abs(m.grad_gate) + (c + kpool + 2) * U * scale
    dgate = term + roundings * ROUND[np.dtype(gate_dtype)] * np.abs(m.grad_gate)
    dgate += FTZ + SUBNORMAL_HALF_STEP[np.dtype(gate_dtype)]
    dape = np.zeros(m.grad_ape.shape)
    for member in range(kpool):
        rows = m.member == member
        dape[member] = term[rows].sum(0) + m.pools * U * np.abs(m.grad_gate[rows]).sum(0)
    return dk, dgate, dape + m.pools * FTZ


def model_weight_ulps(m: Model, kpool: int, chunk_count: int) -> float:
    """A weight's relative error against exact arithmetic, in units of u = 2^-24.

    A logit l = gate + ape errs by u|l|, l - max by 4 u Lmax in all
    (Lmax = max |l|), the product by log2(e) (itself rounded) by 11.5 u Lmax;
    exp2 turns that into a relative 8 u Lmax (times ln 2), plus 2 ulps of its
    own (the GPU's ex2.approx; std::exp2 is closer): 8 Lmax + 4 per exp2. A
    member's weight in the sum passes through at most ``chunks + 1`` of them
    (its own, and a rescale per chunk that raised the maximum); the sum adds
    kpool roundings, its reciprocal and w = e / sum a few more.
    """
    return (8 * m.logit_max + 4) * (chunk_count + 1) + 2 * kpool + 4


def agreement_weight_ulps(m: Model, kpool: int, chunk_count: int) -> float:
    """How far the emulator's weight may be from the reference's, in units of u = 2^-24.

    Both compute in float32 from the same chunks; they differ in exp
    (``exp2((l - max) * log2(e))`` against NumPy's ``exp(l - max)``: the
    product's rounding and log2(e)'s move the result by 2 u |l - max|, plus
    an ulp of each exp) and in fused multiply-adds (one rounding a member).
    Per exp: 2 D + 2, D the largest logit span of a pool; at most
    ``chunks + 1`` exps per weight, on both sides; kpool additions each side.
    """
    return (2 * m.logit_span + 2) * (chunk_count + 1) * 2 + 2 * kpool + 8


def assert_within(got, want, bound, name: str) -> None:
    """|got - want| <= bound everywhere (NaN equal to NaN); the message names the first offender."""
    got64 = np.asarray(got, np.float64)
    error = np.abs(got64 - want)
    bad = ~(error <= bound) & ~(np.isnan(got64) & np.isnan(want))
    if bad.any():
        row, channel = np.argwhere(bad)[0]
        raise AssertionError(
            f"{name}: {int(bad.sum())} values off; first at row {row}, channel {channel}: got {got64[row, channel]!r},"
            f" want {want[row, channel]!r}, |error| {error[row, channel]:.3g} > bound {bound[row, channel]:.3g}"
        )


# (k dtype, gate dtype, grad_pooled dtype, kpool, head_dim). The backward holds a pool's rows in registers
# up to kp::kBackwardWholeBytes (16-bit k and gate: kpool 5; float32: 3), else reads them twice: reduced in
# one chunk while the forward's prefetch takes the pool (448 bytes: 16-bit kpool 7, float32 4), in streamed
# chunks past it. The ids say which path runs (test_the_case_ids_name_the_path_the_kernel_takes).
CASES = {
    "bf16-kpool1-held": (BF16, BF16, BF16, 1, 8),  # w = 1: d k = g, d gate = 0
    "bf16-kpool4-held": (BF16, BF16, BF16, 4, 16),
    "bf16-kpool8-streamed": (BF16, BF16, BF16, 8, 32),  # the smallest streamed 16-bit pool
    "bf16-kpool16-streamed": (BF16, BF16, F16, 16, 64),
    "f32-kpool4-twice": (F32, F32, F32, 4, 8),
    "f32-kpool5-streamed": (F32, F32, F32, 5, 16),
    "f16-bf16-kpool2-held": (F16, BF16, F32, 2, 64),
}
# More of the same behind --full (each case is a compile or two).
SLOW_CASES = {
    "bf16-kpool7-twice": (BF16, BF16, F32, 7, 24),  # the largest one-chunk 16-bit pool; head_dim 24: 3 lanes
    "f16-kpool3-held": (F16, F16, F16, 3, 40),
    "bf16-f32-kpool7-streamed": (BF16, F32, BF16, 7, 8),  # k and gate differ: 80 bytes a member
}
# The sweep behind --full: every kpool 1..16 at a head_dim of its own, the dtypes in turn.
_SWEEP_DTYPES = ((BF16, BF16, BF16), (F16, F16, F32), (F32, F32, F16), (F32, BF16, BF16))
SWEEP = {
    f"sweep-kpool{kpool}": (*_SWEEP_DTYPES[kpool % 4], kpool, (8, 16, 24, 40, 64)[kpool % 5]) for kpool in range(1, 17)
}


ALL_CASES = {**CASES, **SLOW_CASES, **SWEEP}


def make_case(name: str) -> tuple[dict, Model]:
    """A ragged batch (an empty request, cached prefixes at every phase, lengths not divisible by kpool, every
    request longer than kpool except the empty one) and a standard-normal grad_pooled."""
    k_dtype, gate_dtype, grad_dtype, kpool, head_dim = ALL_CASES[name]
    lengths, cache = standard_lengths(kpool)
    lengths[3] = kpool + 5  # standard_lengths' 5 tokens hold no pool at kpool >= 6
    batch = make_batch(lengths, cache, head_dim=head_dim, kpool=kpool, dtype=k_dtype, gate_dtype=gate_dtype, seed=7)
    pools = int(pool_row_offsets(batch.input_row_offsets, batch.cache_lengths, kpool)[-1])
    grad = np.random.default_rng(8).standard_normal((pools, head_dim)).astype(grad_dtype)
    args = dict(zip(("k", "gate", "ape", "input_row_offsets", "cache_lengths"), batch.args(), strict=True))
    return {"grad_pooled": grad, **args}, model(grad, *batch.args())


@functools.cache
def computed(name: str) -> tuple[dict, Model, tuple, tuple]:
    """A case, its model and both backends' gradients, computed once for the tests that read them."""
    args, m = make_case(name)
    return args, m, emulate.kpool_compress_backward(**args), reference.kpool_compress_backward(**args)


NAMES = ("grad_k", "grad_gate", "grad_ape")


def check_against_model(name: str, backend: int) -> None:
    _, m, *results = computed(name)
    k_dtype, gate_dtype, _, kpool, _ = ALL_CASES[name]
    assert m.pools >= 6 and ((m.member == -1).any() or kpool == 1), "the batch has pools and tokens in none"
    n = chunks(kpool, k_dtype, gate_dtype)
    allowed = bounds(m, kpool, n, k_dtype, gate_dtype, model_weight_ulps(m, kpool, n), roundings=1)
    wanted = (m.grad_k, m.grad_gate, m.grad_ape)
    for what, got, want, bound in zip(NAMES, results[backend], wanted, allowed, strict=True):
        assert_within(got, want, bound, f"{name} {IDS[backend]} {what}")


@pytest.mark.parametrize("backend", [0, 1], ids=IDS)
@pytest.mark.parametrize("name", CASES)
def test_gradients_match_float64_autograd(name, backend):
    check_against_model(name, backend)


@pytest.mark.slow
@pytest.mark.parametrize("backend", [0, 1], ids=IDS)
@pytest.mark.parametrize("name", [*SLOW_CASES, *SWEEP])
def test_every_kpool_matches_float64_autograd(name, backend):
    check_against_model(name, backend)


SLOW = pytest.mark.slow


@pytest.mark.parametrize("name", [*CASES, *(pytest.param(name, marks=SLOW) for name in [*SLOW_CASES, *SWEEP])])
def test_emulate_and_reference_agree(name):
    # They differ by exp2 against exp, and fused against separate multiply-adds (agreement_weight_ulps); each
    # output is then rounded once on each side, so the two may sit one ulp of its dtype apart.
    _, m, got, want = computed(name)
    k_dtype, gate_dtype, _, kpool, _ = ALL_CASES[name]
    n = chunks(kpool, k_dtype, gate_dtype)
    allowed = bounds(m, kpool, n, k_dtype, gate_dtype, agreement_weight_ulps(m, kpool, n), roundings=2)
    for what, a, b, bound in zip(NAMES, got, want, allowed, strict=True):
        assert_within(a, np.asarray(b, np.float64), bound, f"{name} {what}")


def backward_path(kpool: int, k_dtype: np.dtype, gate_dtype: np.dtype) -> str:
    """Which of the backward kernel's paths a pool takes (kp::backward_whole_pool, kp::chunk_members)."""
    text = (Path(__file__).resolve().parent.parent / "kernels" / "kpool_compress.cu").read_text()
    held_bytes = int(re.search(r"kBackwardWholeBytes = (\d+)", text).group(1))
    member_bytes = CHANNELS_PER_THREAD * (np.dtype(k_dtype).itemsize + np.dtype(gate_dtype).itemsize + 4)
    if chunks(kpool, k_dtype, gate_dtype) > 1:
        return "streamed"
    return "held" if kpool * member_bytes <= held_bytes else "twice"


def test_the_case_ids_name_the_path_the_kernel_takes():
    for name, (k_dtype, gate_dtype, _, kpool, _) in {**CASES, **SLOW_CASES}.items():
        assert name.endswith(backward_path(kpool, k_dtype, gate_dtype)), name


def test_kpool_1_is_the_identity():
    # One member a pool: w = 1, so d k is g rounded to k's dtype and d gate is exactly zero, on both backends.
    args, m, *results = computed("bf16-kpool1-held")
    pooled = m.member == 0
    for backend, (grad_k, grad_gate, grad_ape) in zip(IDS, results, strict=True):
        assert (grad_k[pooled] == args["grad_pooled"][: m.pools].astype(BF16)).all(), backend
        assert (grad_gate == 0).all() and (grad_ape == 0).all(), backend


def _grad_layouts(grad: np.ndarray) -> dict[str, np.ndarray]:
    """grad_pooled as the same values at other strides, and with rows past the pools that must not be read."""
    pools, head_dim = grad.shape
    transposed = np.ascontiguousarray(grad.T).T  # column stride = pools elements, row stride 1
    wide = np.full((pools, 3 * head_dim), np.nan, grad.dtype)
    wide[:, ::3] = grad
    reversed_rows = np.ascontiguousarray(grad[::-1])[::-1]  # a negative row stride
    extra = np.full((pools + 5, head_dim), np.nan, grad.dtype)
    extra[:pools] = grad
    return {
        "transposed": transposed,
        "every-third-column": wide[:, ::3],
        "reversed-rows": reversed_rows,
        "more-rows-than-pools": extra,
    }


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
@pytest.mark.parametrize("grad_dtype", [BF16, F16, F32], ids=["bf16", "f16", "f32"])
def test_grad_pooled_at_any_strides_gives_the_contiguous_bits(backend, grad_dtype):
    # grad_pooled is read at its own strides (autograd hands in transposed, sliced and expanded gradients):
    # each layout gives the bits of the contiguous array with the same values. Rows past the pools are NaN,
    # as is the padding between columns: a read of either would show.
    args, _ = make_case("bf16-kpool4-held")
    grad = args["grad_pooled"].astype(grad_dtype)
    want = backend.kpool_compress_backward(**(args | {"grad_pooled": grad}))
    for layout, view in _grad_layouts(grad).items():
        got = backend.kpool_compress_backward(**(args | {"grad_pooled": view}))
        for what, a, b in zip(NAMES, got, want, strict=True):
            assert a.tobytes() == b.tobytes(), f"{layout} {what}"
    # Stride 0: one row for every pool, and one value for the whole array.
    for layout, view in {
        "broadcast-row": np.broadcast_to(grad[1], grad.shape),
        "broadcast-value": np.broadcast_to(grad[1, 2], grad.shape),
    }.items():
        got = backend.kpool_compress_backward(**(args | {"grad_pooled": view}))
        want = backend.kpool_compress_backward(**(args | {"grad_pooled": np.ascontiguousarray(view)}))
        for what, a, b in zip(NAMES, got, want, strict=True):
            assert a.tobytes() == b.tobytes(), f"{layout} {what}"


def _exact_pools(pools: int, kpool: int, head_dim: int, seed: int) -> dict:
    """One request of ``pools`` pools whose gradients are exact in float32 on any backend.

    Every member has the same logit per channel (one gate row and one ape
    row repeated), so each weighs exactly 1 (the maximum's weight) and
    w = 1 / kpool, kpool a power of two; keys are kpool times small
    integers, so pooled and k - pooled are exact; grad rows are 4-bit
    significands at exponents from 2^-12 to 2^12, so every d gate is exact
    but their sums over pools round, and how depends on the order.
    """
    rng = np.random.default_rng(seed)
    tokens = pools * kpool
    grad = rng.integers(8, 16, (pools, head_dim)) * 2.0 ** rng.integers(-15, 10, (pools, head_dim))
    grad *= rng.choice([-1.0, 1.0], grad.shape)
    return {
        "grad_pooled": grad.astype(np.float32),
        "k": (kpool * rng.integers(-8, 9, (tokens, head_dim))).astype(np.float32),
        "gate": np.tile(rng.standard_normal(head_dim).astype(np.float32), (tokens, 1)),
        "ape": np.tile(rng.standard_normal(head_dim).astype(np.float32), (kpool, 1)),
        "input_row_offsets": np.array([0, tokens], np.int32),
        "cache_lengths": np.zeros(1, np.int32),
    }


@pytest.mark.parametrize("pools", [100, 1200, 4200], ids=["4-blocks", "38-blocks", "132-blocks"])
def test_exact_pools_give_the_same_bits_on_both_backends(pools):
    # With every d gate exact, the only rounding left is d ape's sums: over a block's groups in group order,
    # then over the blocks (the reference spells that order out: slice s of kpool_compress_backward_ape
    # sums blocks s, s + 64, ... in order, then the 64 slices' sums are added pairwise). 100 pools of head_dim
    # 64 (8 lanes, 32 groups a block) fill four blocks (three partials or more: a sum of two cannot tell an
    # order), 1200 fill 38 (the pairwise levels over many slices), 4200 fill 132, so slices sum three
    # blocks and two: a changed order in any sum changes bits.
    args = _exact_pools(pools=pools, kpool=4, head_dim=64, seed=11)
    assert group_geometry(64, pools).grid == {100: 4, 1200: 38, 4200: 132}[pools]
    got = emulate.kpool_compress_backward(**args)
    want = reference.kpool_compress_backward(**args)
    for what, a, b in zip(NAMES, got, want, strict=True):
        assert a.tobytes() == b.tobytes(), what
    # The control: the sum over pools in another order (pool order, float64) is different somewhere.
    d_gate = want[1].reshape(pools, 4, 64).astype(np.float64)
    assert (d_gate.sum(0).astype(np.float32) != want[2]).any()


class _Kept(HostMemory):
    """A backend that keeps the launches an op asks for and runs none."""

    def __init__(self) -> None:
        self.launches: list = []

    def launch(self, launch) -> None:
        self.launches.append(launch)


def _ape_sum_launch(pools: int):
    """The launch of kpool_compress_backward_ape a call over ``pools`` pools of head_dim 64 at kpool 4 makes
    (not run): its partials operand, one partial a block of the pooling launch, is the caller's to fill."""
    kept = _Kept()
    function = bind(definition(COMPRESS_BACKWARD), host_binding("kept", lambda extras: kept), COMPRESS_BACKWARD)
    function(**_exact_pools(pools=pools, kpool=4, head_dim=64, seed=15), validate=False)
    pooling, ape_sum = kept.launches
    assert ape_sum.kernel.name == "kpool_compress_backward_ape"
    assert ape_sum.values["blocks"] == pooling.values["pool_blocks"]  # the partials are the pool blocks'
    return ape_sum


@pytest.mark.parametrize("pools", [100, 2200, 35200], ids=["4-blocks", "69-blocks", "1100-blocks"])
def test_the_ape_sum_adds_partials_in_its_order_with_zeros_signed_as_added(pools):
    # The ape sum on partials made up here, the emulated kernel against the reference's statement of its
    # order, bit for bit: magnitudes from 2^-20 to 2^20 (every sum rounds, so another order gives other
    # bits), a column of -0 only, columns of +0 and -0 mixed, and a NaN. With 4 blocks most slices hold
    # none (their sums +0, so the -0 column sums to +0); with 69, five slices hold two and every slice one
    # (the -0 column sums to -0: a thread's blocks past the last read as -0, which adds nothing; read as +0
    # they would make it +0); with 1,100 a thread's batch loop of 16 blocks runs twice. Seen failing with
    # the padding read as +0, the slices started at +0, and the batch loop's stride one batch short.
    launch = _ape_sum_launch(pools)
    partials = launch.operands["partials"]
    blocks = int(launch.values["blocks"])
    assert blocks == {100: 4, 2200: 69, 35200: 1100}[pools]
    rng = np.random.default_rng(16)
    values = rng.standard_normal(partials.shape) * 2.0 ** rng.integers(-20, 21, partials.shape)
    flat = values.reshape(blocks, -1)
    flat[:, 3] = -0.0
    flat[:, 5] = rng.choice([0.0, -0.0], blocks)
    flat[blocks // 2, 7] = np.nan
    partials[...] = values.astype(np.float32)
    EmulateBackend().launch(launch)
    got = launch.operands["grad_ape"].copy()
    launch.operands["grad_ape"][...] = 7.0
    ReferenceBackend().launch(launch)
    want = launch.operands["grad_ape"].reshape(-1)
    assert got.tobytes() == want.tobytes()
    # The cases meant: the -0 column sums to -0 where every slice holds a block, the mixed column to +0, the
    # NaN's column is NaN.
    assert want[3] == 0 and np.signbit(want[3]) == (blocks >= APE_SLICES)
    assert not np.signbit(want[5]) and np.isnan(want[7])
    # The control: the partials summed in block order are different somewhere.
    in_order = flat.astype(np.float32).cumsum(axis=0, dtype=np.float32)[-1]
    assert (in_order[np.isfinite(in_order)] != want[np.isfinite(in_order)]).any()


def test_grad_ape_is_the_same_bits_run_after_run_and_under_the_reversed_schedule(monkeypatch):
    # d ape's partials go through shared memory between two barriers per member. The emulator runs a block's
    # threads as fibers; under -DKP_FIBERS_REVERSED they run in the opposite order, so a missing barrier
    # (a slot read before its group wrote it, or overwritten by the next member before it was summed)
    # gives other bits. 100 pools of head_dim 64 are 4 blocks of 32 groups, the last one part full; a fifth
    # block's groups zero the 3 requests' rows in no pool.
    lengths, cache = [3 * 100 + 1, 0, 7], [2, 0, 1]
    batch = make_batch(lengths, cache, head_dim=64, kpool=3, seed=12)
    pools = int(pool_row_offsets(batch.input_row_offsets, batch.cache_lengths, 3)[-1])
    grad = np.random.default_rng(13).standard_normal((pools, 64)).astype(BF16)
    with recording() as launches:
        first = emulate.kpool_compress_backward(grad, *batch.args())
    assert launches[0].grid == 4 + 1 and launches[0].cooperative, launches
    second = emulate.kpool_compress_backward(grad, *batch.args())
    monkeypatch.setenv(emulate.FLAGS_VARIABLE, "-DKP_FIBERS_REVERSED")
    reversed_run = emulate.kpool_compress_backward(grad, *batch.args())
    for what, a, b, c in zip(NAMES, first, second, reversed_run, strict=True):
        assert a.tobytes() == b.tobytes(), f"{what}: a second run"
        assert a.tobytes() == c.tobytes(), f"{what}: the reversed schedule"


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_tokens_in_no_pool_get_zeros_in_given_outputs_full_of_garbage(backend):
    # The op zeroes what it is given: rows of tokens in no complete pool are +0 however they came in, and
    # the given arrays are the ones written and returned.
    args, m = make_case("bf16-kpool4-held")
    given = {
        "grad_k": np.full(args["k"].shape, np.nan, BF16),
        "grad_gate": np.full(args["gate"].shape, -7.0, BF16),
        "grad_ape": np.full(args["ape"].shape, np.inf, np.float32),
    }
    result = backend.kpool_compress_backward(**args, **given)
    assert all(got is array for got, array in zip(result, given.values(), strict=True))
    outside = m.member == -1
    for what in ("grad_k", "grad_gate"):
        rows = given[what][outside].astype(np.float32)
        assert (rows == 0).all() and not np.signbit(rows).any(), what
    assert np.isfinite(given["grad_ape"]).all() and (given["grad_k"][~outside] != 0).any()
    fresh = backend.kpool_compress_backward(**args)
    for what, a, b in zip(NAMES, result, fresh, strict=True):
        assert a.tobytes() == b.tobytes(), what


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_a_call_without_pools_gives_zeros(backend):
    # Requests shorter than kpool and a batch of no tokens: no pool, nothing launched that writes rows, every
    # given output zeroed all the same, +0 (grad_ape too: the sum of no partial, as autograd's zeros; seen
    # failing with the ape sum's slices starting at -0 whether or not they hold a block).
    rng = np.random.default_rng(14)
    k = rng.standard_normal((6, 16)).astype(BF16)
    ape = rng.standard_normal((4, 16)).astype(np.float32)
    offsets, cache = np.array([0, 3, 3, 6], np.int32), np.array([2, 0, 0], np.int32)  # 2 + 3 and 0 + 3 < 2 * 4
    given = [np.full((6, 16), np.nan, BF16), np.full((6, 16), np.nan, BF16), np.full((4, 16), np.nan, np.float32)]
    names = dict(zip(NAMES, given, strict=True))
    result = backend.kpool_compress_backward(np.zeros((0, 16), BF16), k, k, ape, offsets, cache, **names)
    assert all(got is array and (array == 0).all() for got, array in zip(result, given, strict=True))
    assert not np.signbit(given[2]).any()
    empty = np.zeros((0, 16), BF16)
    grads = backend.kpool_compress_backward(empty, empty, empty, ape, np.array([0], np.int32), np.zeros(0, np.int32))
    assert [g.shape for g in grads] == [(0, 16), (0, 16), (4, 16)] and (grads[2] == 0).all()
    assert not np.signbit(grads[2]).any()


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_without_validation_pools_past_grad_pooled_get_zeros(backend):
    # validate=False and fewer gradient rows than pools: a pool without a row is not read, its members keep
    # zeros, and the pools with rows are as with every row there (as values: 0 * (k - pooled) may be -0).
    args, m = make_case("bf16-kpool4-held")
    kept = m.pools - 3
    short = backend.kpool_compress_backward(**(args | {"grad_pooled": args["grad_pooled"][:kept]}), validate=False)
    grad = args["grad_pooled"].copy()
    grad[kept:] = 0
    want = backend.kpool_compress_backward(**(args | {"grad_pooled": grad}))
    for what, a, b in zip(NAMES, short, want, strict=True):
        assert np.array_equal(a.astype(np.float32), b.astype(np.float32)), what
    assert (short[0][m.member >= 0][-3 * 4 :] == 0).all() and (short[0][m.member >= 0][: kept * 4] != 0).any()
    # A given output is written where pools with rows land and where no pool is claimed, and keeps what it
    # held in the rows of pools without one (docs/validation.md).
    given = np.full(args["k"].shape, np.nan, BF16)
    grad = args["grad_pooled"][:kept]
    backend.kpool_compress_backward(**(args | {"grad_pooled": grad}), grad_k=given, validate=False)
    unread = np.flatnonzero(m.member >= 0)[kept * 4 :]
    assert np.isnan(given[unread].astype(np.float32)).all()
    np.testing.assert_array_equal(np.delete(given, unread, axis=0), np.delete(short[0], unread, axis=0))


def _small(dtype, seed: int) -> dict:
    """3 requests, kpool 4, head_dim 16, 8 pools (grad_pooled has a 9th row, never read); request 0's pools are
    0 to 3."""
    batch = make_batch([17, 10, 9], [0, 2, 3], head_dim=16, kpool=4, dtype=dtype, seed=seed)
    grad = np.random.default_rng(seed).standard_normal((9, 16)).astype(dtype)
    return {"grad_pooled": grad, **dict(zip(("k", "gate", "ape", "input_row_offsets", "cache_lengths"),
                                            batch.args(), strict=True))}  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_a_nan_key_stays_in_its_pool_and_channel(backend):
    # k[5, 3] is NaN: token 5 is member 1 of pool 1 (tokens 4-7). pooled[1, 3] is NaN, so d gate of pool 1's
    # four members is NaN in channel 3, and d ape[:, 3] (a sum over pools) is NaN. d k = w * g does not read
    # k: finite. Nothing else is touched.
    args = _small(F32, seed=15)
    args["k"][5, 3] = np.nan
    grad_k, grad_gate, grad_ape = backend.kpool_compress_backward(**args)
    assert np.isfinite(grad_k).all()
    nan = np.zeros(grad_gate.shape, bool)
    nan[4:8, 3] = True
    np.testing.assert_array_equal(np.isnan(grad_gate), nan)
    np.testing.assert_array_equal(np.isnan(grad_ape), np.arange(16)[None, :].repeat(4, 0) == 3)


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_an_infinite_gradient_row_stays_in_its_pool(backend):
    # grad_pooled[2, 5] = inf: pool 2's members get d k = +-inf in channel 5 (w > 0 times inf) and d gate
    # inf or NaN (inf * (k - pooled), NaN where k == pooled); d ape[:, 5] is not finite; the rest is finite.
    args = _small(F32, seed=16)
    args["grad_pooled"][2, 5] = np.inf
    grad_k, grad_gate, grad_ape = backend.kpool_compress_backward(**args)
    bad = np.zeros(grad_k.shape, bool)
    bad[8:12, 5] = True
    np.testing.assert_array_equal(np.isinf(grad_k), bad)
    np.testing.assert_array_equal(~np.isfinite(grad_gate), bad)
    np.testing.assert_array_equal(~np.isfinite(grad_ape), np.arange(16)[None, :].repeat(4, 0) == 5)


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_infinite_logits_give_the_gradient_of_the_forwards_limits(backend):
    # A logit equal to the maximum weighs exactly 1, as in the forward. Pool 1 (tokens 4-7), channel 2: every
    # gate -inf, so w = 1/4 each: d k = g / 4, d gate = (g / 4)(k - mean), all finite. Pool 2 (tokens 8-11),
    # channel 6: token 9's gate +inf, so w = (0, 1, 0, 0): d k = g at token 9 and 0 elsewhere, d gate 0.
    # ape[:, 9] = -inf: every pool's channel 9 has all logits -inf, equal weights again.
    args = _small(F32, seed=19)
    args["gate"][4:8, 2] = -np.inf
    args["gate"][9, 6] = np.inf
    args["ape"][:, 9] = -np.inf
    grad_k, grad_gate, grad_ape = backend.kpool_compress_backward(**args)
    assert np.isfinite(grad_k).all() and np.isfinite(grad_gate).all() and np.isfinite(grad_ape).all()
    g, k = args["grad_pooled"], args["k"]
    # 1/4 and the mean of four float32 keys: exact up to the sum's rounding (2 float32 ulps of the largest key).
    np.testing.assert_allclose(grad_k[4:8, 2], np.full(4, g[1, 2] / 4), rtol=0, atol=0)
    mean = k[4:8, 2].astype(np.float64).mean()
    np.testing.assert_allclose(grad_gate[4:8, 2], g[1, 2] / 4 * (k[4:8, 2] - mean), rtol=0,
                               atol=2 * abs(g[1, 2]) * np.abs(k[4:8, 2]).max() * 2.0**-23)  # fmt: skip
    np.testing.assert_array_equal(grad_k[8:12, 6], [0, g[2, 6], 0, 0])
    np.testing.assert_array_equal(grad_gate[8:12, 6], np.zeros(4))
    members = np.flatnonzero(grad_k.any(axis=1))  # every pool's members, in pool order: 8 pools
    assert members.size == 32
    np.testing.assert_array_equal(grad_k[members, 9], np.repeat(g[:8, 9], 4) / 4)


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_subnormal_inputs_act_as_zero(backend, dtype):
    # float32-subnormal values (bfloat16 has them too, at float32's exponents) in k, gate, ape and
    # grad_pooled give the bits of zeros there: the kernels flush subnormals, and the reference does too.
    args = _small(dtype, seed=17)
    zeros = {name: value.copy() for name, value in args.items()}
    rng = np.random.default_rng(18)
    for name in ("grad_pooled", "k", "gate", "ape"):
        places = rng.random(args[name].shape) < 0.2
        tiny = rng.choice([1e-39, -3e-40, 2.0**-140, -(2.0**-127)], args[name].shape)
        args[name][places] = tiny[places].astype(args[name].dtype)
        assert (np.abs(args[name][places].astype(np.float32)) < 2.0**-126).all() and (args[name][places] != 0).any()
        zeros[name][places] = 0
    got, want = backend.kpool_compress_backward(**args), backend.kpool_compress_backward(**zeros)
    for what, a, b in zip(NAMES, got, want, strict=True):
        assert np.array_equal(a.astype(np.float32), b.astype(np.float32)), what


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_a_subnormal_result_is_zero(backend):
    # grad rows of 2^-125: w * g is below 2^-126 for any w < 1/2, so with 4 members of equal logits
    # (w = 1/4) every d k is flushed to zero, and so is d gate.
    args = _exact_pools(pools=3, kpool=4, head_dim=16, seed=19)
    args["grad_pooled"][:] = 2.0**-125
    grads = backend.kpool_compress_backward(**args)
    assert all((g == 0).all() for g in grads)
    args["grad_pooled"][:] = 2.0**-123  # the control: w * g = 2^-125, normal, kept
    assert (backend.kpool_compress_backward(**args)[0] == 2.0**-125).all()
