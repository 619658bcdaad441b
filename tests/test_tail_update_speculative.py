"""Speculative decoding on a ring longer than a pool: rejected drafts never corrupt a pool.

A decode step brings next_n tokens; any suffix of them may be rejected and
the next step restarts at the first rejected position. kpool_tail_update's
docstring proves that with ring >= kpool + next_n - 1 rows every pool closed
by an accepted token has the bits one kpool_compress over the accepted
sequence gives. These schedules check it, after a chunked prefill, on every
ring form (one array or a split pair with float32 gate scores, contiguous
or padded), on both CPU backends, and check that one row fewer breaks it.
"""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16

from kpool_cupy import emulate, reference

HEAD_DIM = 16


# A ring's forms: one array or a pair (key_ring, gate_ring) with float32 gate
# scores beside bf16 keys (SGLang's layout), each contiguous or a view into a
# padded buffer.
FORMS = ("single", "single-padded", "split", "split-padded")


def _array(shape: tuple[int, ...], dtype, padded: bool, rng: np.random.Generator, place=lambda a: a):
    """An array of ``shape``, contiguous or a view padded on every dim (the middle ones stepped by 2 where
    there are two); its buffer and the view's mask in it. Rows are padded by 4 elements per byte of the
    dtype, so a split ring's two arrays step by different strides."""
    if not padded:
        buffer = place(rng.standard_normal(shape).astype(dtype))
        return buffer, buffer, np.ones(shape, bool)
    *outer, rows, head_dim = shape
    row = head_dim + 4 * np.dtype(dtype).itemsize
    buffer = rng.standard_normal((outer[0] + 1, *(2 * n - 1 for n in outer[1:]), rows + 3, row))
    buffer = place(buffer.astype(dtype))
    index = (slice(1, None), *(slice(None, None, 2) for _ in outer[1:]), slice(2, rows + 2), slice(None, head_dim))
    mask = np.zeros(buffer.shape, bool)
    mask[index] = True
    return buffer[index], buffer, mask


def _ring(max_slots: int, rows: int, form: str, rng: np.random.Generator, place):
    """A ring of ``form`` (its arrays made by ``place`` from host ones), its gate dtype, and (buffer, mask of
    the ring in it) per array."""
    padded = form.endswith("padded")
    if form.startswith("split"):
        keys, key_buffer, key_mask = _array((max_slots, rows, HEAD_DIM), BF16, padded, rng, place)
        gates, gate_buffer, gate_mask = _array((max_slots, rows, HEAD_DIM), np.float32, padded, rng, place)
        return (keys, gates), np.dtype(np.float32), [(key_buffer, key_mask), (gate_buffer, gate_mask)]
    tail, buffer, mask = _array((max_slots, 2, rows, HEAD_DIM), BF16, padded, rng, place)
    return tail, BF16, [(buffer, mask)]


def _run_schedule(
    module, kpool, next_n, rows, *, form, seed, requests=3, generations=1, place=lambda a: a, host=lambda a: a
):
    """Chunked prefill, then decode steps with random rejections; returns (pools got, pools wanted).

    With generations > 1 every request ends and a new one takes its slot,
    the ring left as the last one left it (slot reuse). ``place`` puts the
    ring's buffers where ``module`` computes, ``host`` brings one back.
    """
    rng = np.random.default_rng(seed)
    total = 6 * kpool + 4 * next_n + 7  # each request's accepted sequence, longer than any schedule needs
    ape = rng.standard_normal((kpool, HEAD_DIM)).astype(np.float32)
    tail, gate_dtype, buffers = _ring(requests + 1, rows, form, rng, place)
    outside = [host(buffer).copy() for buffer, _ in buffers]
    slots = rng.permutation(requests + 1)[:requests].astype(np.int32)  # slots need not follow requests
    got: dict[tuple[int, int, int], bytes] = {}
    wanted: dict[tuple[int, int, int], bytes] = {}
    for generation in range(generations):
        keys = rng.standard_normal((requests, total, HEAD_DIM)).astype(BF16)
        gates = (3 * rng.standard_normal((requests, total, HEAD_DIM))).astype(gate_dtype)

        # Chunked prefill, each request on its own: ring close, compress, seed tail.
        lengths = rng.integers(1, 2 * kpool + 2, size=(requests, 2))
        position = np.zeros(requests, np.int64)
        for b in range(requests):
            for chunk in lengths[b]:
                start, end = int(position[b]), int(position[b] + chunk)
                k, gate = keys[b, start:end], gates[b, start:end]
                offsets, cache, slot = np.array([0, chunk], np.int32), np.array([start], np.int32), slots[b : b + 1]
                pooled, closed = module.kpool_ring_close(tail, k, gate, ape, offsets, cache, slot)
                if closed[0] >= 0:
                    got[(generation, b, int(closed[0]))] = pooled[0].tobytes()
                compressed = module.kpool_compress(k, gate, ape, offsets, cache)
                first = -(-start // kpool)
                for i in range(compressed.shape[0]):
                    got[(generation, b, first + i)] = compressed[i].tobytes()
                module.kpool_seed_tail(tail, k, gate, offsets, cache, slot, kpool=kpool)
                position[b] = end

        # Decode: each step drafts next_n tokens, a random number are accepted.
        for _ in range(6):
            positions = position[:, None] + np.arange(next_n)
            accepted = rng.integers(0, next_n + 1, size=requests)
            step_k = rng.standard_normal((requests, next_n, HEAD_DIM)).astype(BF16)  # drafts: garbage
            step_gate = (3 * rng.standard_normal((requests, next_n, HEAD_DIM))).astype(gate_dtype)
            for b in range(requests):
                n = int(accepted[b])
                step_k[b, :n] = keys[b, position[b] : position[b] + n]
                step_gate[b, :n] = gates[b, position[b] : position[b] + n]
            pooled, closed = module.kpool_tail_update(tail, step_k, step_gate, ape, positions.astype(np.int32), slots)
            for b in range(requests):
                for j, pool in enumerate(closed[b]):
                    if pool >= 0 and pool * kpool + kpool - 1 < position[b] + accepted[b]:  # an accepted close
                        got[(generation, b, int(pool))] = pooled[b, j].tobytes()
            position += accepted

        for b in range(requests):
            n = int(position[b])
            offsets, cache = np.array([0, n], np.int32), np.zeros(1, np.int32)
            one_call = module.kpool_compress(keys[b, :n], gates[b, :n], ape, offsets, cache)
            for pool in range(one_call.shape[0]):
                wanted[(generation, b, pool)] = one_call[pool].tobytes()

    # Nothing outside the ring's views was touched.
    for (buffer, mask), before in zip(buffers, outside, strict=True):
        assert host(buffer)[~mask].tobytes() == before[~mask].tobytes()
    return got, wanted


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
@pytest.mark.parametrize(("kpool", "next_n"), [(1, 1), (1, 4), (2, 3), (4, 1), (4, 4), (4, 8), (8, 2), (16, 5)])
@pytest.mark.parametrize("form", FORMS)
def test_every_accepted_pool_is_the_one_call_pool_on_a_ring_at_the_bound_and_longer(module, kpool, next_n, form):
    bound = kpool + next_n - 1
    for rows in sorted({bound, max(bound, 2 * kpool), max(bound, 16)}):
        for seed in range(3):
            got, wanted = _run_schedule(module, kpool, next_n, rows, form=form, seed=seed)
            assert set(got) <= set(wanted), sorted(set(got) - set(wanted))
            # Every pool the accepted sequence completes came out of some call.
            assert set(got) == set(wanted), sorted(set(wanted) - set(got))
            bad = [key for key in wanted if got[key] != wanted[key]]
            assert not bad, (rows, seed, bad[:5])


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_a_slot_reused_by_a_new_request_starts_clean(module):
    # Each request ends and a new one takes its slot, the ring as left: the
    # new sequences' pools come out as one compress each.
    for (kpool, next_n), form in zip(((4, 3), (3, 5)), ("single-padded", "split-padded"), strict=True):
        got, wanted = _run_schedule(module, kpool, next_n, kpool + next_n - 1, form=form, seed=9, generations=3)
        assert set(got) == set(wanted) and all(got[key] == wanted[key] for key in wanted)


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_one_row_below_the_bound_a_rejected_draft_corrupts_a_pool(module):
    # kpool 4, next_n 4: the bound is 7 rows. At 6, some schedule lets a
    # rejected draft overwrite a member of the pool open at the restart.
    corrupted = 0
    for seed in range(12):
        got, wanted = _run_schedule(module, 4, 4, 6, form="single", seed=seed)
        corrupted += sum(got.get(key) != value for key, value in wanted.items())
    assert corrupted > 0


@pytest.mark.gpu
@pytest.mark.parametrize("form", FORMS)
def test_gpu_every_accepted_pool_is_the_one_call_pool(form):
    # The GPU path with the ring on the device (padded views made there) and
    # every other array sent over per call.
    import cupy
    from test_gpu_lifecycle import CupyBackend

    for kpool, next_n in ((4, 4), (3, 5)):
        rows = max(kpool + next_n - 1, 2 * kpool)
        got, wanted = _run_schedule(
            CupyBackend(), kpool, next_n, rows, form=form, seed=5, place=cupy.asarray, host=cupy.asnumpy
        )
        assert set(got) == set(wanted) and all(got[key] == wanted[key] for key in wanted), (kpool, next_n)
