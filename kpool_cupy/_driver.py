"""The flow of one kpool_compress call, the same for every backend.

Validate, find the pool row offsets, size the output, decide how many pool
slots the grid covers, then hand over to the backend. Backends differ only in
where arrays live and in how the pooling runs (a CUDA launch, the emulated
launch, or NumPy).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ._geometry import pool_slots
from ._pools import pool_row_offsets as compute_pool_row_offsets
from ._validate import CompressCall, check_compress_args, check_offset_values, check_out_rows


class Backend(Protocol):
    def host_copies(self, arrays: list[Any]) -> list[np.ndarray]:
        """Host copies of small index arrays, in one transfer where that matters."""
        ...

    def from_host(self, array: np.ndarray) -> Any: ...

    def empty(self, shape: tuple[int, int], dtype: np.dtype) -> Any: ...

    def pool(self, call: CompressCall, slots: int, arrays: tuple[Any, Any, Any, Any, Any, Any], out: Any) -> None:
        """Write the pooled rows of pools [0, slots) into ``out``.

        ``arrays`` is (k, gate, ape, input_row_offsets, cache_lengths,
        pool_row_offsets), the last already resolved.
        """
        ...


def run_compress(
    backend: Backend,
    k: Any,
    gate: Any,
    ape: Any,
    input_row_offsets: Any,
    cache_lengths: Any,
    pool_row_offsets: Any,
    out: Any,
    validate: bool,
) -> Any:
    call = check_compress_args(k, gate, ape, input_row_offsets, cache_lengths, pool_row_offsets, out)
    total_pools: int | None
    if validate:
        given = [input_row_offsets, cache_lengths] + ([pool_row_offsets] if pool_row_offsets is not None else [])
        host = backend.host_copies(given)
        pools_host = check_offset_values(call, host[0], host[1], host[2] if len(host) > 2 else None)
        total_pools = int(pools_host[-1])
        check_out_rows(out, total_pools)
        pools = pool_row_offsets if pool_row_offsets is not None else backend.from_host(pools_host)
    else:
        pools = (
            pool_row_offsets
            if pool_row_offsets is not None
            else compute_pool_row_offsets(input_row_offsets, cache_lengths, call.kpool)
        )
        # With out= the count stays on the device (no sync); otherwise it sizes
        # the result. Unvalidated offsets may claim any count, but no batch
        # completes more than total_tokens // kpool pools.
        total_pools = None
        if out is None:
            claimed = int(backend.host_copies([pools[-1:]])[0][0])
            total_pools = min(max(claimed, 0), call.total_tokens // call.kpool)
    if out is None:
        out = backend.empty((total_pools or 0, call.head_dim), call.out_dtype)
    slots = pool_slots(total_pools, call.total_tokens, call.kpool, int(out.shape[0]))
    if slots > 0:
        backend.pool(call, slots, (k, gate, ape, input_row_offsets, cache_lengths, pools), out)
    return out
