"""What `kpool-cupy ptx` reads off a compiled variant: registers, spills and 128-bit accesses."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .nvrtc import compile_ptx, ptxas_report

# A 16-byte global access: one v4 of 32-bit lanes (ld.global.nc when read-only).
VECTOR_LOAD = re.compile(r"\bld\.global(?:\.nc)?(?:\.L\w+::\w+)*\.v4\.(?:u32|b32|f32|s32)\b")
VECTOR_STORE = re.compile(r"\bst\.global(?:\.L\w+::\w+)*\.v4\.(?:u32|b32|f32|s32)\b")
SCALAR_LOAD = re.compile(r"\bld\.global(?:\.nc)?(?:\.L\w+::\w+)*\.(?:u8|u16|b16|u32|b32|f32|s32|u64|s64|b64)\b")
LOCAL = re.compile(r"\b(?:ld|st)\.local\b|\.local\s")


@dataclass(frozen=True)
class PtxSummary:
    registers: int
    spill_stores: int
    spill_loads: int
    vector_loads: int
    vector_stores: int
    scalar_loads: int
    local_memory: bool
    ptx: str


def summarize(head_dim: int, kpool: int, dtype: str, arch: str) -> PtxSummary:
    ptx = compile_ptx(head_dim, kpool, dtype, arch=arch)
    report = ptxas_report(head_dim, kpool, dtype, arch=arch)
    return PtxSummary(
        registers=report.registers,
        spill_stores=report.spill_stores,
        spill_loads=report.spill_loads,
        vector_loads=len(VECTOR_LOAD.findall(ptx)),
        vector_stores=len(VECTOR_STORE.findall(ptx)),
        scalar_loads=len(SCALAR_LOAD.findall(ptx)),
        local_memory=bool(LOCAL.search(ptx)),
        ptx=ptx,
    )
