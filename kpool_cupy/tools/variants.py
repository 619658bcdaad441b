"""The kernel variant each op's tools look at: `kpool-cupy ptx --op` and the static-evidence tests.

One instance per op at a head_dim, kpool and element dtype: every element
type that dtype, every operand 16-byte aligned (the declaration's VECTOR
default), int32 indices, rows as the FP8 destination, the selections'
buffer for pool_topk 512 (the engines' GLM-5.x selection). Seed tail, expand
and the query side take no kpool (expand's is the pool width it expands).
"""

from __future__ import annotations

import string

from ..dtypes import element_dtype
from ..kernel.declarations import MMA_F16, Kernel, tensor_core_for
from ..kernel.nvrtc import arch_number, check_variant
from ..ops import OPS
from ..ops.families.selection import select_cap

# Each op's kernel, by the op's name without ``kpool_`` (as under torch.ops.kpool), from the op list.
OP_SPECS = {spec.name.removeprefix("kpool_"): spec for spec in OPS if spec.kernel}
OP_KERNELS: dict[str, Kernel] = {name: spec.kernel for name, spec in OP_SPECS.items() if spec.kernel}
ELEMENTS = ("T", "G", "KT", "GT", "OT", "DT")  # the template names of element types (what --dtype sets)
SELECT_POOL_TOPK = 512  # the selections' variant: the buffer that holds this many (select_cap)


def op_variant(op: str, head_dim: int, kpool: int, dtype: str, arch: str = "sm_90") -> tuple[Kernel, str]:
    """``op``'s kernel and the instance the tools compile for ``arch`` ('sm_NN', 'sm_NNa', 'sm_NNf' or 'compute_NN'); a
    ValueError naming the argument out of range. The scorer's tensor-core instruction is the one its launcher picks
    for that architecture: wgmma for sm_90a (the arch-specific build), f16 mma.sync on converted e4m3 for sm_90."""
    if op not in OP_KERNELS:
        raise ValueError(f"Invalid op: expected one of {', '.join(OP_KERNELS)}, got {op!r}")
    spec = OP_SPECS[op]
    kernel = OP_KERNELS[op]
    check_variant(head_dim, kpool)
    if spec.check_head_dim is not None:
        spec.check_head_dim("head_dim", head_dim)
    names = {t.name for t in kernel.template}
    element = element_dtype(dtype)
    template = {name: element for name in ELEMENTS if name in names}
    template |= {name: value for name, value in (("HEAD_DIM", head_dim), ("KPOOL", kpool)) if name in names}
    if "MMA" in names:
        template["MMA"] = arch_tensor_core(arch)
    if "CAP" in names:
        template["CAP"] = select_cap(SELECT_POOL_TOPK)
    return kernel, kernel.instance(**template)


def arch_tensor_core(arch: str) -> int:
    """The scorer's instruction the GPU backend picks on ``arch`` (below sm_80: the f16 one)."""
    number = arch_number(arch)  # "90a" for sm_90a and compute_90a
    kind = tensor_core_for(int(number.rstrip(string.ascii_lowercase)), sm90a=number.endswith("a"))
    return MMA_F16 if kind is None else kind
