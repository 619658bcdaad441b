"""What `kpool-cupy check --op` compares for each op, on one check case.

Pooled values meet the float64 reference within ``accuracy.allowed_error``;
everything else must be equal bit for bit: the pool ids a call reports, the
rows it leaves alone, the ring after a stash, expanded positions, and FP8
bytes and scales, which must be the NumPy epilogue of the backend's own
float32 pooling (the GPU's exp2 and reciprocal are approximations, so the
FP8 ops are checked against the pooling they fuse, and that pooling against
float64). The ring ops start from a ring of noise that holds each request's
pending tokens at rows ``pos % ring``, on a ring one row longer than kpool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from .. import reference
from ..backends.reference_epilogue import epilogue, rotate
from ..ops.fp8_target import check_rotation_head_dim
from ..pool_offsets import pool_row_offsets
from .accuracy import compare
from .cache_places import empty_cache, filled_cache, places
from .cases import SENTINEL, Case


@dataclass
class Backend:
    """An op module with its way in and out: NumPy arrays as they are, or copies on the device."""

    ops: Any
    put: Callable[[np.ndarray], Any]
    get: Callable[[Any], np.ndarray]


@dataclass
class Verdict:
    rows: int  # the rows compared: pools, ring rows, selected ids or quantized rows
    mismatches: int  # elements that had to be equal bit for bit and were not
    accuracy: dict[str, float] | None  # accuracy.compare of the pooled values; None where nothing pools

    @property
    def ok(self) -> bool:
        return self.mismatches == 0 and (self.accuracy is None or bool(self.accuracy["ok"]))


def _differ(got: np.ndarray, want: np.ndarray) -> int:
    """Elements whose bytes differ; a shape mismatch counts every element."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return max(got.size, want.size, 1)
    if got.size == 0:
        return 0
    width = got.dtype.itemsize
    raw = np.ascontiguousarray(got).view(np.uint8).reshape(-1, width)
    expected = np.ascontiguousarray(want).view(np.uint8).reshape(-1, width)
    return int(np.any(raw != expected, axis=1).sum())


def _bounds(keys: np.ndarray, gates: np.ndarray, ape: np.ndarray) -> tuple[float, float]:
    """The largest |key| and |gate + ape| bound accuracy.compare takes."""
    max_key = float(np.abs(keys.astype(np.float32)).max(initial=0.0))
    return max_key, float(np.abs(gates.astype(np.float32)).max(initial=0.0)) + float(np.abs(ape).max(initial=0.0))


def _lengths(case: Case) -> tuple[np.ndarray, np.ndarray]:
    offsets = case.input_row_offsets.astype(np.int64)
    return np.diff(offsets), case.cache_lengths.astype(np.int64)


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
    lengths, cache = _lengths(case)
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
    lengths, cache = _lengths(case)
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


def _float64_pools(case: Case, dtype: np.dtype) -> np.ndarray:
    """The case's pools from float64 math, rounded once to ``dtype``."""
    arrays = (case.k, case.gate, case.ape, case.input_row_offsets, case.cache_lengths)
    return reference.kpool_compress(*arrays, out_dtype=dtype, accumulate="float64")


def check_compress(backend: Backend, case: Case, kpool: int, rng: np.random.Generator) -> Verdict:
    extra = {name: backend.put(value.copy() if name == "out" else value) for name, value in case.extra.items()}
    args = [backend.put(a) for a in (case.k, case.gate, case.ape, case.input_row_offsets, case.cache_lengths)]
    got = backend.get(backend.ops.kpool_compress(*args, **extra))
    want = _float64_pools(case, got.dtype)
    pools = want.shape[0]
    surplus = got[pools:]  # an over-sized out's extra rows stay as they were
    mismatches = int((surplus.astype(np.float32) != SENTINEL).sum())
    if got.shape[1] != case.k.shape[1] or (got.shape[0] != pools and "out" not in case.extra):
        mismatches += max(got.size, 1)
    accuracy = compare(got[:pools], want.astype(np.float64), got.dtype, kpool, *_bounds(case.k, case.gate, case.ape))
    if rotates(case.k.shape[1]):
        offsets = {n: v for n, v in extra.items() if n == "pool_row_offsets"}
        pooled = backend.get(backend.ops.kpool_compress(*args, out_dtype="float32", **offsets))
        rotated = backend.get(backend.ops.kpool_compress(*args, rotate=True, **offsets))
        mismatches += _differ(rotated, rotation(pooled, rotated.dtype))
    return Verdict(pools, mismatches, accuracy)


def rotates(head_dim: int) -> bool:
    """Whether ``rotate=True`` takes this head_dim (a power of two from 8 to 256)."""
    try:
        check_rotation_head_dim("head_dim", head_dim)
    except ValueError:
        return False
    return True


def rotation(pooled: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """What ``rotate=True`` writes for float32 pools: the bf16 rotation of their bf16 rounding, in ``dtype``."""
    x = pooled.reshape(-1, pooled.shape[-1]).astype(ml_dtypes.bfloat16).astype(np.float32)
    return rotate(x, ml_dtypes.bfloat16).astype(dtype).reshape(pooled.shape)


def _closes(case: Case, kpool: int) -> list[list[int]]:
    """The pools each request's call closes: q with a closing position (q + 1) * kpool - 1 among its tokens."""
    lengths, cache = _lengths(case)
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
    return _got(backend, result), backend.get(ring)


def _got(backend: Backend, result: Any) -> Any:
    """An op's result on the host: an array, a tuple of them, or None."""
    if result is None:
        return None
    return tuple(backend.get(r) for r in result) if isinstance(result, tuple) else backend.get(result)


# An FP8 form run at a round_scale, into the rows or the cache in its keyword arguments:
# what it returned and the ring after it (None for an op without one).
Fused = Callable[..., tuple[Any, "np.ndarray | None"]]


def fp8_mismatches(
    backend: Backend,
    fused: Fused,
    pooled: np.ndarray,
    want_closed: np.ndarray | None,
    pools: list[list[int]],
    rng: np.random.Generator,
    slot_per: str | None,
    ring: np.ndarray | None,
) -> int:
    """The FP8 form into rows, then into a paged cache, against the epilogue of the float32 ``pooled`` rows.

    Rows: the closed ids, bytes and scales of the rows something closed into.
    Cache (``cache_places``): those bytes and scales at each pool's slot,
    nothing else written, the same ids. Both leave ``ring`` as the plain op did.
    """
    round_scale = bool(rng.integers(2))
    done = np.ones(len(pooled), bool) if want_closed is None else want_closed >= 0
    want_values, want_scales = epilogue(pooled[done], round_scale)
    (values, scales, *closed), ring_after = fused(round_scale)
    mismatches = _differ(values[done], want_values) + _differ(scales[done].reshape(-1), want_scales)
    mismatches += sum(_differ(c, want_closed) for c in closed) + (_differ(ring_after, ring) if ring is not None else 0)
    where = places(pools, rng, slot_per)
    if where is not None:
        cache = backend.put(empty_cache(where, pooled.shape[-1]))
        result, ring_after = fused(round_scale, cache=cache, **{n: backend.put(v) for n, v in where.target.items()})
        mismatches += _differ(backend.get(cache), filled_cache(where, want_values, want_scales))
        mismatches += _differ(result, want_closed) if want_closed is not None else int(result is not None)
        mismatches += _differ(ring_after, ring) if ring is not None else 0
    return mismatches


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
    mismatches = _differ(closed, want_closed) + int((pooled[~done] != SENTINEL).sum())
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
    verdict = _pooled_verdict(pooled, closed, want_closed, want, _bounds(state.k, state.gate, case.ape), kpool)
    verdict.mismatches += _differ(ring, state.ring)  # read, never written
    if rotates(case.k.shape[1]):  # the same rows rotated, the others left alone
        (rotated, _), _ = _ring_close(backend, case, state, None, rotate=True)
        done = want_closed >= 0
        verdict.mismatches += _differ(rotated[done], rotation(pooled[done], np.dtype(np.float32)))
        verdict.mismatches += int((rotated[~done] != SENTINEL).sum())
    if fp8:

        def fused(round_scale: bool, **target: Any) -> tuple[Any, np.ndarray]:
            return _ring_close(backend, case, state, round_scale, **target)

        verdict.mismatches += fp8_mismatches(backend, fused, pooled, want_closed, first, rng, "request", state.ring)
    return verdict


def _decode(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The case as one decode step: k, gate ``[R, next_n, D]`` and positions, padded with -1 (unsigned: all ones)."""
    lengths, cache = _lengths(case)
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
    bounds = _bounds(state.k, state.gate, case.ape)
    verdict = _pooled_verdict(pooled, closed, want_closed, whole[picked], bounds, kpool)
    want_ring = state.ring.copy()  # every real token at row pos % ring, in order
    for b in range(requests):
        for j in np.flatnonzero(_real(positions[b])):
            want_ring[state.slots[b], :, int(positions[b, j]) % want_ring.shape[2]] = (k[b, j], gate[b, j])
    verdict.mismatches += _differ(backend.get(ring), want_ring)
    if rotates(head_dim):  # the same rows rotated, the others left alone
        fresh, done = backend.put(state.ring.copy()), want_closed >= 0
        out = backend.put(np.full((requests, per_request, head_dim), SENTINEL, np.float32))
        rotated, _ = (backend.get(r) for r in backend.ops.kpool_tail_update(fresh, *inputs, out=out, rotate=True))
        verdict.mismatches += _differ(rotated[done], rotation(pooled[done], np.dtype(np.float32)))
        verdict.mismatches += int((rotated[~done] != SENTINEL).sum())
    if fp8:

        def fused(round_scale: bool, **target: Any) -> tuple[Any, np.ndarray]:
            fresh = backend.put(state.ring.copy())
            result = backend.ops.kpool_tail_update_fp8(fresh, *inputs, round_scale=round_scale, **target)
            return _got(backend, result), backend.get(fresh)

        verdict.mismatches += fp8_mismatches(backend, fused, pooled, want_closed, pools, rng, None, want_ring)
    return verdict


def index_dtype(end: int, rng: np.random.Generator) -> np.dtype:
    """int32, uint32 or int64 at random, among those that hold values below ``end`` and -1 (uint32: all ones)."""
    fits = [
        np.dtype(t) for t, top in ((np.int32, 2**31 - 1), (np.uint32, 2**32 - 1), (np.int64, 2**63 - 1)) if end <= top
    ]
    return fits[int(rng.integers(len(fits)))]


def _real(positions: np.ndarray) -> np.ndarray:
    """Entries that are tokens: not -1, nor its unsigned all-ones form."""
    return positions != (np.iinfo(positions.dtype).max if positions.dtype.kind == "u" else -1)


def check_seed_tail(backend: Backend, case: Case, kpool: int, rng: np.random.Generator) -> Verdict:
    state = pending(case, kpool, rng)
    ring = backend.put(state.ring.copy())
    args = (case.k, case.gate, case.input_row_offsets, case.cache_lengths, state.slots)
    backend.ops.kpool_seed_tail(ring, *(backend.put(a) for a in args))
    lengths, cache = _lengths(case)
    offsets = case.input_row_offsets.astype(np.int64)
    want, rows = state.ring.copy(), state.ring.shape[2]
    stashed = 0
    for b, (c, n) in enumerate(zip(cache, lengths, strict=True)):
        for pos in range(max(c + n - rows, c), c + n):  # the call's last min(n, ring) tokens
            token = offsets[b] + pos - c
            want[state.slots[b], :, pos % rows] = (case.k[token], case.gate[token])
            stashed += 1
    return Verdict(stashed, _differ(backend.get(ring), want), None)


EXPAND_TOKENS = 64


def check_expand_topk(backend: Backend, case: Case, kpool: int, rng: np.random.Generator) -> Verdict:
    """Random ids among each token's visible pools (and -1), plain, with the tail and compact, and paged.

    Each request keeps its last ``EXPAND_TOKENS`` tokens at their positions
    (the cache grows by what is dropped): a row of positions is about
    ``4 * kpool`` wide, so the whole case would grow with kpool squared.
    """
    lengths, cache = _lengths(case)
    kept = np.minimum(lengths, EXPAND_TOKENS)
    cache, lengths = cache + lengths - kept, kept
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(case.input_row_offsets.dtype)
    case = Case(case.name, case.k, case.gate, case.ape, offsets, cache.astype(case.cache_lengths.dtype))
    visible = np.concatenate([(c + np.arange(n) + 1) // kpool for c, n in zip(cache, lengths, strict=True)])
    ids = rng.integers(-1, visible[:, None], (len(visible), 3))  # -1 alone where no pool is visible yet
    ids = ids.astype(index_dtype(int(ids.max(initial=0)) + 1, rng))
    calls = [{"always_select_tail": tail, "compact": compact} for tail in (False, True) for compact in (False, True)]
    top = int((cache + lengths).max(initial=0))
    if top <= 2**16:  # a block table over every position: small caches only
        block_size = 16
        blocks = -(-top // block_size) + 1
        table = rng.permutation(len(lengths) * blocks).astype(np.int32).reshape(len(lengths), blocks)
        calls += [{**options, "block_table": table, "block_size": block_size} for options in calls]
    base = (ids, case.input_row_offsets, case.cache_lengths)
    mismatches = 0
    for options in calls:
        on_device = {n: backend.put(v) if isinstance(v, np.ndarray) else v for n, v in options.items()}
        got = backend.ops.kpool_expand_topk(*(backend.put(a) for a in base), kpool=kpool, **on_device)
        want = reference.kpool_expand_topk(*base, kpool=kpool, **options)
        if options.get("compact"):  # (positions, counts)
            mismatches += _differ(backend.get(got[0]), want[0]) + _differ(backend.get(got[1]), want[1])
        else:
            mismatches += _differ(backend.get(got), want)
    return Verdict(int((ids >= 0).sum()), mismatches, None)


def check_compress_fp8(backend: Backend, case: Case, kpool: int, rng: np.random.Generator) -> Verdict:
    """The fused rows and cache against the epilogue of the backend's own float32 compress, which meets float64."""
    extra = {n: backend.put(v) for n, v in case.extra.items() if n == "pool_row_offsets"}
    args = [backend.put(a) for a in (case.k, case.gate, case.ape, case.input_row_offsets, case.cache_lengths)]
    pooled = backend.get(backend.ops.kpool_compress(*args, out_dtype="float32", **extra))
    want = _float64_pools(case, np.dtype(np.float32))
    accuracy = compare(pooled, want.astype(np.float64), np.float32, kpool, *_bounds(case.k, case.gate, case.ape))
    lengths, cache = _lengths(case)
    pools = [list(range(-(-int(c) // kpool), int(c + n) // kpool)) for c, n in zip(cache, lengths, strict=True)]

    def fused(round_scale: bool, **target: Any) -> tuple[Any, None]:
        return _got(backend, backend.ops.kpool_compress_fp8(*args, round_scale=round_scale, **extra, **target)), None

    return Verdict(len(pooled), fp8_mismatches(backend, fused, pooled, None, pools, rng, "pool", None), accuracy)


QUERY_ROWS = 4096


def check_hadamard_quant_fp8(backend: Backend, case: Case, kpool: int, rng: np.random.Generator) -> Verdict:
    """The query side has no approximation in it: the reference's bytes and scales exactly.

    It takes no kpool: the case's first ``QUERY_ROWS`` key rows are enough
    (the whole of a kpool-1024 case took 1.1 GB in the reference).
    """
    round_scale = bool(rng.integers(2))
    x = case.k[:QUERY_ROWS]
    result = backend.ops.hadamard_quant_fp8(backend.put(x), round_scale=round_scale)
    values, scales = (backend.get(r) for r in result)
    want_values, want_scales = reference.hadamard_quant_fp8(x, round_scale=round_scale)
    return Verdict(x.shape[0], _differ(values, want_values) + _differ(scales, want_scales), None)


def _fp8(check: Callable[..., Verdict]) -> Callable[[Backend, Case, int, np.random.Generator], Verdict]:
    def fused(backend: Backend, case: Case, kpool: int, rng: np.random.Generator) -> Verdict:
        return check(backend, case, kpool, rng, fp8=True)

    return fused


# Each op's check, by the op's name without ``kpool_`` (as under torch.ops.kpool), and what its rows are.
OP_CHECKS: dict[str, tuple[Callable[[Backend, Case, int, np.random.Generator], Verdict], str]] = {
    "compress": (check_compress, "pools"),
    "ring_close": (check_ring_close, "pools"),
    "seed_tail": (check_seed_tail, "ring rows"),
    "tail_update": (check_tail_update, "pools"),
    "expand_topk": (check_expand_topk, "ids"),
    "compress_fp8": (check_compress_fp8, "pools"),
    "ring_close_fp8": (_fp8(check_ring_close), "pools"),
    "tail_update_fp8": (_fp8(check_tail_update), "pools"),
    "hadamard_quant_fp8": (check_hadamard_quant_fp8, "rows"),
}
