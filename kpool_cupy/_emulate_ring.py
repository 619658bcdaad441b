"""Ring close, seed tail, tail update and expand top-k on the CPU, running kernels/kpool_ring.cu and kpool_expand.cu.

Same flow as the GPU path (``_ring_driver``); the launches go to the emulator.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import HostArrays
from ._geometry import LaunchGeometry
from ._ring_driver import KernelRingBackend, run_expand_topk, run_ring_close, run_seed_tail, run_tail_update
from ._validate import check_host_arrays


class _EmulatedRing(HostArrays, KernelRingBackend):
    def launch(self, source: str, name: str, geometry: LaunchGeometry, args: tuple[Any, ...]) -> None:
        from . import emulate

        emulate.launch(source, name, geometry.grid, geometry.block, args)


def kpool_ring_close(
    tail: np.ndarray,
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    slot_idx: np.ndarray,
    *,
    out: np.ndarray | None = None,
    closed: np.ndarray | None = None,
    validate: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Close each request's pending pool, running the CUDA kernel on the CPU.

    Same contract as :func:`kpool_cupy.kpool_ring_close`.
    """
    check_host_arrays(
        "emulate",
        tail=tail,
        k=k,
        gate=gate,
        ape=ape,
        input_row_offsets=input_row_offsets,
        cache_lengths=cache_lengths,
        slot_idx=slot_idx,
        out=out,
        closed=closed,
    )
    return run_ring_close(
        _EmulatedRing(), tail, k, gate, ape, input_row_offsets, cache_lengths, slot_idx, out, closed, validate
    )


def kpool_seed_tail(
    tail: np.ndarray,
    k: np.ndarray,
    gate: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    slot_idx: np.ndarray,
    *,
    validate: bool = True,
) -> None:
    """Stash each request's trailing tokens into its ring, running the CUDA kernel on the CPU.

    Same contract as :func:`kpool_cupy.kpool_seed_tail`.
    """
    check_host_arrays(
        "emulate",
        tail=tail,
        k=k,
        gate=gate,
        input_row_offsets=input_row_offsets,
        cache_lengths=cache_lengths,
        slot_idx=slot_idx,
    )
    run_seed_tail(_EmulatedRing(), tail, k, gate, input_row_offsets, cache_lengths, slot_idx, validate)


def kpool_tail_update(
    tail: np.ndarray,
    k: np.ndarray,
    gate: np.ndarray,
    ape: np.ndarray,
    positions: np.ndarray,
    slot_idx: np.ndarray,
    *,
    out: np.ndarray | None = None,
    closed: np.ndarray | None = None,
    validate: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """The decode step, running the CUDA kernel on the CPU; same contract as :func:`kpool_cupy.kpool_tail_update`."""
    check_host_arrays(
        "emulate", tail=tail, k=k, gate=gate, ape=ape, positions=positions, slot_idx=slot_idx, out=out, closed=closed
    )
    return run_tail_update(_EmulatedRing(), tail, k, gate, ape, positions, slot_idx, out, closed, validate)


def kpool_expand_topk(
    pool_ids: np.ndarray,
    input_row_offsets: np.ndarray,
    cache_lengths: np.ndarray,
    *,
    kpool: int,
    always_select_tail: bool = False,
    validate: bool = True,
) -> np.ndarray:
    """Selected pool ids to token positions, running the CUDA kernel on the CPU.

    Same contract as :func:`kpool_cupy.kpool_expand_topk`.
    """
    check_host_arrays("emulate", pool_ids=pool_ids, input_row_offsets=input_row_offsets, cache_lengths=cache_lengths)
    return run_expand_topk(
        _EmulatedRing(), pool_ids, input_row_offsets, cache_lengths, kpool, always_select_tail, validate
    )
