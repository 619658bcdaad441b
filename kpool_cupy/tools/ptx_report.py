"""What `kpool-cupy ptx` reads off a compiled variant: registers, spills and 128-bit accesses.

The one place that knows how NVRTC spells these accesses: the command and
the PTX tests count them through `count_accesses`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..kernel.nvrtc import kernel_ptx, kernel_ptxas_report
from .variants import op_variant

# A 16-byte global access: one v4 of 32-bit lanes (ld.global.nc when read-only).
VECTOR_LOAD = re.compile(r"\bld\.global(?:\.nc)?(?:\.L\w+::\w+)*\.v4\.(?:u32|b32|f32|s32)\b")
VECTOR_STORE = re.compile(r"\bst\.global(?:\.L\w+::\w+)*\.v4\.(?:u32|b32|f32|s32)\b")
SCALAR_LOAD = re.compile(r"\bld\.global(?:\.nc)?(?:\.L\w+::\w+)*\.(?:u8|u16|b16|u32|b32|f32|s32|u64|s64|b64)\b")
LOCAL = re.compile(r"\b(?:ld|st)\.local\b|\.local\s")
# 8 bytes a thread in one global store: a v2 of 32-bit lanes, or one 64-bit word.
EIGHT_BYTE_STORE = re.compile(r"\bst\.global(?:\.L\w+::\w+)*\.(?:v2\.(?:u32|b32)|u64|b64)\b")
BYTE_STORE = re.compile(r"\bst\.global(?:\.L\w+::\w+)*\.u8\b")
BUTTERFLY_SHUFFLE = re.compile(r"\bshfl\.sync\.bfly\b")


@dataclass(frozen=True)
class PtxAccesses:
    """Static counts of one kernel's PTX text (a loop's body counts once, however often it runs)."""

    vector_loads: int  # 16-byte global loads: ld.global[.nc].v4 of 32-bit lanes
    vector_stores: int  # 16-byte global stores: st.global.v4 of 32-bit lanes
    scalar_loads: int  # global loads of one element, 1 to 8 bytes
    eight_byte_stores: int  # st.global.v2.u32/.b32, .u64 or .b64
    byte_stores: int  # st.global.u8
    butterfly_shuffles: int  # shfl.sync.bfly
    local_memory: bool  # any .local declaration, load or store


def count_accesses(ptx: str) -> PtxAccesses:
    """The global loads and stores, butterfly shuffles and local memory of ``ptx``, by the spellings above.

    Cache and eviction hints (``.L1::no_allocate`` and the like) between the
    state space and the vector or type suffix are allowed everywhere.
    """
    return PtxAccesses(
        vector_loads=len(VECTOR_LOAD.findall(ptx)),
        vector_stores=len(VECTOR_STORE.findall(ptx)),
        scalar_loads=len(SCALAR_LOAD.findall(ptx)),
        eight_byte_stores=len(EIGHT_BYTE_STORE.findall(ptx)),
        byte_stores=len(BYTE_STORE.findall(ptx)),
        butterfly_shuffles=len(BUTTERFLY_SHUFFLE.findall(ptx)),
        local_memory=bool(LOCAL.search(ptx)),
    )


@dataclass(frozen=True)
class PtxSummary(PtxAccesses):
    """One op's variant: ptxas's registers and spills, and the PTX's static access counts."""

    kernel: str  # the instance compiled
    registers: int
    spill_stores: int
    spill_loads: int
    ptx: str


def summarize(head_dim: int, kpool: int, dtype: str, arch: str, op: str = "compress") -> PtxSummary:
    """`kpool-cupy ptx` for ``op``'s variant (``tools.variants``): what NVRTC's PTX and ptxas say."""
    kernel, name = op_variant(op, head_dim, kpool, dtype, arch)
    ptx = kernel_ptx(kernel.source, name, arch)
    report = kernel_ptxas_report(kernel.source, name, arch)
    return PtxSummary(
        **count_accesses(ptx).__dict__,
        kernel=name,
        registers=report.registers,
        spill_stores=report.spill_stores,
        spill_loads=report.spill_loads,
        ptx=ptx,
    )
