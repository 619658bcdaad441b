"""The GPU path of ring close, seed tail, tail update and expand top-k."""

from __future__ import annotations

from typing import Any

from ._cupy_backend import CupyArrays, kernel_function, on_device
from ._geometry import LaunchGeometry
from ._ring_driver import KernelRingBackend, run_expand_topk, run_ring_close, run_seed_tail, run_tail_update


class _CupyRing(CupyArrays, KernelRingBackend):
    def launch(self, source: str, name: str, geometry: LaunchGeometry, args: tuple[Any, ...]) -> None:
        kernel_function(source, name, self.device_id)((geometry.grid,), (geometry.block,), args)


def kpool_ring_close(
    tail: Any,
    k: Any,
    gate: Any,
    ape: Any,
    input_row_offsets: Any,
    cache_lengths: Any,
    slot_idx: Any,
    *,
    out: Any = None,
    closed: Any = None,
    validate: bool = True,
    stream: Any = None,
) -> tuple[Any, Any]:
    """Close each request's pending pool from its ring and this call's first tokens.

        pooled[b] = kpool_compress's pool c // kpool, members m < c % kpool
                    from ring positions m, the rest from the call's first tokens

    For a request whose cached prefix ends mid-pool (``c % kpool != 0``) and
    whose call brings at least ``kpool - c % kpool`` tokens. ``tail`` is
    ``[max_slots, 2, kpool, head_dim]`` in the dtype of k (0 keys, 1 gate
    scores), request b's ring is slot ``slot_idx[b]``; it is read, never
    written. The ring holds raw values, so the pool equals, bit for bit, the
    one kpool_compress builds over the whole sequence.

    Returns
    -------
    (pooled, closed)
        pooled ``[batch, head_dim]`` (k's dtype or float32 ``out``), closed
        ``[batch]`` int32: the pool id, or -1 where nothing closed (that
        pooled row is left alone).
    """
    named = {
        "tail": tail,
        "k": k,
        "gate": gate,
        "ape": ape,
        "input_row_offsets": input_row_offsets,
        "cache_lengths": cache_lengths,
        "slot_idx": slot_idx,
        "out": out,
        "closed": closed,
    }
    with on_device(named, stream) as (cupy, device_id, arrays):
        return run_ring_close(_CupyRing(cupy, device_id), *arrays.values(), validate)


def kpool_seed_tail(
    tail: Any,
    k: Any,
    gate: Any,
    input_row_offsets: Any,
    cache_lengths: Any,
    slot_idx: Any,
    *,
    validate: bool = True,
    stream: Any = None,
) -> None:
    """Stash each request's trailing tokens into its ring, in place.

    Positions ``[max(floor((c + n) / kpool) * kpool, c), c + n)`` go to ring
    position ``pos % kpool`` of slot ``slot_idx[b]``: the start of the pool a
    later call completes. A prefill chunk calls ring close, then compress, then
    seed tail. With ``validate=True`` each slot must belong to one request.
    """
    named = {
        "tail": tail,
        "k": k,
        "gate": gate,
        "input_row_offsets": input_row_offsets,
        "cache_lengths": cache_lengths,
        "slot_idx": slot_idx,
    }
    with on_device(named, stream) as (cupy, device_id, arrays):
        run_seed_tail(_CupyRing(cupy, device_id), *arrays.values(), validate)


def kpool_tail_update(
    tail: Any,
    k: Any,
    gate: Any,
    ape: Any,
    positions: Any,
    slot_idx: Any,
    *,
    out: Any = None,
    closed: Any = None,
    validate: bool = True,
    stream: Any = None,
) -> tuple[Any, Any]:
    """The decode step: stash each token in its request's ring, close every pool it completes.

    ``k``, ``gate`` ``[R, next_n, head_dim]`` (k's dtype), ``positions``
    ``[R, next_n]`` int32 with -1 for padding. Each request's tokens are
    walked in order; every real token is stashed at ring position
    ``pos % kpool``, and pool ``pos // kpool`` closes from the ring when
    ``pos % kpool == kpool - 1``. A padded entry leaves the ring byte-identical.

    Returns
    -------
    (pooled, closed)
        pooled ``[R, ceil(next_n / kpool), head_dim]`` and closed
        ``[R, ceil(next_n / kpool)]`` int32: the pool ids closed, in order,
        padded with -1 (those pooled rows are left alone).
    """
    named = {
        "tail": tail,
        "k": k,
        "gate": gate,
        "ape": ape,
        "positions": positions,
        "slot_idx": slot_idx,
        "out": out,
        "closed": closed,
    }
    with on_device(named, stream) as (cupy, device_id, arrays):
        return run_tail_update(_CupyRing(cupy, device_id), *arrays.values(), validate)


def kpool_expand_topk(
    pool_ids: Any,
    input_row_offsets: Any,
    cache_lengths: Any,
    *,
    kpool: int,
    always_select_tail: bool = False,
    validate: bool = True,
    stream: Any = None,
) -> Any:
    """Selected pool ids ``[total_tokens, pool_topk]`` to token positions, int32.

        positions[t, s*kpool + j] = pool_ids[t, s] * kpool + j, or -1 where pool_ids[t, s] < 0

    A -1 id stays -1 in all its columns, never a clamped valid position (so
    does an id whose positions would not fit int32). With
    ``always_select_tail``, ``kpool - 1`` more columns hold the query's
    trailing positions no complete pool covers yet: with ``visible =
    cache_len + local_index + 1``, column ``i < visible % kpool`` holds
    ``visible - visible % kpool + i``, the rest -1.
    """
    named = {"pool_ids": pool_ids, "input_row_offsets": input_row_offsets, "cache_lengths": cache_lengths}
    with on_device(named, stream) as (cupy, device_id, arrays):
        return run_expand_topk(_CupyRing(cupy, device_id), *arrays.values(), kpool, always_select_tail, validate)
