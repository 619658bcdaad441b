"""What `kpool-cupy check --op` compares for each op, on one check case.

Pooled values meet the float64 reference within ``accuracy.allowed_error``;
everything else must be equal bit for bit: the pool ids a call reports, the
rows it leaves alone, the ring after a stash, expanded positions, and FP8
bytes and scales, which must be the NumPy epilogue of the backend's own
float32 pooling (the GPU's exp2 and reciprocal are approximations, so the
FP8 ops are checked against the pooling they fuse, and that pooling against
float64). The ring ops' checks are in ``ring_op_checks``, what every check
is made of in ``op_check_parts``; ``OP_CHECKS`` lists them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import reference
from ..ops.families.scoring import CACHE_LAYOUT
from . import op_check_parts as parts
from .accuracy import compare
from .cases import SENTINEL, Case
from .gradient_accuracy import compare_gradients, gradient_allowed_error
from .index_accuracy import gpu_accumulation_bits, index_logits_agree, index_logits_bound
from .op_check_parts import Backend, Verdict
from .ring_op_checks import check_ring_close, check_seed_tail, check_tail_update


def check_compress(backend: Backend, case: Case, kpool: int, rng: np.random.Generator) -> Verdict:
    extra = {name: backend.put(value.copy() if name == "out" else value) for name, value in case.extra.items()}
    args = [backend.put(a) for a in (case.k, case.gate, case.ape, case.input_row_offsets, case.cache_lengths)]
    got = backend.get(backend.ops.kpool_compress(*args, **extra))
    want = parts.float64_pools(case, got.dtype)
    pools = want.shape[0]
    surplus = got[pools:]  # an over-sized out's extra rows stay as they were
    mismatches = int((surplus.astype(np.float32) != SENTINEL).sum())
    if got.shape[1] != case.k.shape[1] or (got.shape[0] != pools and "out" not in case.extra):
        mismatches += max(got.size, 1)
    accuracy = compare(
        got[:pools], want.astype(np.float64), got.dtype, kpool, *parts.accuracy_bounds(case.k, case.gate, case.ape)
    )
    if parts.rotates(case.k.shape[1]):
        offsets = {n: v for n, v in extra.items() if n == "pool_row_offsets"}
        pooled = backend.get(backend.ops.kpool_compress(*args, out_dtype="float32", **offsets))
        rotated = backend.get(backend.ops.kpool_compress(*args, rotate=True, **offsets))
        mismatches += parts.differ(rotated, parts.rotation(pooled, rotated.dtype))
    return Verdict(pools, mismatches, accuracy)


def check_compress_backward(backend: Backend, case: Case, kpool: int, rng: np.random.Generator) -> Verdict:
    """The three gradients of a random loss against float64 within ``gradient_allowed_error``, and grad_ape
    the same bits on a second call."""
    arrays = (case.k, case.gate, case.ape, case.input_row_offsets, case.cache_lengths)
    pools = int(reference.kpool_compress(*arrays).shape[0])
    grad = rng.standard_normal((pools, case.k.shape[1])).astype(case.k.dtype)
    offsets = {n: v for n, v in case.extra.items() if n == "pool_row_offsets"}
    on_device = [backend.put(a) for a in (grad, *arrays)]
    extra = {n: backend.put(v) for n, v in offsets.items()}
    got = [backend.get(r) for r in backend.ops.kpool_compress_backward(*on_device, **extra)]
    again = backend.get(backend.ops.kpool_compress_backward(*on_device, **extra)[2])
    want = reference.kpool_compress_backward(grad, *arrays, accumulate="float64")
    names = ("grad_k", "grad_gate", "grad_ape")
    key, logit = parts.accuracy_bounds(case.k, case.gate, case.ape)
    largest_grad = float(np.abs(grad.astype(np.float32)).max(initial=0.0))
    bounds = gradient_allowed_error(
        dict(zip(names, (w.astype(np.float64) for w in want), strict=True)),
        {n: w.dtype for n, w in zip(names, want, strict=True)}, kpool, pools, largest_grad, key, logit,
    )  # fmt: skip
    accuracy = compare_gradients(dict(zip(names, got, strict=True)), dict(zip(names, want, strict=True)), bounds)
    return Verdict(pools, parts.differ(again, got[2]), accuracy)


EXPAND_TOKENS = 64


def check_expand_topk(backend: Backend, case: Case, kpool: int, rng: np.random.Generator) -> Verdict:
    """Random ids among each token's visible pools (and -1), plain, with the tail and compact, and paged.

    Each request keeps its last ``EXPAND_TOKENS`` tokens at their positions
    (the cache grows by what is dropped): a row of positions is about
    ``4 * kpool`` wide, so the whole case would grow with kpool squared.
    """
    lengths, cache = parts.token_counts(case)
    kept = np.minimum(lengths, EXPAND_TOKENS)
    cache, lengths = cache + lengths - kept, kept
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(case.input_row_offsets.dtype)
    case = Case(case.name, case.k, case.gate, case.ape, offsets, cache.astype(case.cache_lengths.dtype))
    visible = np.concatenate([(c + np.arange(n) + 1) // kpool for c, n in zip(cache, lengths, strict=True)])
    ids = rng.integers(-1, visible[:, None], (len(visible), 3))  # -1 alone where no pool is visible yet
    ids = ids.astype(parts.index_dtype(int(ids.max(initial=0)) + 1, rng))
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
            mismatches += parts.differ(backend.get(got[0]), want[0]) + parts.differ(backend.get(got[1]), want[1])
        else:
            mismatches += parts.differ(backend.get(got), want)
    return Verdict(int((ids >= 0).sum()), mismatches, None)


SELECT_CACHE = 8192  # the most cached positions a request keeps in the selection check: logits stay small


# The most positions a token's row holds at the selections' larger pool_topk (pool_topk * kpool): 512 pools up to
# kpool 16, fewer above. At kpool 1024, pool_topk 512 made rows of 524,288 positions, 4 GiB for the check's 2,048
# tokens (a hostile round's finding: the reference's check was killed for memory).
CHECK_ROW_POSITIONS = 8192


def large_pool_topk(kpool: int) -> int:
    """The selections' larger pool_topk in a check: 512, or as many pools as CHECK_ROW_POSITIONS hold (6 at
    least: above the smaller values the checks also run, 3 and 5)."""
    return max(6, min(512, CHECK_ROW_POSITIONS // kpool))


def check_index_topk(backend: Backend, case: Case, kpool: int, rng: np.random.Generator) -> Verdict:
    """Logits with ties, NaN of both signs, -0.0 and infinities over each token's visible pools (and +inf past
    them, which must never be chosen), selected at two pool_topk values, plain, with the tail and compact, and
    paged, bit for bit against the reference.

    Requests keep their last ``EXPAND_TOKENS`` tokens and at most ``SELECT_CACHE`` cached positions.
    """
    lengths, cache = parts.token_counts(case)
    kept = np.minimum(lengths, EXPAND_TOKENS)
    cache, lengths = np.minimum(cache + lengths - kept, SELECT_CACHE), kept
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(case.input_row_offsets.dtype)
    cache = cache.astype(case.cache_lengths.dtype)
    visible = np.concatenate([(c + np.arange(n) + 1) // kpool for c, n in zip(cache, lengths, strict=True)])
    width = int(visible.max(initial=0)) + 1
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)
    logits = np.round(rng.standard_normal((len(visible), width)) * 4).astype(np.float32)  # rounded: many ties
    odd = rng.random(logits.shape) < 0.05
    logits[odd] = rng.choice(special, int(odd.sum()))
    logits[np.arange(width)[None, :] >= visible[:, None]] = np.inf  # unseen pools: never selected
    calls = [{"always_select_tail": tail, "compact": compact} for tail in (False, True) for compact in (False, True)]
    top = int((cache.astype(np.int64) + lengths).max(initial=0))
    block_size = 16
    blocks = -(-top // block_size) + 1
    table = rng.permutation(len(lengths) * blocks).astype(np.int32).reshape(len(lengths), blocks)
    calls += [{**options, "block_table": table, "block_size": block_size} for options in calls]
    base = (logits, offsets, cache)
    mismatches = 0
    for pool_topk in (3, large_pool_topk(kpool)):
        for options in calls:
            on_device = {n: backend.put(v) if isinstance(v, np.ndarray) else v for n, v in options.items()}
            got = backend.ops.kpool_index_topk(
                *(backend.put(a) for a in base), kpool=kpool, pool_topk=pool_topk, **on_device
            )
            want = reference.kpool_index_topk(*base, kpool=kpool, pool_topk=pool_topk, **options)
            if options.get("compact"):  # (positions, counts)
                mismatches += parts.differ(backend.get(got[0]), want[0]) + parts.differ(backend.get(got[1]), want[1])
            else:
                mismatches += parts.differ(backend.get(got), want)
    return Verdict(len(visible), mismatches, None)


def check_compress_fp8(backend: Backend, case: Case, kpool: int, rng: np.random.Generator) -> Verdict:
    """The fused rows and cache against the epilogue of the backend's own float32 compress, which meets float64."""
    extra = {n: backend.put(v) for n, v in case.extra.items() if n == "pool_row_offsets"}
    args = [backend.put(a) for a in (case.k, case.gate, case.ape, case.input_row_offsets, case.cache_lengths)]
    pooled = backend.get(backend.ops.kpool_compress(*args, out_dtype="float32", **extra))
    want = parts.float64_pools(case, np.dtype(np.float32))
    accuracy = compare(
        pooled, want.astype(np.float64), np.float32, kpool, *parts.accuracy_bounds(case.k, case.gate, case.ape)
    )
    lengths, cache = parts.token_counts(case)
    pools = [list(range(-(-int(c) // kpool), int(c + n) // kpool)) for c, n in zip(cache, lengths, strict=True)]

    def fused(round_scale: bool, **target: Any) -> tuple[Any, None]:
        return parts.on_host(
            backend, backend.ops.kpool_compress_fp8(*args, round_scale=round_scale, **extra, **target)
        ), None

    return Verdict(len(pooled), parts.fp8_mismatches(backend, fused, pooled, None, pools, rng, "pool", None), accuracy)


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
    return Verdict(x.shape[0], parts.differ(values, want_values) + parts.differ(scales, want_scales), None)


INDEX_TOKENS, INDEX_HEADS = 64, 8


def scoring_arrays(case: Case, kpool: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """A scoring call's arrays for a check case (q, weights, cache, cache_block_table, offsets, lengths).

    The case gives the batch (each request's last ``INDEX_TOKENS`` tokens
    after its cache); the pooled cache, its shuffled table, the e4m3 queries
    and weights are random: every visible pool has a page entry. head_dim is
    the case's (``run_check`` refuses one the scorer does not take).
    """
    lengths, cache = parts.token_counts(case)
    kept = np.minimum(lengths, INDEX_TOKENS)
    # Caches at most 512 pools long, each at its phase mod kpool (the case's reach past 2^32 tokens would be
    # a cache of that many pools).
    cache, lengths = (cache + lengths - kept) % (512 * kpool), kept
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(case.input_row_offsets.dtype)
    head_dim = case.k.shape[1]
    pools = np.where(lengths > 0, (cache + lengths) // kpool, 0)
    block_size = 16
    columns = -(-pools // block_size)
    pages = int(columns.sum()) + 1
    order = rng.permutation(pages).astype(np.int32)
    table = np.full((len(lengths), max(int(columns.max(initial=0)), 1)), -1, np.int32)
    starts = np.concatenate([[0], np.cumsum(columns)])
    for b, (start, count) in enumerate(zip(starts[:-1], columns, strict=True)):
        table[b, :count] = order[start : start + count]
    paged = np.zeros((pages, block_size, CACHE_LAYOUT.entry_bytes(head_dim)), np.uint8)
    flat = paged.reshape(pages, -1)
    scales_at = CACHE_LAYOUT.scale_offset(block_size, head_dim, 0)  # values first, then the scales
    values = rng.integers(0, 256, (pages, scales_at), dtype=np.uint8)
    flat[:, :scales_at] = np.where((values & 0x7F) == 0x7F, values ^ 1, values)
    flat[:, scales_at:] = np.exp2(rng.integers(-8, 4, (pages, block_size))).astype(np.float32).view(np.uint8)
    tokens = int(lengths.sum())
    q = rng.integers(0, 256, (tokens, INDEX_HEADS, head_dim), dtype=np.uint8)
    q = np.where((q & 0x7F) == 0x7F, q ^ 1, q)
    weights = rng.standard_normal((tokens, INDEX_HEADS)).astype(np.float32)
    return (q, weights, paged, table, offsets, cache.astype(case.cache_lengths.dtype))


def check_index_logits_fp8(backend: Backend, case: Case, kpool: int, rng: np.random.Generator) -> Verdict:
    """Scores against the float64 model within ``index_accuracy``'s CPU bound (the GPU's with ``cupy``), on
    ``scoring_arrays``."""
    arrays = scoring_arrays(case, kpool, rng)
    tokens = arrays[0].shape[0]
    got = backend.get(backend.ops.kpool_index_logits_fp8(*(backend.put(a) for a in arrays), kpool=kpool))
    want = reference.kpool_index_logits_fp8(*arrays, kpool=kpool)
    bits = _device_accumulation_bits() if backend.on_gpu else 24
    bound = index_logits_bound(*arrays, kpool=kpool, max_pools=want.shape[1], accumulation_bits=bits)
    accuracy = index_logits_agree(got, want, bound) if got.shape == want.shape else {"ok": False}
    return Verdict(tokens, 0 if got.shape == want.shape else max(got.size, 1), accuracy)


def check_index_select_fp8(backend: Backend, case: Case, kpool: int, rng: np.random.Generator) -> Verdict:
    """The fused call against the backend's own two calls (scores, then ``kpool_index_topk``), bit for bit, at
    two pool_topk values, plain, with the tail and compact, and paged, on ``scoring_arrays``."""
    arrays = scoring_arrays(case, kpool, rng)
    offsets, cache = arrays[4], arrays[5]
    on_device = [backend.put(a) for a in arrays]
    logits = backend.ops.kpool_index_logits_fp8(*on_device, kpool=kpool)
    calls = [{"always_select_tail": tail, "compact": compact} for tail in (False, True) for compact in (False, True)]
    top = int((cache.astype(np.int64) + np.diff(offsets.astype(np.int64))).max(initial=0))
    blocks = -(-top // 16) + 1
    table = rng.permutation(len(cache) * blocks).astype(np.int32).reshape(len(cache), blocks)
    calls += [{**options, "block_table": table, "block_size": 16} for options in calls]
    mismatches = 0
    for pool_topk in (5, large_pool_topk(kpool)):
        for options in calls:
            given = {n: backend.put(v) if isinstance(v, np.ndarray) else v for n, v in options.items()}
            fused = backend.ops.kpool_index_select_fp8(*on_device, kpool=kpool, pool_topk=pool_topk, **given)
            two_step = backend.ops.kpool_index_topk(
                logits, on_device[4], on_device[5], kpool=kpool, pool_topk=pool_topk, **given
            )
            pairs = zip(fused, two_step, strict=True) if options["compact"] else ((fused, two_step),)
            mismatches += sum(parts.differ(backend.get(a), backend.get(b)) for a, b in pairs)
    return Verdict(arrays[0].shape[0], mismatches, None)


def _fp8(check: Callable[..., Verdict]) -> Callable[[Backend, Case, int, np.random.Generator], Verdict]:
    def fused(backend: Backend, case: Case, kpool: int, rng: np.random.Generator) -> Verdict:
        return check(backend, case, kpool, rng, fp8=True)

    return fused


@dataclass(frozen=True)
class OpCheck:
    """An op's check: ``run`` one case, ``unit`` what its rows are; the case extras it reads (``out=``,
    ``pool_row_offsets=``; a case whose extras it does not read is reported under its batch's name), and the
    check's settings the op takes (the others change only the random batches, so a report leaves them out)."""

    run: Callable[[Backend, Case, int, np.random.Generator], Verdict]
    unit: str
    reads: frozenset[str] = frozenset()
    takes: frozenset[str] = frozenset({"dtype", "head_dim", "kpool"})


_POOL_OFFSETS = frozenset({"pool_row_offsets"})
_NO_ROWS = frozenset({"head_dim", "kpool"})  # index arrays and FP8 bytes only: no dtype

# Each op's check, by the op's name without ``kpool_`` (as under torch.ops.kpool).
OP_CHECKS: dict[str, OpCheck] = {
    "compress": OpCheck(check_compress, "pools", frozenset({"out", "pool_row_offsets"})),
    "ring_close": OpCheck(check_ring_close, "pools"),
    "seed_tail": OpCheck(check_seed_tail, "ring rows"),
    "tail_update": OpCheck(check_tail_update, "pools"),
    "expand_topk": OpCheck(check_expand_topk, "ids", takes=frozenset({"kpool"})),
    "compress_fp8": OpCheck(check_compress_fp8, "pools", _POOL_OFFSETS),
    "ring_close_fp8": OpCheck(_fp8(check_ring_close), "pools"),
    "tail_update_fp8": OpCheck(_fp8(check_tail_update), "pools"),
    "hadamard_quant_fp8": OpCheck(check_hadamard_quant_fp8, "rows", takes=frozenset({"dtype", "head_dim"})),
    "index_logits_fp8": OpCheck(check_index_logits_fp8, "tokens", takes=_NO_ROWS),
    "index_topk": OpCheck(check_index_topk, "tokens", takes=frozenset({"kpool"})),
    "index_select_fp8": OpCheck(check_index_select_fp8, "tokens", takes=_NO_ROWS),
    "compress_backward": OpCheck(check_compress_backward, "pools", _POOL_OFFSETS),
}


def _device_accumulation_bits() -> int:
    """The GPU bound's D-sum bits for the current device and the instruction its scorer runs."""
    import cupy

    from ..backends.cupy import CupyBackend

    device = cupy.cuda.Device()
    return gpu_accumulation_bits(int(device.compute_capability), CupyBackend(cupy, device.id).tensor_core())
