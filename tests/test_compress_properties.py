"""Properties of kpool_compress under random search (hypothesis).

The CI profile is derandomized (a fixed seed, the same examples every run);
HYPOTHESIS_PROFILE=long searches further on demand. Shrunk failures print the
batch as lengths, cache lengths and kpool, which is all it takes to replay one.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model import BF16, F16, F32, TOLERANCES, make_batch

from kpool_cupy import emulate, pool_row_offsets, reference

settings.register_profile(
    "ci", derandomize=True, max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("long", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

HEAD_DIM = 16  # small: the properties are about pools and members, not channel count


@st.composite
def batches(draw, kpools=(1, 2, 3, 4, 8)):
    kpool = draw(st.sampled_from(kpools))
    requests = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, 5 * kpool + 2), min_size=requests, max_size=requests))
    cache = draw(st.lists(st.integers(0, 4 * kpool + 3), min_size=requests, max_size=requests))
    dtype = draw(st.sampled_from([BF16, F16, F32]))
    seed = draw(st.integers(0, 2**16))
    return {"lengths": lengths, "cache": cache, "kpool": kpool, "dtype": dtype, "seed": seed}


def build(spec):
    return make_batch(
        spec["lengths"], spec["cache"], head_dim=HEAD_DIM, kpool=spec["kpool"], dtype=spec["dtype"], seed=spec["seed"]
    )


def bits(array):
    return array.view(np.uint8)


@given(spec=batches(), data=st.data())
def test_permuting_requests_permutes_output_rows(spec, data):
    batch = build(spec)
    lengths, kpool = spec["lengths"], spec["kpool"]
    order = data.draw(st.permutations(range(len(lengths))))
    pools = pool_row_offsets(batch.input_row_offsets, batch.cache_lengths, kpool)
    starts = batch.input_row_offsets
    rows = np.concatenate([np.arange(starts[b], starts[b + 1]) for b in order] + [np.zeros(0, np.int64)])
    permuted = make_batch(
        [lengths[b] for b in order], [spec["cache"][b] for b in order], head_dim=HEAD_DIM, kpool=kpool
    )
    permuted.k, permuted.gate, permuted.ape = batch.k[rows], batch.gate[rows], batch.ape
    before = emulate.kpool_compress(*batch.args())
    after = emulate.kpool_compress(*permuted.args())
    want = np.concatenate([before[pools[b] : pools[b + 1]] for b in order] + [before[:0]])
    np.testing.assert_array_equal(bits(after), bits(want))


@given(spec=batches(), data=st.data())
def test_splitting_a_request_at_a_pool_boundary_gives_the_same_pools(spec, data):
    # Pools are immutable: building them over two calls, the second with the
    # first's tokens as cached prefix, changes no bit.
    batch = build({**spec, "lengths": spec["lengths"][:1], "cache": spec["cache"][:1]})
    kpool, cached, n = spec["kpool"], spec["cache"][0], spec["lengths"][0]
    boundaries = [p * kpool - cached for p in range(-(-cached // kpool), (cached + n) // kpool + 1)]
    split = data.draw(st.sampled_from([b for b in boundaries if 0 <= b <= n] or [0]))
    whole = emulate.kpool_compress(*batch.args())
    first = emulate.kpool_compress(
        batch.k[:split], batch.gate[:split], batch.ape, np.array([0, split], np.int64), np.array([cached], np.int64)
    )
    second = emulate.kpool_compress(
        batch.k[split:],
        batch.gate[split:],
        batch.ape,
        np.array([0, n - split], np.int64),
        np.array([cached + split], np.int64),
    )
    np.testing.assert_array_equal(bits(np.concatenate([first, second])), bits(whole))


@given(spec=batches(kpools=(1,)))
def test_kpool_one_is_the_identity(spec):
    batch = build(spec)
    batch.gate = (batch.gate.astype(np.float32) * 1000).astype(batch.gate.dtype)
    got = emulate.kpool_compress(*batch.args())
    np.testing.assert_array_equal(bits(got), bits(batch.k))


@given(spec=batches(), value=st.floats(-50, 50, width=16))
def test_constant_gate_and_zero_ape_give_the_mean(spec, value):
    batch = build(spec)
    batch.gate = np.full_like(batch.gate, value)
    batch.ape = np.zeros_like(batch.ape)
    kpool = spec["kpool"]
    got = emulate.kpool_compress(*batch.args()).astype(np.float64)
    pools = pool_row_offsets(batch.input_row_offsets, batch.cache_lengths, kpool)
    call = _call(batch, int(pools[-1]))
    first, ok = reference.member_rows(call, int(pools[-1]), batch.input_row_offsets, batch.cache_lengths, pools)
    assert ok.all()
    mean = batch.k[first[:, None] + np.arange(kpool)].astype(np.float64).mean(axis=1)
    atol, rtol = TOLERANCES[spec["dtype"]]
    np.testing.assert_allclose(got, mean, atol=atol, rtol=rtol)


@given(spec=batches(), shifts=st.lists(st.floats(-200, 200), min_size=8, max_size=8))
def test_adding_a_constant_to_a_pools_gate_changes_nothing(spec, shifts):
    # Softmax is shift-invariant per channel: every pool gets its own constant
    # (looked up by request and pool id), added to all its members' gates.
    batch = build({**spec, "dtype": F32})
    kpool = spec["kpool"]
    before = emulate.kpool_compress(*batch.args())
    offsets, cache = batch.input_row_offsets, batch.cache_lengths
    shift_of_row = np.zeros(batch.gate.shape[0], np.float32)
    for b in range(len(cache)):
        positions = cache[b] + np.arange(offsets[b + 1] - offsets[b])
        shift_of_row[offsets[b] : offsets[b + 1]] = np.take(shifts, (7 * b + positions // kpool) % len(shifts))
    batch.gate = batch.gate + shift_of_row[:, None]
    after = emulate.kpool_compress(*batch.args()).astype(np.float64)
    # Not bit for bit: gate + shift and + ape each round in float32, at most
    # 2^-16 for logits below 256, so each weight moves by a factor within
    # exp(+-2^-14) and the pooled value by at most ~2^-13 * 2 max|k| (< 6)
    # ~ 1.5e-3. A wrong (per-member or unshifted) softmax is off by O(1).
    np.testing.assert_allclose(after, before, atol=1.5e-3, rtol=0)


@given(spec=batches())
def test_emulate_and_reference_agree(spec):
    batch = build(spec)
    got = emulate.kpool_compress(*batch.args()).astype(np.float64)
    want = reference.kpool_compress(*batch.args()).astype(np.float64)
    # Each is within (atol, rtol) of the exact value, so of each other within twice that.
    atol, rtol = TOLERANCES[spec["dtype"]]
    np.testing.assert_allclose(got, want, atol=2 * atol, rtol=2 * rtol)


def _call(batch, pools: int) -> SimpleNamespace:
    """What reference.member_rows reads of a launch: the call's batch, tokens and kpool, and the pool count the
    launch guesses by (the exact one, as the host passes when it knows it)."""
    from kpool_cupy.ops.compress import check_compress_args
    from kpool_cupy.ops.framework.spec import CallArgs

    arrays = dict(k=batch.k, gate=batch.gate, ape=batch.ape, input_row_offsets=batch.input_row_offsets)
    arrays |= dict(cache_lengths=batch.cache_lengths, pool_row_offsets=None, out=None)
    call = check_compress_args(CallArgs(**arrays, out_dtype=None, rotate=False))
    sizes = {"batch": call.batch, "total_tokens": call.total_tokens, "kpool": call.kpool}
    return SimpleNamespace(**sizes, guess_pools=max(pools, 1))
