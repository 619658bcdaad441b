"""DeepGEMM's indexer calls, in DeepGEMM's argument order, on torch tensors (CUDA and CPU).

    fp8_paged_mqa_logits (decode, a paged cache):
    logits[b * next_n + j, n] = sum over h of weights[b * next_n + j, h] * relu(s[n] * dot(q[b, j, h], k[n]))
                                for n < L(b, j), the request's cache entries in block_table's pages
                              = -inf for L(b, j) <= n < max_context_len
    L(b, j) = context_lens[b] - next_n + j + 1      (context_lens [B], counting the step's tokens)
            = context_lens[b, j]                     (context_lens [B, next_n])

    fp8_mqa_logits (prefill, a flat key array):
    logits[t, n] = sum over h of weights[t, h] * relu(scales[n] * dot(q[t, h], values[n]))  for ks[t] <= n < ke[t]
                 = -inf elsewhere in [0, N)
    with max_seqlen_k M > 0: [S, M], column c holding key ks[t] + c (-inf past the window)

    fp8_fp4_mqa_logits, fp8_fp4_paged_mqa_logits: newer releases' names for the two (q as (values, None)),
    with logits_dtype float32 or bfloat16.

One cache entry is one key (kpool 1): a pooled-cache caller passes entry
counts, as DeepGEMM's pooled callers do. ``context_lens`` counts the step's
own tokens; it is not the package's ``cache_lengths`` (tokens before the
call), which these calls derive from it on the device.

The calls run ``torch.ops.kpool.index_logits_fp8`` on torch's current
stream with no host read (``validate=False``, the default here: DeepGEMM
checks no contents either, so engines keep their CUDA graphs), into a result
from torch's allocator. Shapes and dtypes are still checked, and no input,
however bad, makes the kernel read outside its arrays: a page outside the
cache scores ``-inf``. ``validate=True`` reads the lengths and the table
back and refuses what the kernel would score as missing.

``fp8_mqa_logits`` runs the same scorer over the flat keys laid out as one
page (a copy of N * (D + 4) bytes), each token its own request seeing keys
``[0, ke)``, then writes ``-inf`` below ``ks`` (a pass over the result). The
keys below a token's window are scored and then masked: a scorer that
starts at a window (issue 33's restructure) would skip them. With
``max_seqlen_k`` each key is a page of one entry (the same copy, each entry
padded to a multiple of 16 bytes so the scorer's 16-byte loads take it), and token
t's table row points its entry c at key ``ks[t] + c`` (a table of S * M
int32): only the windows are scored, and no ``[S, N]`` result is made.
"""

from __future__ import annotations

from typing import Any

try:
    import torch
except ImportError as error:  # said as kpool_cupy.torch says it, not torch's bare ModuleNotFoundError
    raise ImportError("kpool_cupy.compat.deep_gemm needs PyTorch: pip install 'kpool-cupy[torch]'") from error

import kpool_cupy.torch as kt

from ..arrays import type_name
from ..ops.families.scoring import LENGTHS_HINT, MAX_POOLS
from ..ops.framework.checks import MAX_CACHE_LENGTH, check_bool, check_integer, check_nowhere, dtype_fail, fail

# The scorer's arguments by DeepGEMM's names: a refusal names what the caller passed.
_DEEP_GEMM_NAMES = {
    "cache": "kv_cache",
    "cache_block_table": "block_table",
    "cache_lengths": "context_lens",
    "input_row_offsets": "context_lens",
    "max_pools": "max_context_len",
    "out": "max_context_len",
}


# The same for the flat call: the keys are kv, each token's window end is cu_seq_len_k_end.
_FLAT_NAMES = {
    "cache": "kv",
    "cache_lengths": "cu_seq_len_k_end",
    "input_row_offsets": "q",
    "max_pools": "cu_seq_len_k_end",
}


# What a refusal's words mean in a DeepGEMM call: the scorer counts pools, and at kpool 1 a pool is one key.
_POOLS_ARE_KEYS = ", at kpool 1: a pool is a key"
_PAGED_NOTES = {
    "q": ": this call's q [B, next_n, H, D] as [B * next_n, H, D]",
    "max_pools": _POOLS_ARE_KEYS,
    "out": _POOLS_ARE_KEYS,
}
_FLAT_NOTES = {"max_pools": _POOLS_ARE_KEYS}
# With max_seqlen_k: the scorer's pools are the window's keys, its width max_seqlen_k.
_WINDOWS_FIRST_NAMES = {**_FLAT_NAMES, "max_pools": "max_seqlen_k", "out": "max_seqlen_k"}


def _renamed(
    error: ValueError | TypeError,
    names: dict[str, str] = _DEEP_GEMM_NAMES,
    terms: tuple[str, str] = ("", ""),
    notes: dict[str, str] | None = None,
) -> ValueError | TypeError:
    """The scorer's refusal with the argument named as DeepGEMM's caller passed it. ``terms``: a word of the
    scorer's ("request", "token") and what it is in the caller's terms, said where the refusal uses the word;
    ``notes``: what the scorer's argument is in this call, by its name. The scorer's hint on which length its
    cache_lengths is goes: these calls' lengths are DeepGEMM's, which count the step."""
    message = str(error).replace(LENGTHS_HINT, "")
    name, _, said = message.removeprefix("Invalid ").partition(":")
    notes = notes or {}
    if not message.startswith("Invalid ") or (name not in names and name not in notes):
        return error
    word, meaning = terms
    term = meaning if word and word in said else ""
    return type(error)(f"Invalid {names.get(name, name)}:{said} (kpool_index_logits_fp8's {name}"
                       f"{notes.get(name, '')}{term})")  # fmt: skip


def _within(name: str, values: torch.Tensor, low: int, high: int | None, rule: str) -> None:
    """``validate=True``'s check of a length argument as the caller passed it, ``low <= values <= high`` (one
    host read)."""
    host = values.detach().cpu().numpy()
    bad = (host < low) | (host > high) if high is not None else host < low
    wanted = f"values in [{low}, {high}]" if high is not None else f"values of at least {low}"
    check_nowhere(bad, name, f"{wanted} ({rule})", lambda *at: f"{int(host[at])} at {at if len(at) > 1 else at[0]}")


def _tensor(name: str, value: Any) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"Invalid {name}: expected a torch.Tensor, got {type_name(value)}")
    return value


def _query(q: Any, ndim: int, shape: str) -> torch.Tensor:
    """q as a tensor or the newer releases' ``(values, None)``, of ``ndim`` dims."""
    if isinstance(q, (tuple, list)):
        if len(q) != 2:
            raise fail("q", "a tensor or (values, None)", f"a {type(q).__name__} of {len(q)} items")
        if q[1] is not None:
            wanted = "a tensor or (values, None) (per-token q scales, DeepGEMM's FP4 path, are not taken)"
            raise fail("q", wanted, f"({type_name(q[0])}, {type_name(q[1])})")
        q = q[0]
    _tensor("q", q)
    if q.ndim != ndim:
        raise fail("q", f"a {ndim}-D tensor {shape}", f"shape {tuple(q.shape)}")
    return q


def _positive(name: str, value: Any) -> int:
    check_integer(name, value, 1)  # a TypeError for a non-integer, as the package's own integer options
    return int(value)


def _beside(name: str, tensor: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``tensor`` on q's device (what this call reads itself; the scorer checks what it is given)."""
    if tensor.device != q.device:
        raise fail(name, f"a tensor on {q.device} like q", f"one on {tensor.device}")
    return tensor


def _dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _context_lens(context_lens: Any, batch: int, next_n: int) -> torch.Tensor:
    _tensor("context_lens", context_lens)
    if context_lens.dtype not in (torch.int32, torch.int64):
        raise dtype_fail("context_lens", "dtype int32 (or int64)", _dtype_name(context_lens))
    if tuple(context_lens.shape) not in ((batch,), (batch, next_n)):
        wanted = f"shape [{batch}] or [{batch}, {next_n}] (q's batch and next_n)"
        raise fail("context_lens", wanted, f"shape {tuple(context_lens.shape)}")
    return context_lens


def _weights(weights: Any) -> Any:
    """float32 weights as given; bfloat16 or float16 ones widened to float32 (exact: one small copy). Anything
    else goes to the scorer, whose refusal names it."""
    if isinstance(weights, torch.Tensor) and weights.dtype in (torch.bfloat16, torch.float16):
        return weights.float()
    return weights


def _indices(indices: Any, rows: int, device: torch.device, next_n: int | None) -> None:
    """DeepGEMM's ``indices`` (newer releases: a request id per q row, which its scheduler uses to let a
    request's rows share key loads): None, or int32 ``[rows]``, and only at ``next_n`` 1, as DeepGEMM takes it
    (None: the metadata call's 1-D lengths, which do not say). Checked, then not read: each row's logits here
    come from its own ``context_lens`` and ``block_table`` row."""
    if indices is None:
        return
    if next_n not in (1, None):
        raise fail("indices", "None at next_n above 1 (DeepGEMM takes a request id a row at next_n 1 only)",
                   f"a {type_name(indices)} at next_n {next_n}")  # fmt: skip
    _tensor("indices", indices)
    if indices.dtype not in (torch.int32, torch.int64):
        raise dtype_fail("indices", "dtype int32 (or int64)", _dtype_name(indices))
    if tuple(indices.shape) != (rows,):
        raise fail("indices", f"None or shape [{rows}] (a request id a q row)", f"shape {tuple(indices.shape)}")
    if indices.device != device:
        raise fail("indices", f"a tensor on {device} like the lengths", f"one on {indices.device}")


def get_paged_mqa_logits_metadata(
    context_lens: torch.Tensor, block_kv: int, num_sms: int, indices: Any = None
) -> torch.Tensor:
    """DeepGEMM's schedule metadata in DeepGEMM's shape: int32 ``[num_sms + 1, 2]`` on ``context_lens``'
    device, zeros. :func:`fp8_paged_mqa_logits` here plans its launch from shapes and ignores it, and
    ``indices`` (newer releases', a request id a q row) with it."""
    _tensor("context_lens", context_lens)
    if context_lens.dtype not in (torch.int32, torch.int64):
        raise dtype_fail("context_lens", "dtype int32 (or int64)", _dtype_name(context_lens))
    if context_lens.ndim not in (1, 2):
        raise fail("context_lens", "shape [B] or [B, next_n]", f"shape {tuple(context_lens.shape)}")
    _positive("block_kv", block_kv)
    _positive("num_sms", num_sms)
    next_n = context_lens.shape[1] if context_lens.ndim == 2 else None
    _indices(indices, context_lens.shape[0], context_lens.device, next_n)
    return torch.zeros((num_sms + 1, 2), dtype=torch.int32, device=context_lens.device)


def fp8_paged_mqa_logits(
    q: Any,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    schedule_meta: Any,
    max_context_len: int,
    clean_logits: bool = False,
    indices: Any = None,
    *,
    validate: bool = False,
) -> torch.Tensor:
    """DeepGEMM's ``fp8_paged_mqa_logits``: float32 ``[B * next_n, max_context_len]`` (the module's formula).

    Parameters
    ----------
    q
        float8_e4m3fn (or uint8 e4m3fn bytes) ``[B, next_n, H, D]``, H 1 to 128, D 64, 128 or 256; or the newer
        releases' ``(values, None)`` (per-token scales, DeepGEMM's FP4 path, are refused).
    kv_cache
        uint8 ``[num_blocks, block_size, 1, D + 4]`` (or this package's 3-D form): each page's values, then
        its float32 scales.
    weights
        float32 ``[B * next_n, H]`` (bfloat16 or float16 are widened to float32).
    context_lens
        int32 ``[B]`` or ``[B, next_n]``: the keys each request (or token) sees, the step's tokens included.
        A 1-D length below next_n (DeepGEMM's callers count the step, so never one) scores ``-inf`` for all of
        its request's tokens, where the formula would let its last tokens see keys: pass such lengths in the
        2-D form. A negative length scores ``-inf``. ``validate=True`` refuses both, and a length of 0 too (an
        engine's padding row, ``-inf`` without it): validate padded batches without their padding.
    block_table
        int32 ``[B, max_blocks]``: request b's entry n is at page ``block_table[b, n // block_size]``.
    schedule_meta
        Ignored (:func:`get_paged_mqa_logits_metadata`).
    max_context_len
        Columns of the result.
    clean_logits
        Taken for DeepGEMM's signature (its default, False, as DeepGEMM's): entries past a token's window are
        ``-inf`` either way (DeepGEMM leaves them unspecified with False, and newer releases refuse True).
    indices
        None, or newer releases' int32 ``[B]`` at next_n 1, a request id a q row (DeepGEMM's scheduler lets a
        request's rows share key loads); checked, not read.
    validate
        Read the lengths and the table back and check them (a host sync; not in a CUDA graph).
    """
    q = _query(q, 4, "[B, next_n, H, D]")
    batch, next_n, heads, head_dim = q.shape
    lengths = _context_lens(context_lens, batch, next_n)
    _indices(indices, batch, lengths.device, next_n)
    _tensor("block_table", block_table)
    if block_table.ndim != 2 or block_table.shape[0] != batch:
        raise fail("block_table", f"shape [{batch}, max_blocks] (q's batch)", f"shape {tuple(block_table.shape)}")
    # In the scorer's range (pool ids are int32) before the result is allocated: past it, 8 GiB a token or more.
    check_integer("max_context_len", max_context_len, 1, MAX_POOLS)
    check_bool("clean_logits", clean_logits)
    check_bool("validate", validate)
    device = q.device
    tokens = batch * next_n
    if validate:  # as passed: the derived cache_lengths would name values the caller never gave
        rule = "the step's tokens included" if lengths.ndim == 1 else "a token sees at least its own key"
        low = next_n if lengths.ndim == 1 else 1
        # The scorer's cache_lengths (these less `low`) stay below MAX_CACHE_LENGTH; int32 lengths always do.
        high = MAX_CACHE_LENGTH - 1 + low if lengths.dtype == torch.int64 else None
        _within("context_lens", lengths, low, high, rule)
    # The lengths keep their dtype (int64 ones past 2^31 stay whole; the scorer takes both). A negative length
    # (garbage: validate=True refuses it) is raised to -1 first, so the subtraction cannot wrap a dtype's least
    # value round to a large length: its tokens still see nothing.
    if lengths.ndim == 1:  # request b's next_n tokens at positions context_lens[b] - next_n + j
        offsets = (
            torch.arange(0, tokens + 1, next_n, dtype=torch.int32, device=device)
            if next_n
            else torch.zeros(batch + 1, dtype=torch.int32, device=device)
        )
        cached = lengths.clamp_min(-1) - next_n
        table = block_table
        terms = ("token", "; its token t is q[t // next_n, t % next_n]")
    else:  # each token its own request, at position context_lens[b, j] - 1, on its request's pages
        offsets = torch.arange(tokens + 1, dtype=torch.int32, device=device)
        cached = lengths.reshape(-1).clamp_min(0) - 1
        table = block_table.repeat_interleave(next_n, dim=0)
        terms = ("request", "; its request r is token (r // next_n, r % next_n) of context_lens [B, next_n]")
    out = torch.empty((tokens, max_context_len), dtype=torch.float32, device=device)
    queries = q.reshape(tokens, heads, head_dim)
    try:
        kt.kpool_index_logits_fp8(
            queries, _weights(weights), kv_cache, table, offsets, cached, kpool=1, max_pools=max_context_len,
            out=out, validate=validate,
        )  # fmt: skip
    except (ValueError, TypeError) as error:
        raise _renamed(error, terms=terms, notes=_PAGED_NOTES) from None
    return out


def _window(name: str, value: Any, tokens: int) -> torch.Tensor:
    _tensor(name, value)
    if value.dtype not in (torch.int32, torch.int64):
        raise dtype_fail(name, "dtype int32 (or int64)", _dtype_name(value))
    if tuple(value.shape) != (tokens,):
        raise fail(name, f"shape [{tokens}] (q's tokens)", f"shape {tuple(value.shape)}")
    return value


def fp8_mqa_logits(
    q: Any,
    kv: Any,
    weights: torch.Tensor,
    cu_seq_len_k_start: torch.Tensor,
    cu_seq_len_k_end: torch.Tensor,
    clean_logits: bool = True,
    max_seqlen_k: int = 0,
    *,
    validate: bool = False,
) -> torch.Tensor:
    """DeepGEMM's ``fp8_mqa_logits``: float32 ``[S, N]`` (the module's formula), ``-inf`` outside each token's
    window ``[ks, ke)``; with ``max_seqlen_k`` M > 0, ``[S, M]`` whose column c is key ``ks + c``.

    Parameters
    ----------
    q
        float8_e4m3fn (or uint8 e4m3fn bytes) ``[S, H, D]``, H 1 to 128, D 64, 128 or 256; or ``(values, None)``.
    kv
        ``(values, scales)``: float8_e4m3fn (or uint8) ``[N, D]`` and float32 ``[N]`` (or ``[N, 1]``). In an
        engine's prefill, the chunk's requests' keys gathered into one array.
    weights
        float32 ``[S, H]`` (bfloat16 or float16 are widened to float32).
    cu_seq_len_k_start, cu_seq_len_k_end
        int32 ``[S]``: token t's keys are ``[ks[t], ke[t])`` (vLLM: ks = its request's offset in ``kv``,
        ke = ks + position + 1).
    clean_logits
        Taken for DeepGEMM's signature: outside the windows is ``-inf`` either way (DeepGEMM leaves it
        unspecified with False, and refuses True with ``max_seqlen_k``; this call takes both).
    max_seqlen_k
        0 (DeepGEMM's default): the result is ``[S, N]``, column n key n. M > 0 (newer releases): ``[S, M]``,
        token t's column c key ``ks[t] + c`` for c below its window's width, ``-inf`` past it (DeepGEMM leaves
        those unspecified). A window wider than M keeps its first M keys (``validate=True`` refuses it).
    validate
        Read the windows back and check them (a host sync; not in a CUDA graph).
    """
    q = _query(q, 3, "[S, H, D]")
    tokens, _, head_dim = q.shape
    if not isinstance(kv, (tuple, list)):
        raise dtype_fail("kv", "a pair (values [N, D], scales [N])", type_name(kv))
    if len(kv) != 2:
        raise fail("kv", "a pair (values [N, D], scales [N])", f"a {type(kv).__name__} of {len(kv)} items")
    values, scales = _beside("kv[0]", _tensor("kv[0]", kv[0]), q), _beside("kv[1]", _tensor("kv[1]", kv[1]), q)
    if values.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise dtype_fail("kv[0]", "dtype float8_e4m3fn (or uint8 e4m3fn bytes)", _dtype_name(values))
    if values.ndim != 2 or values.shape[1] != head_dim:
        raise fail("kv[0]", f"shape [N, {head_dim}] (q's head_dim)", f"shape {tuple(values.shape)}")
    keys = values.shape[0]
    if keys > MAX_POOLS:  # before anything is allocated: a key is a pool of the scorer, whose ids are int32
        raise fail(
            "kv[0]", f"at most {MAX_POOLS} keys (N; the scorer's pool ids are int32)", f"shape {tuple(values.shape)}"
        )
    if scales.dtype != torch.float32:
        raise dtype_fail("kv[1]", "dtype float32", _dtype_name(scales))
    if tuple(scales.shape) not in ((keys,), (keys, 1)):
        raise fail("kv[1]", f"shape [{keys}] (a scale a key)", f"shape {tuple(scales.shape)}")
    starts = _beside("cu_seq_len_k_start", _window("cu_seq_len_k_start", cu_seq_len_k_start, tokens), q)
    ends = _beside("cu_seq_len_k_end", _window("cu_seq_len_k_end", cu_seq_len_k_end, tokens), q)
    check_bool("clean_logits", clean_logits)
    check_integer("max_seqlen_k", max_seqlen_k, 0, MAX_POOLS)  # the result's columns are the scorer's pools
    check_bool("validate", validate)
    if validate:  # the windows as passed; the scorer's own checks would name what this call derives
        _within("cu_seq_len_k_end", ends, 0, keys, "window ends within kv's keys")
        if max_seqlen_k:
            host = _width(starts, ends).cpu().numpy()
            check_nowhere(
                host > max_seqlen_k, "max_seqlen_k", "at least every window's width (ke - ks)",
                lambda t: f"{max_seqlen_k}, below token {t}'s width {int(host[t])}",
            )  # fmt: skip
    if max_seqlen_k:
        return _windows_first(q, values, scales, _weights(weights), starts, ends, int(max_seqlen_k))
    device = q.device
    out = torch.empty((tokens, keys), dtype=torch.float32, device=device)
    # The keys as one page of N entries: the values' bytes, then the scales' (kernels/kpool_fp8.cuh's layout).
    # No keys: a page of one entry no token sees, so the scorer still checks q and the weights.
    page = torch.zeros(max(keys, 1) * (head_dim + 4), dtype=torch.uint8, device=device)
    page[: keys * head_dim].copy_(values.reshape(-1).view(torch.uint8))
    page[max(keys, 1) * head_dim :][: keys * 4].copy_(scales.reshape(-1).contiguous().view(torch.uint8))
    table = torch.zeros((tokens, 1), dtype=torch.int32, device=device)
    offsets = torch.arange(tokens + 1, dtype=torch.int32, device=device)
    # A negative end is raised to 0 first, so int64's least value cannot wrap round (helper-55).
    cached = ends.clamp_min(0) - 1 if keys else torch.full_like(ends, -1)
    try:
        kt.kpool_index_logits_fp8(
            q, _weights(weights), page.view(1, max(keys, 1), head_dim + 4), table, offsets, cached, kpool=1,
            max_pools=keys, out=out, validate=False,
        )  # fmt: skip  # the windows checked above; the table and offsets are this call's own
    except (ValueError, TypeError) as error:
        raise _renamed(error, _FLAT_NAMES, notes=_FLAT_NOTES) from None
    below = torch.arange(keys, device=device)[None, :] < starts[:, None]
    return out.masked_fill_(below, float("-inf"))


# Windows' ends raised or lowered to +-2^62 before a subtraction: int64's extremes cannot wrap it round.
_FAR = 2**62


def _width(starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Each window's width ``ke - ks`` in int64, exact wherever it is below 2^62 (helper-63: int64's least end
    wrapped round to its largest width)."""
    return ends.to(torch.int64).clamp(-_FAR, _FAR) - starts.to(torch.int64).clamp(-_FAR, _FAR)


# A page of one entry padded to a multiple of 16 bytes (144 for D 128), so the scorer's 16-byte loads take the keys.
_ENTRY_ALIGN = 16


def _windows_first(
    q: torch.Tensor,
    values: torch.Tensor,
    scales: torch.Tensor,
    weights: Any,
    starts: torch.Tensor,
    ends: torch.Tensor,
    width: int,
) -> torch.Tensor:
    """``fp8_mqa_logits`` with ``max_seqlen_k``: each key its own page of one entry (a copy of N * (D + 4)
    bytes, each page padded to a multiple of 16), token t its own request whose entry c is at page
    ``ks[t] + c`` (a table of S * M int32, made in place where keys + M < 2^31, else from an int64 one);
    entries past the window are past the request's length, pages outside the keys (a window reaching below 0
    or past N) outside the cache: both ``-inf``. No keys: a zero page nobody sees, so the scorer still checks
    q and the weights."""
    tokens, _, head_dim = q.shape
    keys, device = values.shape[0], q.device
    out = torch.empty((tokens, width), dtype=torch.float32, device=device)
    entry = head_dim + 4
    stride = -(-entry // _ENTRY_ALIGN) * _ENTRY_ALIGN
    pages = torch.zeros((max(keys, 1), stride), dtype=torch.uint8, device=device)
    pages[:keys, :head_dim].copy_(values.view(torch.uint8))
    pages[:keys, head_dim:entry].copy_(scales.reshape(keys).contiguous().view(torch.uint8).view(keys, 4))
    # Token t's first page, bounded so the table's int32 sums neither wrap nor leave [-1 - width, keys]: a
    # window starting below -width sees no key, as one starting at -width - 1 does.
    first = starts.to(torch.int64).clamp(-width - 1, keys)
    if keys + width <= MAX_POOLS:  # the sums fit int32: the table is the only [S, M] tensor made
        table = first.to(torch.int32)[:, None] + torch.arange(width, dtype=torch.int32, device=device)[None, :]
    else:
        table = (first[:, None] + torch.arange(width, dtype=torch.int64, device=device)[None, :]).clamp_(max=keys)
        table = table.to(torch.int32)
    table.clamp_(-1, keys)
    seen = _width(starts, ends).clamp_(0, width) if keys else torch.zeros_like(first)
    offsets = torch.arange(tokens + 1, dtype=torch.int32, device=device)
    try:
        kt.kpool_index_logits_fp8(
            q, weights, pages[:, :entry].unsqueeze(1), table, offsets, (seen - 1).to(torch.int32), kpool=1,
            max_pools=width, out=out, validate=False,
        )  # fmt: skip  # the windows checked by the caller; the table and offsets are this call's own
    except (ValueError, TypeError) as error:
        raise _renamed(error, _WINDOWS_FIRST_NAMES, notes=_FLAT_NOTES) from None
    return out


def _check_logits_dtype(logits_dtype: Any) -> None:
    """float32 (the scorer's) or bfloat16 (rounded once from it, a copy), before any work."""
    if logits_dtype not in (torch.float32, torch.bfloat16):
        raise dtype_fail("logits_dtype", "torch.float32 or torch.bfloat16", str(logits_dtype))


def fp8_fp4_mqa_logits(
    q: Any,
    kv: Any,
    weights: torch.Tensor,
    cu_seq_len_k_start: torch.Tensor,
    cu_seq_len_k_end: torch.Tensor,
    clean_logits: bool = True,
    max_seqlen_k: int = 0,
    logits_dtype: Any = torch.float32,
    schedule_meta: Any = None,
    *,
    validate: bool = False,
) -> torch.Tensor:
    """Newer DeepGEMM's name for :func:`fp8_mqa_logits` (newer vLLM calls it): q ``(values, None)`` (FP4's
    scales are refused), the result in ``logits_dtype`` (float32, or bfloat16 rounded once from it), and
    ``schedule_meta`` ignored as :func:`get_paged_mqa_logits_metadata`'s is."""
    _check_logits_dtype(logits_dtype)
    out = fp8_mqa_logits(
        q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k, validate=validate
    )
    return out.to(logits_dtype)


def fp8_fp4_paged_mqa_logits(
    q: Any,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    schedule_meta: Any,
    max_context_len: int,
    clean_logits: bool = False,
    logits_dtype: Any = torch.float32,
    indices: Any = None,
    *,
    validate: bool = False,
) -> torch.Tensor:
    """Newer DeepGEMM's name for :func:`fp8_paged_mqa_logits` (newer vLLM calls it): q ``(values, None)`` or a
    tensor (FP4's scales are refused), the result in ``logits_dtype`` (float32, or bfloat16 rounded once)."""
    _check_logits_dtype(logits_dtype)
    out = fp8_paged_mqa_logits(
        q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits, indices,
        validate=validate,
    )  # fmt: skip
    return out.to(logits_dtype)
