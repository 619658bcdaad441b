"""The one launch-geometry rule, shared by the GPU launcher and the CPU emulator.

The emulator runs the grid this returns thread by thread, surplus threads
included, so what it checks is the launch the GPU gets.
"""

from __future__ import annotations

from dataclasses import dataclass

CHANNELS_PER_THREAD = 8  # kp::kChannelsPerThread in kernels/kpool_common.cuh
TARGET_THREADS_PER_BLOCK = 256


@dataclass(frozen=True)
class LaunchGeometry:
    grid: int
    block: int


def launch_geometry(head_dim: int, pool_slots: int) -> LaunchGeometry:
    """Blocks of several pools, head_dim / 8 threads per pool, covering ``pool_slots`` pools.

    ``pool_slots`` may exceed the real pool count (when the count lives only on
    the device); the kernel reads the exact count and surplus threads exit.
    """
    lanes = head_dim // CHANNELS_PER_THREAD
    pools_per_block = max(1, TARGET_THREADS_PER_BLOCK // lanes)
    grid = -(-pool_slots // pools_per_block)
    return LaunchGeometry(grid=grid, block=lanes * pools_per_block)


def pool_slots(total_pools: int | None, total_tokens: int, kpool: int, out_rows: int) -> int:
    """How many pools the grid covers.

    The exact count when the host knows it; otherwise the bound every request
    obeys (a request of n tokens completes at most n // kpool pools, so the
    batch at most total_tokens // kpool), capped by the rows of ``out``.
    """
    bound = min(total_tokens // kpool, out_rows)
    return bound if total_pools is None else min(total_pools, bound)


def flat_geometry(elements: int) -> LaunchGeometry:
    """One thread per element, in blocks of TARGET_THREADS_PER_BLOCK (expand top-k)."""
    return LaunchGeometry(grid=-(-elements // TARGET_THREADS_PER_BLOCK), block=TARGET_THREADS_PER_BLOCK)
