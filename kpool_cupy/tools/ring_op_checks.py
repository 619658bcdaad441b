"""What `kpool-cupy check --op` compares for the ring ops: ring close, tail update, seed tail (and their FP8 forms).

They start from a ring of noise that holds each request's pending tokens at
rows ``pos % ring``, on a ring one row longer than kpool; the pools they close
meet one float64 compress over each request's pending-and-new tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import reference
from ..pool_offsets import pool_row_offsets
from .accuracy import compare
from .cases import SENTINEL, Case
from .op_check_parts import (
    Backend,
    Verdict,
    accuracy_bounds,
    differ,
    fp8_mismatches,
    index_dtype,
    on_host,
    rotates,
    rotation,
    token_counts,
)


@dataclass
class Pending:
    """Each request's unfinished pool before the call, put in a ring, and the sequence it continues."""

    ring: np.ndarray  # [R, 2, kpool + 1, D] noise, the pending tokens at rows pos % ring
    slots: np.ndarray  # request b's ring is slot slots[b]
    k: np.ndarray  # per request: its pending tokens, then the call's
    gate: np.ndarray
    offsets: np.ndarray
    starts: np.ndarray  # the position of each request's first pending token: its pool's start


def pending(case: Case, kpool: int, rng: np.random.Generator) -> Pending:
    lengths, cache = token_counts(case)
    head_dim, dtype = case.k.shape[1], case.k.dtype
    requests, ring = len(lengths), kpool + 1
    pending_counts = cache % kpool
    starts = cache - pending_counts
    noise = rng.standard_normal((requests, 2, ring, head_dim)).astype(np.float32).astype(dtype)
    slots = rng.permutation(requests).astype(index_dtype(requests, rng))
    before = (rng.standard_normal((2, int(pending_counts.sum()), head_dim)) * [[[1.0]], [[3.0]]]).astype(dtype)
    keys, gates, row = [], [], 0
    offsets = case.input_row_offsets.astype(np.int64)
    for b in range(requests):
        count = int(pending_counts[b])
        for m in range(count):
            noise[slots[b], :, (int(starts[b]) + m) % ring] = before[:, row + m]
        keys += [before[0, row : row + count], case.k[offsets[b] : offsets[b + 1]]]
        gates += [before[1, row : row + count], case.gate[offsets[b] : offsets[b + 1]]]
        row += count
    joined = np.concatenate([[0], np.cumsum(pending_counts + lengths)]).astype(np.int64)
    return Pending(noise, slots, np.concatenate(keys), np.concatenate(gates), joined, starts)


def within_closed_ids(case: Case, kpool: int) -> Case:
    """The case with each cache moved down by a multiple of ``kpool * (kpool + 1)`` until its pool ids fit int32.

    The ring ops report pool ids in int32 ``closed`` and refuse a call whose
    ids would not fit; the move keeps each position's phase in its pool and
    its ring row, and at kpool >= 2 keeps positions past 2^32.
    """
    lengths, cache = token_counts(case)
    period = kpool * (kpool + 1)
    last = (2**31 - 1) * kpool  # the first position of pool 2^31 - 1; its pool is the last that fits
    over = np.maximum(cache + lengths - last, 0)
    moved = cache - -(-over // period) * period
    if not over.any():
        return case
    return Case(case.name, case.k, case.gate, case.ape, case.input_row_offsets, moved.astype(case.cache_lengths.dtype))


def _whole_pools(state: Pending, ape: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Every pool of the pending-and-new sequences from float64 math, rounded once to ``dtype``; their row offsets."""
    kpool = ape.shape[0]
    rows = pool_row_offsets(state.offsets, state.starts, kpool)
    out = np.empty((int(rows[-1]), ape.shape[1]), dtype)
    want = reference.kpool_compress(
        state.k, state.gate, ape, state.offsets, state.starts, out=out, accumulate="float64"
    )
    return want, rows


def _closes(case: Case, kpool: int) -> list[list[int]]:
    """The pools each request's call closes: q with a closing position (q + 1) * kpool - 1 among its tokens."""
    lengths, cache = token_counts(case)
    return [list(range(int(c) // kpool, int(c + n) // kpool)) for c, n in zip(cache, lengths, strict=True)]


def _ring_close(
    backend: Backend, case: Case, state: Pending, round_scale: bool | None, **options: Any
) -> tuple[Any, np.ndarray]:
    """Ring close on a copy of the pending ring, with ``options``: into a float32 out of sentinels, or the FP8
    form at ``round_scale``; what it returned and the ring after it."""
    inputs = (case.k, case.gate, case.ape, case.input_row_offsets, case.cache_lengths, state.slots)
    ring = backend.put(state.ring.copy())
    args = (ring, *(backend.put(a) for a in inputs))
    if round_scale is not None:
        result = backend.ops.kpool_ring_close_fp8(*args, round_scale=round_scale, **options)
    else:
        out = backend.put(np.full((len(state.slots), case.k.shape[1]), SENTINEL, np.float32))
        result = backend.ops.kpool_ring_close(*args, out=out, **options)
    return on_host(backend, result), backend.get(ring)


def _pooled_verdict(
    pooled: np.ndarray,
    closed: np.ndarray,
    want_closed: np.ndarray,
    want: np.ndarray,
    bounds: tuple[float, float],
    kpool: int,
) -> Verdict:
    """Pool ids exactly, rows nothing closed into left alone, closed rows within the bound."""
    done = want_closed >= 0
    mismatches = differ(closed, want_closed) + int((pooled[~done] != SENTINEL).sum())
    accuracy = compare(pooled[done], want.astype(np.float64), np.float32, kpool, *bounds)
    return Verdict(int(done.sum()), mismatches, accuracy)


def check_ring_close(backend: Backend, case: Case, kpool: int, rng: np.random.Generator, fp8: bool = False) -> Verdict:
    case = within_closed_ids(case, kpool)
    state = pending(case, kpool, rng)
    (pooled, closed), ring = _ring_close(backend, case, state, None)
    # The pool the cached prefix opened, where the call completes it.
    cache = case.cache_lengths.astype(np.int64)
    first = [q[:1] if q and q[0] * kpool < c else [] for q, c in zip(_closes(case, kpool), cache, strict=True)]
    want_closed = np.array([q[0] if q else -1 for q in first], np.int32)
    whole, rows = _whole_pools(state, case.ape, np.dtype(np.float32))
    want = whole[rows[:-1][want_closed >= 0]]  # each request's first pool of the pending-and-new sequence
    verdict = _pooled_verdict(pooled, closed, want_closed, want, accuracy_bounds(state.k, state.gate, case.ape), kpool)
    verdict.mismatches += differ(ring, state.ring)  # read, never written
    if rotates(case.k.shape[1]):  # the same rows rotated, the others left alone
        (rotated, _), _ = _ring_close(backend, case, state, None, rotate=True)
        done = want_closed >= 0
        verdict.mismatches += differ(rotated[done], rotation(pooled[done], np.dtype(np.float32)))
        verdict.mismatches += int((rotated[~done] != SENTINEL).sum())
    if fp8:

        def fused(round_scale: bool, **target: Any) -> tuple[Any, np.ndarray]:
            return _ring_close(backend, case, state, round_scale, **target)

        verdict.mismatches += fp8_mismatches(backend, fused, pooled, want_closed, first, rng, "request", state.ring)
    return verdict


def _decode(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The case as one decode step: k, gate ``[R, next_n, D]`` and positions, padded with -1 (unsigned: all ones)."""
    lengths, cache = token_counts(case)
    next_n = max(int(lengths.max(initial=0)), 1)
    dtype = index_dtype(int((cache + lengths).max(initial=0)), rng)
    head_dim = case.k.shape[1]
    k = np.zeros((len(lengths), next_n, head_dim), case.k.dtype)
    gate = np.zeros_like(k)
    positions = np.full((len(lengths), next_n), -1, np.int64)
    offsets = case.input_row_offsets.astype(np.int64)
    for b, (c, n) in enumerate(zip(cache, lengths, strict=True)):
        k[b, :n] = case.k[offsets[b] : offsets[b] + n]
        gate[b, :n] = case.gate[offsets[b] : offsets[b] + n]
        positions[b, :n] = np.arange(c, c + n)
    return k, gate, positions.astype(dtype)


def check_tail_update(backend: Backend, case: Case, kpool: int, rng: np.random.Generator, fp8: bool = False) -> Verdict:
    case = within_closed_ids(case, kpool)
    state = pending(case, kpool, rng)
    k, gate, positions = _decode(case, rng)
    requests, next_n, head_dim = k.shape
    per_request = -(-next_n // kpool)
    ring = backend.put(state.ring.copy())
    inputs = tuple(backend.put(a) for a in (k, gate, case.ape, positions, state.slots))
    out = backend.put(np.full((requests, per_request, head_dim), SENTINEL, np.float32))
    pooled, closed = (backend.get(r) for r in backend.ops.kpool_tail_update(ring, *inputs, out=out))
    want_closed = np.full((requests, per_request), -1, np.int32)
    whole, rows = _whole_pools(state, case.ape, np.dtype(np.float32))
    picked = np.zeros(whole.shape[0], bool)
    pools = _closes(case, kpool)
    for b, closes in enumerate(pools):
        want_closed[b, : len(closes)] = closes
        picked[rows[b] : rows[b] + len(closes)] = True
    bounds = accuracy_bounds(state.k, state.gate, case.ape)
    verdict = _pooled_verdict(pooled, closed, want_closed, whole[picked], bounds, kpool)
    want_ring = state.ring.copy()  # every real token at row pos % ring, in order
    for b in range(requests):
        for j in np.flatnonzero(_real(positions[b])):
            want_ring[state.slots[b], :, int(positions[b, j]) % want_ring.shape[2]] = (k[b, j], gate[b, j])
    verdict.mismatches += differ(backend.get(ring), want_ring)
    if rotates(head_dim):  # the same rows rotated, the others left alone
        fresh, done = backend.put(state.ring.copy()), want_closed >= 0
        out = backend.put(np.full((requests, per_request, head_dim), SENTINEL, np.float32))
        rotated, _ = (backend.get(r) for r in backend.ops.kpool_tail_update(fresh, *inputs, out=out, rotate=True))
        verdict.mismatches += differ(rotated[done], rotation(pooled[done], np.dtype(np.float32)))
        verdict.mismatches += int((rotated[~done] != SENTINEL).sum())
    if fp8:

        def fused(round_scale: bool, **target: Any) -> tuple[Any, np.ndarray]:
            fresh = backend.put(state.ring.copy())
            result = backend.ops.kpool_tail_update_fp8(fresh, *inputs, round_scale=round_scale, **target)
            return on_host(backend, result), backend.get(fresh)

        verdict.mismatches += fp8_mismatches(backend, fused, pooled, want_closed, pools, rng, None, want_ring)
    return verdict


def _real(positions: np.ndarray) -> np.ndarray:
    """Entries that are tokens: not -1, nor its unsigned all-ones form."""
    return positions != (np.iinfo(positions.dtype).max if positions.dtype.kind == "u" else -1)


def check_seed_tail(backend: Backend, case: Case, kpool: int, rng: np.random.Generator) -> Verdict:
    state = pending(case, kpool, rng)
    ring = backend.put(state.ring.copy())
    args = (case.k, case.gate, case.input_row_offsets, case.cache_lengths, state.slots)
    backend.ops.kpool_seed_tail(ring, *(backend.put(a) for a in args))
    lengths, cache = token_counts(case)
    offsets = case.input_row_offsets.astype(np.int64)
    want, rows = state.ring.copy(), state.ring.shape[2]
    stashed = 0
    for b, (c, n) in enumerate(zip(cache, lengths, strict=True)):
        for pos in range(max(c + n - rows, c), c + n):  # the call's last min(n, ring) tokens
            token = offsets[b] + pos - c
            want[state.slots[b], :, pos % rows] = (case.k[token], case.gate[token])
            stashed += 1
    return Verdict(stashed, differ(backend.get(ring), want), None)
