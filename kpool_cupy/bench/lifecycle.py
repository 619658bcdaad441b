"""Benchmarks of the decode-side functions: tail update and expand top-k (GPU only).

Decode-shaped batches of 1 to 512 requests: the tail update on rings of kpool
rows (next_n 1 and 2) and of 2 * kpool rows (next_n 2 and 4), expand top-k
without and with a block table. Each implementation's median device time is
reported with its bandwidth against the minimum bytes and as a fraction of a
device-to-device copy of those bytes timed in the same run, the same method as
the compress sweep (graph replay, three L2 sizes of rotation). Each composite's
result on the first input set is compared with this package's
(``max_abs_diff_vs_kpool_cupy``, 0 for equal integers).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import element_dtype
from .stats import ratios_to, rotation
from .timing import copy_roof, l2_bytes, timed_entry

POOL_TOPK = 512  # the indexer's selection width of the upstream suite (2048 expanded columns at kpool 4)


@dataclass(frozen=True)
class DecodeShape:
    """One decode step: ``requests`` requests of ``next_n`` tokens, tails in rings of ``ring`` rows (kpool if None).

    The benchmark's positions end every request's step on a pool's last
    member, so each request closes ``pools`` pools per step.
    """

    requests: int
    next_n: int
    head_dim: int = 128
    kpool: int = 4
    dtype: str = "bfloat16"
    ring: int | None = None

    def __post_init__(self) -> None:
        if self.ring is None:
            object.__setattr__(self, "ring", self.kpool)
        # The composite stashes the whole step before it pools: a shorter ring
        # would have overwritten a member of a pool the step closes.
        least = self.kpool * self.pools
        if self.ring < least:
            raise ValueError(
                f"Invalid ring: expected kpool * ceil(next_n / kpool) = {least} rows or more, got {self.ring}"
            )

    @property
    def pools(self) -> int:
        return -(-self.next_n // self.kpool)

    @property
    def name(self) -> str:
        ring = "" if self.ring == self.kpool else f"-ring{self.ring}"
        return f"decode-{self.requests}x{self.next_n}{ring}"


def decode_shapes(quick: bool = False) -> list[DecodeShape]:
    """Rings of kpool rows at next_n 1 and 2; rings of 2 * kpool rows at next_n 2 and 4, long enough for
    speculative decoding (``ring >= kpool + next_n - 1``)."""
    kpool = 4
    if quick:
        # next_n 2: members from earlier steps are read through the longer ring (next_n 4 brings all its own).
        return [DecodeShape(64, 1), DecodeShape(512, 1), DecodeShape(512, 2, kpool=kpool, ring=2 * kpool)]
    one_pool = [DecodeShape(r, n, kpool=kpool) for r in (1, 8, 64, 512) for n in (1, 2)]
    return one_pool + [DecodeShape(r, n, kpool=kpool, ring=2 * kpool) for r in (64, 512) for n in (2, 4)]


def tail_update_bytes(shape: DecodeShape) -> int:
    """The least a decode step moves, at the benchmark's positions, where each request closes ``shape.pools`` pools.

        bytes = R * next_n * 2 * row * 2                      step tokens: k and gate read, written to the ring
              + R * (pools * kpool - next_n) * 2 * row        closed pools' members from earlier steps: k and gate
              + R * pools * row                               one pooled row written per closed pool

    with ``row = head_dim * itemsize``. The members a step brings itself are
    not read back. The ring's length changes no term: the earlier members are
    read wherever it keeps them. The positions, slots, closed ids and ape are
    not counted.
    """
    itemsize = element_dtype(shape.dtype).itemsize
    row = shape.head_dim * itemsize
    step = shape.requests * shape.next_n * 2 * row * 2
    older_members = shape.pools * shape.kpool - shape.next_n
    closing = shape.requests * (older_members * 2 * row + shape.pools * row)
    return step + closing


def expand_bytes(tokens: int, pool_topk: int, kpool: int, paged: bool = False) -> int:
    """pool_ids read once (int32) and the positions written once (int32); with ``paged``, one block-table entry
    (int32) read per selected pool as well.

    A pool's kpool positions lie in one page when the block size is a multiple
    of kpool, and the benchmark's pools of one token lie in distinct pages of
    its request, so no entry serves two of them (pools sharing a page would
    share the read: fewer bytes). The offsets and cache lengths, a few bytes
    a request that every input set shares, are not counted.
    """
    entries = tokens * pool_topk * 4 if paged else 0
    return tokens * pool_topk * 4 + tokens * pool_topk * kpool * 4 + entries


def composite_tail_update(xp: Any, tail, k, gate, ape, positions, slots, kpool: int) -> Any:
    """The decode step in array operations (``xp`` is numpy or cupy): scatter every step token into its ring,
    then pool the pools that end the step.

        tail[slots[r], :, positions[r, t] % ring] = k[r, t], gate[r, t]     for every t, in order
        pooled[r, i] = pool of rows (q * kpool + m) % ring, q = positions[r, -1] // kpool - (pools - 1 - i)

    ``tail`` ``[max_slots, 2, ring, head_dim]``; returns ``[R, pools,
    head_dim]``, ``pools = ceil(next_n / kpool)``, in kpool_tail_update's
    order. Right when each request's last token closes its last pool (so the
    step closes exactly ``pools`` pools) and ``ring >= pools * kpool`` (so no
    step token overwrote a member of a pool the step closes): the benchmark's
    positions and shapes are chosen so. Padding (-1) is not handled.
    """
    from .impls import composite_pool

    requests, next_n = positions.shape
    ring, head_dim = tail.shape[2], tail.shape[3]
    pools = -(-next_n // kpool)
    if ring < pools * kpool:
        raise ValueError(f"Invalid tail: expected a ring of at least {pools * kpool} rows, got {ring}")
    for t in range(next_n):
        rows = positions[:, t] % ring
        tail[slots, 0, rows] = k[:, t]
        tail[slots, 1, rows] = gate[:, t]
    # The closed pools' members are the pools * kpool positions that end at the step's last one.
    span = xp.arange(1 - pools * kpool, 1, dtype=xp.int64)
    members = (positions[:, -1:] + span) % ring  # [R, pools * kpool] ring rows, in member order
    keys = tail[slots[:, None], 0, members].reshape(requests * pools * kpool, head_dim)
    gates = tail[slots[:, None], 1, members].reshape(requests * pools * kpool, head_dim)
    first_rows = xp.arange(requests * pools, dtype=xp.int64) * kpool
    return composite_pool(xp, keys, gates, ape, first_rows, kpool).reshape(requests, pools, head_dim)


def composite_expand(xp: Any, pool_ids, member, block_table=None, block_size: int | None = None, request=None) -> Any:
    """kpool_expand_topk in array operations (``xp`` is numpy or cupy): expand, then gather through the block table.

        p[t, s * kpool + j] = pool_ids[t, s] * kpool + j, or -1 where pool_ids[t, s] < 0
        slot[t, c] = block_table[request[t], p // block_size] * block_size + p % block_size, or -1 where p is -1
                     or the entry is negative

    ``member`` is ``arange(kpool)`` as int64, made once by the caller so no
    call pays for it; ``request`` ``[total_tokens]`` is each token's request
    (the block table's row). The op's result wherever every position fits
    int32 and every block is inside the table (what ``validate=True``
    demands); int32 ``[total_tokens, pool_topk * kpool]``.
    """
    tokens, pool_topk = pool_ids.shape
    chosen = pool_ids.astype(xp.int64)[..., None]
    positions = xp.where(chosen >= 0, chosen * member.size + member, -1).reshape(tokens, pool_topk * member.size)
    if block_table is not None:
        valid = positions >= 0
        entry = block_table[request[:, None], xp.where(valid, positions // block_size, 0)].astype(xp.int64)
        positions = xp.where(valid & (entry >= 0), entry * block_size + positions % block_size, -1)
    return positions.astype(xp.int32)


def max_abs_difference(xp: Any, got: Any, want: Any) -> float:
    """The largest ``|got - want|``: in float32 for floating results (exact for bfloat16 and float16 values, as the
    compress sweep's check), in int64 for integer ones (exact: 0 means equal)."""
    if got.shape != want.shape:
        raise ValueError(f"Invalid composite result: expected shape {tuple(want.shape)}, got {tuple(got.shape)}")
    if got.size == 0:
        return 0.0
    wide = xp.int64 if want.dtype.kind in "iu" else xp.float32
    return float(xp.abs(got.astype(wide) - want.astype(wide)).max())


def step_positions(xp: Any, rng: Any, count: int, shape: DecodeShape) -> Any:
    """``[count, R, next_n]`` int32 positions, consecutive per request, the last one a pool's last member:
    each request's step closes exactly ``shape.pools`` pools, and no position is negative (padding)."""
    kpool = shape.kpool
    last = (rng.integers(shape.pools, 4096, (count, shape.requests)) * kpool + kpool - 1).astype(xp.int32)
    return xp.ascontiguousarray(last[..., None] - xp.arange(shape.next_n, dtype=xp.int32)[::-1])


def paged_inputs(xp: Any, rng: Any, count: int, tokens: int, pages: int, kpool: int, block_size: int):
    """Pool ids ``[count, tokens, pages]`` and block tables ``[count, tokens, pages]``, int32, one token a request.

    Each token selects one pool in every page of its request's context
    (``pages * block_size`` positions), the pages in its own order; each
    table is a shuffle of all ``tokens * pages`` pages of its set. A
    permutation is the argsort of random keys (ties still give one).
    """
    per_page = block_size // kpool
    order = rng.integers(0, 1 << 30, (count, tokens, pages)).argsort(axis=-1)
    ids = (order * per_page + rng.integers(0, per_page, order.shape)).astype(xp.int32)
    shuffled = rng.integers(0, 1 << 30, (count, tokens * pages)).argsort(axis=-1)
    return ids, shuffled.astype(xp.int32).reshape(count, tokens, pages)


# Above this many calls, the composites (a Python loop of array operations per
# call) are timed with events: capturing tens of thousands of their calls
# would take longer than the rest of the sweep.
COMPOSITE_CAPTURE_CALLS = 4096


def composite_refusal(count: int) -> str | None:
    if count <= COMPOSITE_CAPTURE_CALLS:
        return None
    return f"{count} calls of array operations from Python; a graph is captured for at most {COMPOSITE_CAPTURE_CALLS}"


def device_rotation(bytes_per_set: int, allocated_per_set: int) -> dict[str, Any]:
    """Input sets to rotate so no call finds its inputs in L2, as in the compress sweep."""
    l2, source = l2_bytes()
    return {**rotation(bytes_per_set, allocated_per_set, l2), "l2_source": source}


def _record(name: str, nbytes: int, rotated: dict[str, Any], samples: int, ours, composite, result=None):
    """Time both on the same input sets; the composite's result on the first set is compared with ours first
    (``result`` picks the compared array from what ours returns)."""
    import cupy

    count = rotated["sets"]
    output = ours(0)
    want = cupy.array(output if result is None else result(output), copy=True)
    difference = max_abs_difference(cupy, composite(0), want)
    copy = copy_roof(nbytes, count, samples)
    implementations = {
        "kpool-cupy": timed_entry(ours, count, samples, nbytes, copy["gbps"]),
        "cupy-composite": timed_entry(composite, count, samples, nbytes, copy["gbps"], composite_refusal(count)),
    }
    implementations["cupy-composite"]["max_abs_diff_vs_kpool_cupy"] = difference
    ratios_to(implementations)
    return {
        "name": name,
        "bytes": nbytes,
        "input_sets": count,
        "rotation": rotated,
        "copy": copy,
        "implementations": implementations,
    }


def bench_tail_update(shape: DecodeShape, samples: int) -> dict[str, Any]:
    """The input sets are views of one array per operand, so tens of thousands of them stay cheap to make."""
    import cupy

    import kpool_cupy

    dtype = element_dtype(shape.dtype)
    requests, next_n, kpool, head_dim = shape.requests, shape.next_n, shape.kpool, shape.head_dim
    ring, pools = shape.ring, shape.pools
    row = head_dim * dtype.itemsize
    allocated = requests * (2 * ring * row + 2 * next_n * row + pools * row + 8 * next_n + 4 * pools)
    nbytes = tail_update_bytes(shape)
    rotated = device_rotation(nbytes, allocated)
    count = rotated["sets"]
    rng = cupy.random.default_rng(0)
    positions = step_positions(cupy, rng, count, shape)
    # Random rings, so the members read back from earlier steps weigh in the comparison.
    tail = rng.standard_normal((count, requests, 2, ring, head_dim), dtype=cupy.float32).astype(dtype)
    k = rng.standard_normal((count, requests, next_n, head_dim), dtype=cupy.float32).astype(dtype)
    gate = rng.standard_normal((count, requests, next_n, head_dim), dtype=cupy.float32).astype(dtype)
    out = cupy.empty((count, requests, pools, head_dim), dtype=dtype)
    closed = cupy.empty((count, requests, pools), dtype=cupy.int32)
    # ape and the slots are read by every call: shared, like the model's weights (not counted in the bytes).
    ape = rng.standard_normal((kpool, head_dim), dtype=cupy.float32)
    slots = cupy.arange(requests, dtype=cupy.int32)
    sets = [
        {"tail": tail[i], "k": k[i], "gate": gate[i], "ape": ape, "positions": positions[i], "slot_idx": slots,
         "out": out[i], "closed": closed[i]}
        for i in range(count)
    ]  # fmt: skip

    def ours(i: int) -> Any:
        return kpool_cupy.kpool_tail_update(**sets[i], validate=False)

    def composite(i: int) -> Any:
        s = sets[i]
        return composite_tail_update(cupy, s["tail"], s["k"], s["gate"], s["ape"], s["positions"], slots, kpool)

    return _record(f"tail-update {shape.name}", nbytes, rotated, samples, ours, composite, lambda out: out[0])


BLOCK_SIZE = 64  # tokens a page of the paged cache holds in the paged expand records (engines use 16 to 256)


def bench_expand(tokens: int, kpool: int, samples: int) -> dict[str, Any]:
    """One request of ``tokens`` tokens; pool ids drawn in [-1, 8192)."""
    import cupy

    import kpool_cupy

    nbytes = expand_bytes(tokens, POOL_TOPK, kpool)
    rotated = device_rotation(nbytes, nbytes)
    count = rotated["sets"]
    rng = cupy.random.default_rng(1)
    chunk = rng.integers(-1, 8192, (count, tokens, POOL_TOPK)).astype(cupy.int32)
    ids = [chunk[i] for i in range(count)]  # one array, a view per set
    offsets = cupy.asarray(np.array([0, tokens], np.int32))
    cache = cupy.zeros(1, dtype=cupy.int32)
    member = cupy.arange(kpool, dtype=cupy.int64)

    def ours(i: int) -> Any:
        return kpool_cupy.kpool_expand_topk(ids[i], offsets, cache, kpool=kpool, validate=False)

    def composite(i: int) -> Any:
        return composite_expand(cupy, ids[i], member)

    return _record(f"expand-topk {tokens}x{POOL_TOPK}", nbytes, rotated, samples, ours, composite)


def bench_expand_paged(tokens: int, kpool: int, samples: int) -> dict[str, Any]:
    """A decode step of ``tokens`` requests of one token, each with a block table of POOL_TOPK pages of
    BLOCK_SIZE positions: every token selects one pool in every page of its request, in its own order, and
    every input set has its own table, its pages a shuffle of all the requests' pages."""
    import cupy

    import kpool_cupy

    if BLOCK_SIZE % kpool:
        raise ValueError(f"Invalid kpool: expected a divisor of the block size {BLOCK_SIZE}, got {kpool}")
    pages = POOL_TOPK  # a request's pages: one selected pool in each, so no block-table entry serves two pools
    nbytes = expand_bytes(tokens, POOL_TOPK, kpool, paged=True)
    rotated = device_rotation(nbytes, nbytes)
    count = rotated["sets"]
    rng = cupy.random.default_rng(2)
    chunk, tables = paged_inputs(cupy, rng, count, tokens, pages, kpool, BLOCK_SIZE)
    ids = [chunk[i] for i in range(count)]  # one array per operand, a view per set
    table = [tables[i] for i in range(count)]
    offsets = cupy.arange(tokens + 1, dtype=cupy.int32)
    cache = cupy.full(tokens, pages * BLOCK_SIZE - 1, dtype=cupy.int32)  # the table reaches the whole context
    request = cupy.arange(tokens, dtype=cupy.int64)  # token t is request t's
    member = cupy.arange(kpool, dtype=cupy.int64)

    def ours(i: int) -> Any:
        return kpool_cupy.kpool_expand_topk(
            ids[i], offsets, cache, kpool=kpool, block_table=table[i], block_size=BLOCK_SIZE, validate=False
        )

    def composite(i: int) -> Any:
        return composite_expand(cupy, ids[i], member, table[i], BLOCK_SIZE, request)

    return _record(f"expand-topk {tokens}x{POOL_TOPK} paged-{BLOCK_SIZE}", nbytes, rotated, samples, ours, composite)


def run_lifecycle(quick: bool, samples: int) -> Iterator[dict[str, Any]]:
    """The decode-side records, one at a time (the caller saves each)."""
    for shape in decode_shapes(quick):
        yield bench_tail_update(shape, samples)
    for tokens in (64, 512) if quick else (1, 64, 512):
        yield bench_expand(tokens, 4, samples)
    for tokens in (512,) if quick else (64, 512):
        yield bench_expand_paged(tokens, 4, samples)
