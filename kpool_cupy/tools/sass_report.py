"""What `kpool-cupy ptx --sass --op OP` reports for one op's variant: the SASS counts, the blocks an SM holds
at the op's launch shape, and the dependent global-load depth (``tools.load_depth``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..kernel.geometry import LaunchGeometry
from . import sass
from .load_depth import TENSOR_CORE, load_depth
from .sass import SassSummary, sm_arch
from .variants import OP_SPECS, op_variant

# Per SM (CUDA C++ Programming Guide, compute capabilities table): resident threads and blocks. Every one of
# these has 65,536 32-bit registers, allocated to a warp in units of 256 (8 a thread).
_SM_LIMITS = {"80": (2048, 32), "86": (1536, 16), "87": (2048, 32), "89": (1536, 24), "90": (2048, 32)}
REGISTERS_PER_SM = 65536


def blocks_per_sm(registers: int, block_threads: int, arch: str = "sm_90") -> int | None:
    """Blocks of ``block_threads`` threads using ``registers`` each that one SM holds at once (no shared memory
    in these kernels), None for an architecture not in the table."""
    limits = _SM_LIMITS.get(sm_arch(arch).removeprefix("sm_"))
    if limits is None:
        return None
    threads, blocks = limits
    warps = -(-block_threads // 32)
    per_warp = -(-max(registers, 1) // 8) * 8 * 32
    return min(blocks, threads // (warps * 32), REGISTERS_PER_SM // (warps * per_warp))


def launch_geometry(op: str, head_dim: int) -> LaunchGeometry:
    """The blocks ``op`` launches for a large batch: its spec's ``large_launch``."""
    return OP_SPECS[op].large_launch(head_dim)


@dataclass(frozen=True)
class OpSass:
    kernel: str
    machine: SassSummary
    block_threads: int
    blocks_per_sm: int | None
    load_depth: int
    tensor_core: int  # static tensor-core instructions (HMMA, QMMA, HGMMA, QGMMA)


def op_sass(op: str, head_dim: int, kpool: int, dtype: str, arch: str = "sm_90") -> OpSass:
    """The report of ``op``'s variant (``tools.variants``) for ``arch``'s SASS."""
    kernel, name = op_variant(op, head_dim, kpool, dtype, sm_arch(arch))
    machine = sass.summarize_sass(kernel.source, name, arch=sm_arch(arch))
    block = launch_geometry(op, head_dim).block
    occupancy = blocks_per_sm(machine.registers, block, arch)
    return OpSass(name, machine, block, occupancy, load_depth(machine.sass).depth, tensor_core_count(machine.sass))


def tensor_core_count(text: str) -> int:
    """Static tensor-core instructions in SASS text (``load_depth.TENSOR_CORE``): a warp's HMMA (f16, and e4m3
    mma.sync on sm_90, which ptxas lowers to two f16 HMMAs) and QMMA (e4m3 on sm_89 and sm_120), a warpgroup's
    HGMMA and QGMMA (wgmma on sm_90a)."""
    return sum(i.opcode[0] in TENSOR_CORE for i in sass.parse_instructions(text)[0])
