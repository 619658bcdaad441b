"""The scorer as an engine without an FP8 scoring kernel runs it (sm_80, sm_120 today): torch operations in bf16.

    keys    = bf16(e4m3(cache[block_table])) * bf16(scales)   # [B, pools, D]
    queries = bf16(e4m3(q))                                   # [B, next_n * H, D]
    scores  = relu(queries @ keys^T)                          # [B, next_n * H, pools], bf16
    logits  = sum over h of weights * scores                  # float32 [B * next_n, pools], -inf past what a token sees

The scale multiplies the key before the matmul, not the logit after it: relu
of a scaled score is the scaled relu only for a positive scale, and the
kernel's contract is the former. Importing this module needs no torch; the
functions do.
"""

from __future__ import annotations

from typing import Any

from ..kernel.pages import FP8_PAGES
from .impls import torch_unavailable

# Every e4m3 value is a bf16 value and the writers' scales are powers of two, so the keys and queries are
# exact in bf16; the one rounding the kernel does not make is each score's, to bf16 (unit roundoff 2^-8),
# before its relu. So |torch - kernel| <= 2^-8 * sum over h of |w_h| relu(score_h); twice that leaves room for
# both sides' float32 sums (128 channels, up to 128 heads: far below 2^-8) and for that magnitude being summed
# from rounded scores itself.
BF16_SCORE_TOLERANCE = 2.0**-7


def torch_index_logits(cache: Any, block_table: Any, q: Any, weights: Any, seen: Any) -> Any:
    """The composite on torch tensors of one device: float32 ``[tokens, pools]``.

    ``cache`` uint8 ``[pages, block_size, head_dim + 4]``, ``block_table``
    ``[B, columns]``, ``q`` uint8 ``[B * next_n, H, head_dim]`` (request b's
    tokens consecutive), ``weights`` float32 ``[B * next_n, H]``, ``seen`` bool
    ``[next_n, pools]``: which pools each of a request's tokens sees, the same
    for every request.
    """
    import torch

    requests, (next_n, pools) = block_table.shape[0], seen.shape
    heads, head_dim = q.shape[1], q.shape[2]
    split = FP8_PAGES.scale_offset(cache.shape[1], head_dim, 0)  # a page's values, then its scales
    pages = cache[block_table.long()].reshape(requests, block_table.shape[1], -1)  # [B, columns, page bytes]
    values = pages[:, :, :split].reshape(requests, -1, head_dim)[:, :pools]
    scales = pages[:, :, split:].contiguous().view(torch.float32).reshape(requests, -1)[:, :pools]
    keys = values.view(torch.float8_e4m3fn).to(torch.bfloat16) * scales.to(torch.bfloat16)[:, :, None]
    queries = q.view(torch.float8_e4m3fn).to(torch.bfloat16).reshape(requests, next_n * heads, head_dim)
    scores = torch.matmul(queries, keys.transpose(1, 2)).relu_().reshape(requests, next_n, heads, pools)
    logits = (scores * weights.reshape(requests, next_n, heads, 1)).sum(dim=2)  # bf16 x float32: float32
    return torch.where(seen, logits, float("-inf")).reshape(requests * next_n, pools)


def worst_fraction_of_bound(xp: Any, got: Any, want: Any, magnitude: Any) -> float:
    """The largest ``|got - want|`` over its bound, ``BF16_SCORE_TOLERANCE * magnitude``, where ``want`` is
    finite (at most 1: within); ``magnitude`` is the composite with ``|weights|``. ``xp``: numpy or cupy."""
    finite = xp.isfinite(want)
    difference = xp.abs(xp.where(finite, got, 0) - xp.where(finite, want, 0))  # no -inf - -inf
    bound = BF16_SCORE_TOLERANCE * xp.where(finite, magnitude, 0)
    return float((difference / xp.maximum(bound, 1e-30)).max()) if want.size else 0.0


def torch_index_composite(sets: list[dict[str, Any]], seen: Any) -> tuple[Any, str | None]:
    """A runner ``run(i)`` of the composite on CuPy input set ``i`` (zero-copy views, on CuPy's current stream,
    which the events time), returning a new torch tensor; or None and the reason there is none."""
    why = torch_unavailable()
    if why is not None:
        return None, why
    import cupy
    import torch

    stream = torch.cuda.ExternalStream(cupy.cuda.get_current_stream().ptr)
    names = ("cache", "cache_block_table", "q", "weights")
    views = [[torch.as_tensor(s[n], device="cuda") for n in names] for s in sets]
    mask = torch.as_tensor(seen, device="cuda")

    def run(i: int) -> Any:
        with torch.cuda.stream(stream):
            return torch_index_logits(*views[i], mask)

    return run, None
