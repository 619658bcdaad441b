"""What `kpool-cupy ptx --sass --op OP` reports for one op's variant: the SASS counts, the blocks an SM holds
at the op's launch shape, and the dependent global-load depth (``tools.load_depth``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..kernel.geometry import LaunchGeometry
from . import sass
from .load_depth import TENSOR_CORE, load_depth
from .sass import SassSummary, sm_arch
from .variants import OP_SPECS, arch_tensor_core, op_variant

# Per SM (CUDA C++ Programming Guide, the compute capabilities' table): resident threads and blocks, and the shared
# memory blocks can have (KiB). Every one has 65,536 32-bit registers, allocated to a warp in units of 256 (8 a
# thread), and keeps 1 KiB of shared memory a block for the system. An "a" target (sm_90a, sm_100a) is its base's.
_SM_LIMITS = {
    "80": (2048, 32, 164),
    "86": (1536, 16, 100),
    "87": (2048, 32, 164),
    "89": (1536, 24, 100),
    "90": (2048, 32, 228),
    "100": (2048, 32, 228),
    "120": (1536, 32, 100),
}
REGISTERS_PER_SM = 65536
SHARED_RESERVED_A_BLOCK = 1024


def blocks_per_sm(registers: int, block_threads: int, arch: str = "sm_90", shared_bytes: int = 0) -> int | None:
    """Blocks of ``block_threads`` threads using ``registers`` each and ``shared_bytes`` of static shared memory
    that one SM holds at once, None for an architecture not in the table."""
    limits = _SM_LIMITS.get(sm_arch(arch).removeprefix("sm_").removesuffix("a"))
    if limits is None:
        return None
    threads, blocks, shared_kib = limits
    warps = -(-block_threads // 32)
    per_warp = -(-max(registers, 1) // 8) * 8 * 32
    by_shared = shared_kib * 1024 // (shared_bytes + SHARED_RESERVED_A_BLOCK) if shared_bytes else blocks
    return min(blocks, threads // (warps * 32), REGISTERS_PER_SM // (warps * per_warp), by_shared)


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
    tensor_core: dict[str, int]  # static tensor-core instructions by opcode (HMMA, QMMA, HGMMA, QGMMA)
    shared_bytes: int  # static shared memory a block
    dynamic_bytes: int = 0  # dynamic shared memory a block of the engines' shape (OpSpec.large_dynamic_shared)
    copy_stages: int | None = None  # a cp.async pipeline's stages (``copy_stages``); None without one


def op_sass(op: str, head_dim: int, kpool: int, dtype: str, arch: str = "sm_90") -> OpSass:
    """The report of ``op``'s variant (``tools.variants``) for ``arch``'s SASS."""
    kernel, name = op_variant(op, head_dim, kpool, dtype, sm_arch(arch))
    machine = sass.summarize_sass(kernel.source, name, arch=sm_arch(arch))
    block = launch_geometry(op, head_dim).block
    dynamic = OP_SPECS[op].large_dynamic_shared(head_dim, arch_tensor_core(arch))
    occupancy = blocks_per_sm(machine.registers, block, arch, machine.shared_bytes + dynamic)
    depth = load_depth(machine.sass).depth
    tensor_core = tensor_core_opcodes(machine.sass)
    stages = copy_stages(machine.sass)
    return OpSass(name, machine, block, occupancy, depth, tensor_core, machine.shared_bytes, dynamic, stages)


def copy_stages(text: str) -> int | None:
    """The stages of a kernel's cp.async pipeline, read off its SASS: 2 more than the most copy groups a wait
    (``DEPBAR.LE SB0, n``) leaves in flight; None without LDGSTS or without such a wait. The multistage
    convention: a ring of S tiles, each step waits until at most S - 2 groups are pending, then issues the tile
    S - 1 ahead, so the tile being used, the S - 2 in flight and the one just issued make S (the scorer's sm_90a
    ring: ``kp::kWgmmaStages``)."""
    code, _ = sass.parse_instructions(text)
    if not any(i.opcode[0] == "LDGSTS" for i in code):
        return None
    pending = [
        int(operands[1], 0)
        for i in code
        if i.opcode[0] == "DEPBAR" and (operands := [part.strip() for part in i.operands.split(",")])[0] == "SB0"
    ]
    return max(pending) + 2 if pending else None


def tensor_core_opcodes(text: str) -> dict[str, int]:
    """Static tensor-core instructions in SASS text by opcode (HMMA, QMMA, HGMMA, QGMMA), those present only."""
    counts: dict[str, int] = {}
    for instruction in sass.parse_instructions(text)[0]:
        if instruction.opcode[0] in TENSOR_CORE:
            counts[instruction.opcode[0]] = counts.get(instruction.opcode[0], 0) + 1
    return counts


def tensor_core_count(text: str) -> int:
    """Static tensor-core instructions in SASS text (``load_depth.TENSOR_CORE``): a warp's HMMA (f16 mma.sync: sm_80's
    path and sm_90's, and e4m3 mma.sync had it run on sm_90, which ptxas lowers to two f16 HMMAs) and QMMA (e4m3
    on sm_89 and sm_120), a warpgroup's HGMMA and QGMMA (wgmma on sm_90a)."""
    return sum(i.opcode[0] in TENSOR_CORE for i in sass.parse_instructions(text)[0])
