"""A Triton kernel with the geometry the engines use, for `kpool-cupy bench` only.

One program per pool, the channels across its lanes, two passes over the
members: the first finds each channel's maximum logit, the second sums the
weights and the weighted keys. Importing this module needs triton.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl


@triton.jit
def _pool_kernel(
    k_ptr, gate_ptr, ape_ptr, first_ptr, out_ptr, k_stride, gate_stride, out_stride,
    HEAD_DIM: tl.constexpr, KPOOL: tl.constexpr,
):  # fmt: skip
    pool = tl.program_id(0)
    first = tl.load(first_ptr + pool).to(tl.int64)
    channels = tl.arange(0, HEAD_DIM)
    peak = tl.full([HEAD_DIM], float("-inf"), tl.float32)
    for m in tl.static_range(KPOOL):
        logit = tl.load(gate_ptr + (first + m) * gate_stride + channels).to(tl.float32)
        peak = tl.maximum(peak, logit + tl.load(ape_ptr + m * HEAD_DIM + channels))
    weight_sum = tl.zeros([HEAD_DIM], tl.float32)
    weighted = tl.zeros([HEAD_DIM], tl.float32)
    for m in tl.static_range(KPOOL):
        logit = tl.load(gate_ptr + (first + m) * gate_stride + channels).to(tl.float32)
        weight = tl.exp(logit + tl.load(ape_ptr + m * HEAD_DIM + channels) - peak)
        weight_sum += weight
        weighted += weight * tl.load(k_ptr + (first + m) * k_stride + channels).to(tl.float32)
    result = weighted / weight_sum
    tl.store(out_ptr + pool * out_stride + channels, result.to(out_ptr.dtype.element_ty))


def triton_pool(k: Any, gate: Any, ape: Any, first: Any, out: Any, kpool: int) -> Any:
    """Pool into ``out`` (torch tensors); head_dim must be a power of two for tl.arange."""
    pools, head_dim = out.shape
    if pools:
        _pool_kernel[(pools,)](
            k, gate, ape, first, out, k.stride(0), gate.stride(0), out.stride(0), HEAD_DIM=head_dim, KPOOL=kpool
        )
    return out
