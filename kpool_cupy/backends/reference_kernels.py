"""Each kernel written in NumPy: what the reference backend runs for a launch.

One function per kernel of kernels/, taking the ``Launch`` an op built: what
the kernel itself gets (its template parameters and scalar parameters by
name, read through ``kernel_scalars``), the op's arrays by operand name, and
the work items its grid covers. Vectorized
over pools, requests and tokens; the only loops run over ring positions
(fewer than kpool) and over a decode step's next_n tokens, which must be
walked in order. Every pool is reduced by ``pool_members``, so the reference
agrees with itself bit for bit across the lifecycle. The same bounds checks
as the kernels make garbage inputs with ``validate=False`` touch nothing
outside the arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np

from ..dtypes import INT32_MAX, signed_index
from ..kernel.codes import Fp8Target
from ..kernel.geometry import APE_SLICES, CHANNELS_PER_THREAD, chunk_members
from ..kernel.pages import FP8_PAGES
from ..kernel.requests import find_request, ids_with_positions, request_rows
from ..ops.framework.spec import Launch, is_pair
from .reference_epilogue import epilogue, rotate
from .reference_epilogue import hadamard_quant as query_epilogue

FLOAT32 = np.float32  # the kernels' arithmetic


def kernel_scalars(launch: Launch) -> SimpleNamespace:
    """The launch's scalar parameters and template parameters by name, the template's in lower case
    (``KPOOL`` as ``kpool``): the numbers the kernel sees, and nothing the op knew besides."""
    scalars = {p.name: launch.values[p.name] for p in launch.kernel.params if not p.pointer}
    template = {t.name.lower(): launch.template.get(t.name) for t in launch.kernel.template}
    return SimpleNamespace(**scalars, **template)


def guess_request(pools: np.ndarray, guess_pools: int, batch: int) -> np.ndarray:
    """``kp::guess_request``: each pool's share of ``guess_pools`` (the launch's, at least 1) scaled to the batch,
    in float32 as the kernel.

    Each step rounds like the kernel's (conversions to nearest, the product,
    a correctly rounded reciprocal, the product), so the guess is the same.
    """
    share = pools.astype(np.float32) * np.float32(batch)
    scaled = share * (np.float32(1) / np.float32(max(guess_pools, 1)))  # as the kernel, which takes 1 below 1
    return np.minimum(np.trunc(scaled).astype(np.int64), batch - 1)


def member_rows(call: Any, count: int, input_row_offsets: Any, cache_lengths: Any, pool_row_offsets: Any):
    """First member row of each pool in [0, count) and whether it may be written.

    The same guess, search and checks as ``kp::locate_pool`` in
    kernels/kpool_compress.cu, so garbage offsets with ``validate=False`` index
    nothing outside ``k`` here either. ``call`` needs ``batch``,
    ``total_tokens`` and ``kpool``, and may give the launch's ``guess_pools``
    (the exact pool count without it).
    """
    first, ok, _, _ = locate_pools(call, count, input_row_offsets, cache_lengths, pool_row_offsets)
    return first, ok


def locate_pools(call: Any, count: int, input_row_offsets: Any, cache_lengths: Any, pool_row_offsets: Any):
    """``member_rows``, plus each pool's request and number q in it (-1 for a cached length of 2^62 or more),
    as ``kp::locate_pool`` gives them."""
    pool = np.arange(count, dtype=np.int64)
    pools = np.asarray(pool_row_offsets).astype(np.int64)
    offsets = np.asarray(input_row_offsets).astype(np.int64)
    cached = np.asarray(cache_lengths).astype(np.int64)
    if call.batch == 0:
        return pool, np.zeros(count, dtype=bool), pool, pool
    # The guess where its offsets bracket the pool, else the search (never for a pool past the count). A call
    # record without a launch's guess_pools (member_rows on a CompressCall) guesses by the exact count.
    guess_pools = getattr(call, "guess_pools", None)
    guess = guess_request(pool, int(pools[call.batch]) if guess_pools is None else guess_pools, call.batch)
    hit = (pools[guess] <= pool) & (pool < pools[guess + 1])
    request = np.where(hit, guess, find_request(pools, call.batch, pool))
    begin, end = pools[request], pools[request + 1]
    ok = (begin >= 0) & (pool >= begin) & (pool < end) & (pool < pools[call.batch])
    row_begin, row_end, length, usable = request_rows(offsets, cached, request, call.total_tokens)
    ok &= usable
    local = np.where(ok, pool - begin, 0)
    ok &= local <= (row_end - row_begin) // call.kpool
    phase = np.where(ok, length, 0) % call.kpool
    first = row_begin + np.where(phase == 0, 0, call.kpool - phase) + np.where(ok, local, 0) * call.kpool
    ok &= first + call.kpool <= row_end
    cached_ok = ok & (length < 2**62)
    number = np.where(cached_ok, np.where(cached_ok, length, 0) // call.kpool + (phase != 0) + local, -1)
    return np.where(ok, first, 0), ok, request, number


FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def flush_subnormals(values: np.ndarray) -> np.ndarray:
    """Float32 subnormals (in either accumulation) to zero of the same sign, as the device's -ftz=true does."""
    return np.where(np.abs(values) < FLOAT32_TINY, np.copysign(values.dtype.type(0), values), values)


def _chunks(kpool: int, chunk: int) -> list[tuple[int, int]]:
    """``kp::for_each_chunk``'s member ranges: the first chunk, whole ones, then a partial last."""
    first = min(kpool, chunk)
    ranges = [(0, first)]
    start = first
    while start + chunk <= kpool:
        ranges.append((start, start + chunk))
        start += chunk
    if start < kpool:
        ranges.append((start, kpool))
    return ranges


def pool_members(keys: np.ndarray, gates: np.ndarray, ape: np.ndarray, accumulate: type[np.floating]) -> np.ndarray:
    """Pooled keys ``[pools, head_dim]`` from members ``[pools, kpool, head_dim]``, unrounded.

    The one pooling function of the reference: every kernel here calls it, so
    the reference agrees with itself bit for bit (``pool_statistics``).
    """
    _, weight_sum, key_sum = pool_statistics(keys, gates, ape, accumulate)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return flush_subnormals(key_sum / weight_sum)


def pool_statistics(
    keys: np.ndarray, gates: np.ndarray, ape: np.ndarray, accumulate: type[np.floating]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each pool's softmax state per channel, ``[pools, head_dim]`` each: the logits' maximum, the weight sum
    and the weighted key sum (the pool is their quotient).

    It takes the kernel's chunks (``kp::chunk_members``, from k's and gate's
    dtypes) and, per chunk, its two passes: the chunk's maximum (NaN
    skipped, like fmaxf), the weights and their member-order sums, a rescale
    when a chunk raises the maximum. So overflowing or infinite keys give
    what the kernel gives. Subnormal inputs, weights and results are flushed
    to zero like the device's.
    """
    acc = accumulate
    kpool = keys.shape[1]
    member_bytes = CHANNELS_PER_THREAD * (keys.dtype.itemsize + gates.dtype.itemsize + 4)  # ape is float32
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        keys, gates, ape = (flush_subnormals(a.astype(acc)) for a in (keys, gates, ape))
        logits = flush_subnormals(gates + ape[None])
        peak = weight_sum = key_sum = None
        for start, stop in _chunks(kpool, chunk_members(kpool, member_bytes)):
            part = logits[:, start:stop]
            chunk_peak = np.fmax.reduce(part, axis=1)
            new_peak = chunk_peak if peak is None else np.fmax(peak, chunk_peak)
            # A logit equal to the maximum weighs exactly 1 (so all -inf gives
            # the members' mean, like the kernel's PoolChannel), the rest exp(l - max).
            weights = flush_subnormals(np.where(part == new_peak[:, None], acc(1), np.exp(part - new_peak[:, None])))
            weighted = weights * keys[:, start:stop]
            # Summed member after member, as the kernel does (NumPy's reduction
            # along an inner axis starts from +0 and would lose a sum's -0).
            chunk_weights, chunk_keys = weights[:, 0], weighted[:, 0]
            for m in range(1, stop - start):
                chunk_weights, chunk_keys = chunk_weights + weights[:, m], chunk_keys + weighted[:, m]
            if peak is None:
                weight_sum, key_sum = chunk_weights, chunk_keys
            else:
                scale = flush_subnormals(np.where(peak == new_peak, acc(1), np.exp(peak - new_peak)))
                weight_sum, key_sum = weight_sum * scale + chunk_weights, key_sum * scale + chunk_keys
            peak = new_peak
        return peak, weight_sum, key_sum


def pooled_output(pooled: np.ndarray, dtype: np.dtype, rotated: bool) -> np.ndarray:
    """What a pool-writing kernel stores: the pool rounded once to ``dtype``, or with ``rotate=`` its rotation
    ``y = bf16(B(bf16(pooled)) * fl32(1/sqrt(D)))`` rounded to ``dtype`` (``kp::store_pooled``)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if not rotated:
            return pooled.astype(dtype)
        x = pooled.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
        return rotate(x, ml_dtypes.bfloat16).astype(dtype)


def compress(launch: Launch, accumulate: type[np.floating]) -> None:
    """``kpool_compress``: every pool the grid covers, checked as the kernel checks it."""
    call, o = kernel_scalars(launch), launch.operands
    out = o["out"]
    first, ok = member_rows(
        call,
        min(launch.geometry.items, out.shape[0]),
        o["input_row_offsets"],
        o["cache_lengths"],
        o["pool_row_offsets"],
    )
    rows = first[ok][:, None] + np.arange(call.kpool)  # [pools, kpool]
    pooled = pool_members(o["k"][rows], o["gate"][rows], o["ape"], accumulate)
    out[np.flatnonzero(ok)] = pooled_output(pooled, out.dtype, call.rotate)


def compress_fp8(launch: Launch, accumulate: type[np.floating]) -> None:
    """``kpool_compress_fp8``: compress's pools through the FP8 epilogue, placed as ``kp::Fp8Sink`` places them."""
    pooling, o = kernel_scalars(launch), launch.operands
    first, ok, request, number = locate_pools(
        pooling, launch.geometry.items, o["input_row_offsets"], o["cache_lengths"], o["pool_row_offsets"]
    )
    rows = first[ok][:, None] + np.arange(pooling.kpool)  # [pools, kpool]
    pooled = pool_members(o["k"][rows], o["gate"][rows], o["ape"], accumulate)
    write_fp8(launch, pooled, np.flatnonzero(ok), request[ok], number[ok])


def compress_backward(launch: Launch, accumulate: type[np.floating]) -> None:
    """``kpool_compress_backward``: its pool blocks' work (``pool_gradients``), then its request blocks'
    (``clear_rows_outside_pools``), in the order the emulator runs the blocks."""
    call = kernel_scalars(launch)
    if call.pool_blocks > 0:
        pool_gradients(launch, accumulate)
    groups_per_block = launch.geometry.block // (call.head_dim // CHANNELS_PER_THREAD)  # groups of head_dim / 8
    clear_rows_outside_pools(launch, min((launch.geometry.grid - call.pool_blocks) * groups_per_block, call.batch))


def pool_gradients(launch: Launch, accumulate: type[np.floating]) -> None:
    """The pool blocks of ``kpool_compress_backward``: each located pool's d k and d gate rows, and each pool
    block's partial sums of d ape in group order (``kp::round_end``); pools are found as compress finds them."""
    call, o = kernel_scalars(launch), launch.operands
    blocks_of_pools = int(call.pool_blocks)
    grad, partials = o["grad_pooled"], o["partials"]
    count = min(launch.geometry.items, grad.shape[0])
    first, ok = member_rows(call, count, o["input_row_offsets"], o["cache_lengths"], o["pool_row_offsets"])
    rows = first[ok][:, None] + np.arange(call.kpool)  # [pools, kpool]
    keys, gates, ape = o["k"][rows], o["gate"][rows], o["ape"]
    acc = accumulate
    peak, weight_sum, key_sum = pool_statistics(keys, gates, ape, acc)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        inverse = flush_subnormals(acc(1) / weight_sum)
        pooled = flush_subnormals(key_sum * inverse)
        keys, gates, ape = (flush_subnormals(a.astype(acc)) for a in (keys, gates, ape))
        logits = flush_subnormals(gates + ape[None])
        weights = np.where(logits == peak[:, None], acc(1), flush_subnormals(np.exp(logits - peak[:, None])))
        weights = flush_subnormals(weights * inverse[:, None])
        g = flush_subnormals(grad[np.flatnonzero(ok)].astype(acc))
        grad_keys = flush_subnormals(weights * g[:, None])
        grad_logits = flush_subnormals(grad_keys * flush_subnormals(keys - pooled[:, None]))
    o["grad_k"][rows] = grad_keys.astype(o["grad_k"].dtype)
    o["grad_gate"][rows] = grad_logits.astype(o["grad_gate"].dtype)
    # Every block's partials, its groups summed in order (a group without a pool brings zeros).
    per_group = np.zeros((launch.geometry.items, call.kpool, call.head_dim), np.float32)
    per_group[np.flatnonzero(ok)] = grad_logits
    blocks = per_group.reshape(blocks_of_pools, -1, call.kpool, call.head_dim)
    with np.errstate(invalid="ignore", over="ignore"):
        total = blocks[:, 0]
        for g in range(1, blocks.shape[1]):
            total = flush_subnormals(total + blocks[:, g])
    partials[:blocks_of_pools] = total


def compress_backward_ape(launch: Launch, accumulate: type[np.floating]) -> None:
    """``kpool_compress_backward_ape``: slice s sums the partials of blocks s, s + APE_SLICES, ... in order onto
    -0 (+0 with none), then the slices' sums are added pairwise, neighbours first ((s0 + s1) + (s2 + s3)) + ...,
    as the kernel adds them."""
    call, o = kernel_scalars(launch), launch.operands
    partials = o["partials"].reshape(-1, call.kpool, call.head_dim)
    slices = []
    with np.errstate(invalid="ignore", over="ignore"):
        for s in range(APE_SLICES):
            total = np.full((call.kpool, call.head_dim), -0.0 if s < call.blocks else 0.0, np.float32)
            for b in range(s, int(call.blocks), APE_SLICES):
                total = flush_subnormals(total + partials[b])
            slices.append(total)
        while len(slices) > 1:
            slices = [flush_subnormals(slices[i] + slices[i + 1]) for i in range(0, len(slices), 2)]
    o["grad_ape"][...] = slices[0]


def clear_rows_outside_pools(launch: Launch, requests: int) -> None:
    """``kp::clear_rows_outside_pools`` for the first ``requests`` requests: each one's rows before its first
    pool and after its last, at most kpool - 1 of each, zero, checked as the kernel checks them."""
    call, o = kernel_scalars(launch), launch.operands
    offsets = np.asarray(o["input_row_offsets"]).astype(np.int64)
    cached = np.asarray(o["cache_lengths"]).astype(np.int64)
    pools = np.asarray(o["pool_row_offsets"]).astype(np.int64)
    for request in range(requests):
        rows_of = request_rows(offsets, cached, np.array(request), call.total_tokens)
        begin, end, length, usable = (int(v) for v in rows_of)
        if not usable:
            continue
        first, last = int(pools[request]), int(pools[request + 1])
        rows, claimed = end - begin, 0 if first < 0 or last < first else last - first
        head = min((-length) % call.kpool, rows)
        covered = head + min(claimed, (rows - head) // call.kpool) * call.kpool
        tail = max(covered, rows - (call.kpool - 1), head)
        for name in ("grad_k", "grad_gate"):
            o[name][begin : begin + head] = 0
            o[name][begin + tail : end] = 0


def write_fp8(launch: Launch, pooled: np.ndarray, rows: np.ndarray, requests: np.ndarray, numbers: np.ndarray) -> None:
    """The FP8 epilogue of pooled float32 rows, written where ``kp::Fp8Sink::place`` puts output row ``rows[i]``
    (request ``requests[i]``'s pool ``numbers[i]``), skipping what it skips."""
    call, o = kernel_scalars(launch), launch.operands
    with np.errstate(all="ignore"):
        values, scales = epilogue(pooled.astype(np.float32), bool(call.round_scale))
    if call.target == Fp8Target.ROWS:
        out = o["out"].reshape(-1, o["out"].shape[-1])  # [rows, D], or a C-contiguous [R, J, D]: views
        inside = rows < out.shape[0]
        out[rows[inside]] = values[inside]
        o["out_scale"].reshape(-1)[rows[inside]] = scales[inside]
        return
    size, pages = call.block_size, call.target_rows
    if call.target == Fp8Target.SLOTS:
        slots_in = o["slots"]
        inside = rows < slots_in.shape[0]
        slot = np.where(inside, slots_in[np.where(inside, rows, 0)] if slots_in.size else -1, -1).astype(np.int64)
    else:
        table = o["block_table"]
        block = np.where(numbers >= 0, numbers // size, 0)
        inside = (numbers >= 0) & (requests < table.shape[0]) & (block < table.shape[1])
        entry = np.full(rows.shape, -1, np.int64)
        if table.size:
            entry = np.where(inside, table[np.where(inside, requests, 0), np.where(inside, block, 0)], -1)
        entry = entry.astype(np.int64)
        slot = np.where((entry >= 0) & (entry < pages), entry * size + numbers % size, -1)
    keep = (slot >= 0) & (slot // size < pages)
    cache = o["cache"]
    layout = FP8_PAGES
    head_dim = layout.head_dim(cache.shape[2])
    # The cache as [pages, page bytes] over its own memory (pages may lie further apart than their bytes).
    page_bytes = np.lib.stride_tricks.as_strided(cache, (pages, size * cache.shape[2]), (cache.strides[0], 1))
    page, entry_in_page = (slot[keep] // size)[:, None], (slot[keep] % size)[:, None]
    page_bytes[page, layout.value_offset(head_dim, entry_in_page) + np.arange(head_dim)] = values[keep]
    scale_bytes = scales[keep].astype(np.float32).view(np.uint8).reshape(-1, layout.scale_bytes)
    scale_at = layout.scale_offset(size, head_dim, entry_in_page) + np.arange(layout.scale_bytes)
    page_bytes[page, scale_at] = scale_bytes


def hadamard_quant_fp8(launch: Launch, accumulate: type[np.floating]) -> None:
    """``kpool_hadamard_quant_fp8``: every row of x through the query side's epilogue."""
    o = launch.operands
    with np.errstate(all="ignore"):
        values, scales = query_epilogue(o["x"], bool(kernel_scalars(launch).round_scale))
    o["out"][...] = values
    o["out_scale"][...] = scales


def _requests(call: Any, input_row_offsets: Any, cache_lengths: Any, slot_idx: Any):
    """Per request: row range, cached length, slot, and whether all of them are usable."""
    offsets = np.asarray(input_row_offsets).astype(np.int64)
    cached = np.asarray(cache_lengths).astype(np.int64)
    slots = signed_index(slot_idx, slot_idx.dtype)
    begin, end, cached, usable = request_rows(offsets, cached, np.arange(call.batch), call.total_tokens)
    usable &= (slots >= 0) & (slots < call.max_slots)
    return begin, end, cached, slots, usable


def _rings(tail: Any) -> tuple[Any, Any]:
    """The key ring and the gate ring ``[max_slots, ring, head_dim]``: a pair's arrays, or views of one ring
    (writes through them land in the caller's ring)."""
    return tuple(tail) if is_pair(tail) else (tail[:, 0], tail[:, 1])


def _close_pending_pools(call: Any, o: Any, accumulate: type[np.floating]):
    """``kp::close_pending_pool`` for every request: writes closed, returns the requests that close, their
    pools (unrounded) and pool ids. ``call`` is ring close's record."""
    k, gate, ape, closed = (o[name] for name in ("k", "gate", "ape", "closed"))
    key_ring, gate_ring = _rings(o["tail"])
    begin, end, cached, slots, usable = _requests(call, o["input_row_offsets"], o["cache_lengths"], o["slot_idx"])
    kpool = call.kpool
    phase = np.where(usable, cached, 0) % kpool
    closes = usable & (phase != 0) & (end - begin >= kpool - phase) & (cached // kpool <= INT32_MAX)
    closed[: call.batch] = np.where(closes, cached // kpool, -1)
    chosen = np.flatnonzero(closes)
    members = np.arange(kpool)
    from_ring = members[None] < phase[chosen][:, None]  # [closing, kpool]
    rows = np.where(from_ring, 0, begin[chosen][:, None] + members - phase[chosen][:, None])
    # Member m of pool c // kpool sits at ring row (c - c % kpool + m) % ring.
    ring_rows = (cached[chosen] - phase[chosen])[:, None] % key_ring.shape[1]
    ring_rows = (ring_rows + members) % key_ring.shape[1]
    slot = slots[chosen][:, None]
    keys = np.where(from_ring[..., None], key_ring[slot, ring_rows], k[rows])
    gates = np.where(from_ring[..., None], gate_ring[slot, ring_rows], gate[rows])
    return chosen, pool_members(keys, gates, ape, accumulate), cached[chosen] // kpool


def ring_close(launch: Launch, accumulate: type[np.floating]) -> None:
    """``kpool_ring_close``: each request's pending pool, from its ring and the call's first tokens."""
    out, call = launch.operands["out"], kernel_scalars(launch)
    chosen, pooled, _ = _close_pending_pools(call, launch.operands, accumulate)
    out[chosen] = pooled_output(pooled, out.dtype, call.rotate)


def ring_close_fp8(launch: Launch, accumulate: type[np.floating]) -> None:
    """``kpool_ring_close_fp8``: ring close's pools through the FP8 epilogue, placed as ``kp::Fp8Sink`` does."""
    chosen, pooled, ids = _close_pending_pools(kernel_scalars(launch), launch.operands, accumulate)
    write_fp8(launch, pooled, chosen, chosen, ids)


def seed_tail(launch: Launch, accumulate: type[np.floating]) -> None:
    """``kpool_seed_tail``: each request's last min(n, ring) tokens into its ring (no kpool)."""
    call, o = kernel_scalars(launch), launch.operands
    k, gate = o["k"], o["gate"]
    key_ring, gate_ring = _rings(o["tail"])
    begin, end, cached, slots, usable = _requests(call, o["input_row_offsets"], o["cache_lengths"], o["slot_idx"])
    usable &= cached <= np.iinfo(np.int64).max - (end - begin)  # c + n must not wrap
    count = np.where(usable, end - begin, 0)
    last = cached + count
    start = np.where(count > call.ring_rows, last - call.ring_rows, cached)
    for step in range(int((last - start).max(initial=0))):  # at most ring rows per request
        # step < last - start, not start + step < last: near 2^63 the sum wraps.
        active = np.flatnonzero(usable & (step < last - start))
        position = start + step
        rows = begin[active] + position[active] - cached[active]
        ring = position[active] % key_ring.shape[1]
        key_ring[slots[active], ring] = k[rows]
        gate_ring[slots[active], ring] = gate[rows]


def _tail_update_steps(call: Any, o: Any, accumulate: type[np.floating], emit: Callable[..., None]) -> None:
    """``kp::tail_update_steps`` for every request: each step's tokens in order into the ring, closed written,
    and each closing's requests, output rows, pool ids and pools (unrounded) handed to ``emit``."""
    k, gate, ape, positions, closed = (o[name] for name in ("k", "gate", "ape", "positions", "closed"))
    key_ring, gate_ring = _rings(o["tail"])
    slots = signed_index(o["slot_idx"], o["slot_idx"].dtype)
    slot_ok = (slots >= 0) & (slots < call.max_slots)
    written = np.zeros(call.requests, dtype=np.int64)
    closed[...] = -1
    for t in range(call.next_n):  # a step's tokens, in order
        position = signed_index(positions[:, t], positions.dtype)
        real = np.flatnonzero(slot_ok & (position >= 0))  # padding touches nothing
        ring = position[real] % key_ring.shape[1]
        key_ring[slots[real], ring] = k[real, t]
        gate_ring[slots[real], ring] = gate[real, t]
        closes = position[real] % call.kpool == call.kpool - 1
        closing = real[closes & (written[real] < call.pools_per_request)]
        if closing.size:
            # Members of pool pos // kpool: rows (pos - kpool + 1 + m) % ring.
            first = position[closing] - (call.kpool - 1)
            member_rows = (first[:, None] + np.arange(call.kpool)) % key_ring.shape[1]
            slot = slots[closing][:, None]
            pooled = pool_members(key_ring[slot, member_rows], gate_ring[slot, member_rows], ape, accumulate)
            ids = position[closing] // call.kpool
            emit(closing, closing * call.pools_per_request + written[closing], ids, pooled)
            closed[closing, written[closing]] = ids
            written[closing] += 1


def tail_update(launch: Launch, accumulate: type[np.floating]) -> None:
    """``kpool_tail_update``: each request's step tokens in order, into its ring, closing pools."""
    out, call = launch.operands["out"], kernel_scalars(launch)
    rows = out.reshape(-1, out.shape[-1])  # C-contiguous: a view

    def emit(requests: np.ndarray, row: np.ndarray, ids: np.ndarray, pooled: np.ndarray) -> None:
        rows[row] = pooled_output(pooled, out.dtype, call.rotate)

    _tail_update_steps(call, launch.operands, accumulate, emit)


def tail_update_fp8(launch: Launch, accumulate: type[np.floating]) -> None:
    """``kpool_tail_update_fp8``: tail update's pools through the FP8 epilogue, placed as ``kp::Fp8Sink`` does."""

    def emit(requests: np.ndarray, row: np.ndarray, ids: np.ndarray, pooled: np.ndarray) -> None:
        write_fp8(launch, pooled, row, requests, ids)

    _tail_update_steps(kernel_scalars(launch), launch.operands, accumulate, emit)


def expand_topk(launch: Launch, accumulate: type[np.floating]) -> None:
    """``kpool_expand_topk``: every element of positions as ``kp::expanded`` computes it, then compacted if asked."""
    call, o = kernel_scalars(launch), launch.operands
    ids = signed_index(o["pool_ids"], o["pool_ids"].dtype)
    expand_pool_ids(call, o, ids, call.kpool)


def expand_pool_ids(call: Any, o: dict[str, Any], ids: np.ndarray, kpool: int) -> None:
    """Pool ids ``[tokens, pool_topk]`` (int64, -1 for none) expanded into ``o["positions"]`` (and
    ``o["counts"]`` when compacting) by kernels/kpool_expand.cuh's rules. ``call``: the kernel's scalars
    (pool_topk, batch, width, paged, compact, block_size, max_blocks)."""
    positions = o["positions"]
    pool_topk, batch = call.pool_topk, call.batch
    tokens = positions.shape[0]
    first = np.where(ids_with_positions(ids, kpool), ids * kpool, -1)[..., None]
    values = np.full((tokens, call.width), -1, np.int64)
    values[:, : pool_topk * kpool] = np.where(first >= 0, first + np.arange(kpool), -1).reshape(tokens, -1)
    # The token's request, where its rows hold the token (the tail and the block table need it).
    request = np.full(tokens, -1, np.int64)
    if batch > 0:
        offsets = np.asarray(o["input_row_offsets"]).astype(np.int64)
        cached = np.asarray(o["cache_lengths"]).astype(np.int64)
        token = np.arange(tokens)
        candidate = find_request(offsets, batch, token)
        begin, end, c, known = request_rows(offsets, cached, candidate, tokens)
        known &= (begin <= token) & (token < end) & (c < 2**62)  # the token inside its request
        request = np.where(known, candidate, -1)
        extra = call.width - pool_topk * kpool
        if extra:
            visible = np.where(known, c + token - begin + 1, 0)
            count = visible % kpool
            column = np.arange(extra)
            tail = np.where(column < count[:, None], (visible - count)[:, None] + column, -1)
            values[:, pool_topk * kpool :] = np.where(known[:, None], tail, -1)
    values = np.where(values <= INT32_MAX, values, -1)
    if call.paged:
        size, table = call.block_size, o["block_table"]
        block = np.where(values >= 0, values // size, 0)
        inside = (values >= 0) & (request[:, None] >= 0) & (block < call.max_blocks)
        if table.size:  # clamped indices only where inside; an empty table has no entry to clamp to
            entry = np.where(inside, table[np.maximum(request, 0)[:, None], np.minimum(block, call.max_blocks - 1)], -1)
        else:
            entry = np.full(values.shape, -1)
        entry = entry.astype(np.int64)
        slot_fits = (entry >= 0) & (entry <= (INT32_MAX - (size - 1)) // size)
        values = np.where(slot_fits, entry * size + values % size, -1)
    if call.compact:
        order = np.argsort(values < 0, axis=1, kind="stable")  # valid entries first, in column order
        values = np.take_along_axis(values, order, axis=1)
        o["counts"][:] = (values >= 0).sum(axis=1)
    positions[...] = values


# The NumPy kernel of each kernel template, by the name a Launch carries.
KERNELS: dict[str, Callable[[Launch, type[np.floating]], None]] = {
    "kpool_compress": compress,
    "kpool_ring_close": ring_close,
    "kpool_seed_tail": seed_tail,
    "kpool_tail_update": tail_update,
    "kpool_expand_topk": expand_topk,
    "kpool_compress_fp8": compress_fp8,
    "kpool_compress_backward": compress_backward,
    "kpool_compress_backward_ape": compress_backward_ape,
    "kpool_ring_close_fp8": ring_close_fp8,
    "kpool_tail_update_fp8": tail_update_fp8,
    "kpool_hadamard_quant_fp8": hadamard_quant_fp8,
}
