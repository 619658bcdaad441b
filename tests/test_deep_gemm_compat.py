"""``kpool_cupy.compat.deep_gemm``: DeepGEMM's paged indexer calls against DeepGEMM's published definition.

The model below is written from DeepGEMM's documented semantics (the
module's formula): token j of request b sees the request's first
``context_lens[b] - next_n + j + 1`` cache entries (or ``context_lens[b, j]``),
each a key of e4m3fn values times its page's float32 scale; the logit is
the weighted sum over heads of relu(q . k); every other column up to
``max_context_len`` is ``-inf``. Shapes: DeepGEMM's test shapes scaled to the
CPU (64 heads of 128, 64-entry pages, next_n 1 and 2).
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kpool_cupy.compat import deep_gemm  # noqa: E402  (after the skip)
from kpool_cupy.tools.index_accuracy import index_logits_agree, index_logits_bound  # noqa: E402

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
HEADS, HEAD_DIM, BLOCK = 64, 128, 64


def _paged(rng, context: list[int], spare: int = 2):
    """A DeepGEMM cache ``[num_blocks, BLOCK, 1, D + 4]`` with each request's pages shuffled, and its table."""
    blocks = [-(-n // BLOCK) for n in context]
    pages = sum(blocks) + spare
    cache = np.zeros((pages, BLOCK * (HEAD_DIM + 4)), np.uint8)
    values = rng.integers(0, 256, (pages, BLOCK * HEAD_DIM), dtype=np.uint8)
    cache[:, : BLOCK * HEAD_DIM] = np.where((values & 0x7F) == 0x7F, values ^ 1, values)  # no NaN bytes
    cache[:, BLOCK * HEAD_DIM :] = np.exp2(rng.integers(-6, 3, (pages, BLOCK))).astype(np.float32).view(np.uint8)
    order = rng.permutation(pages)
    table = np.full((len(context), max(blocks) + 1), -1, np.int32)
    used = 0
    for b, n in enumerate(blocks):
        table[b, :n] = order[used : used + n]
        used += n
    return cache.reshape(pages, BLOCK, 1, HEAD_DIM + 4), table


def _model(q, cache, weights, windows, table, max_context_len):
    """DeepGEMM's definition in float64: ``windows[t]`` keys for token t of request ``t // next_n``."""
    batch, next_n = q.shape[:2]
    pages = cache.reshape(cache.shape[0], -1)
    values = pages[:, : BLOCK * HEAD_DIM].view(E4M3).astype(np.float64).reshape(-1, BLOCK, HEAD_DIM)
    scales = pages[:, BLOCK * HEAD_DIM :].copy().view(np.float32).astype(np.float64)
    out = np.full((batch * next_n, max_context_len), -np.inf)
    for t in range(batch * next_n):
        b = t // next_n
        n = np.arange(windows[t])
        page, entry = table[b, n // BLOCK], n % BLOCK
        keys = values[page, entry] * scales[page, entry][:, None]  # [n, D]
        dots = q[b, t % next_n].view(E4M3).astype(np.float64) @ keys.T  # [H, n]
        out[t, : windows[t]] = (weights[t][:, None] * np.maximum(dots, 0)).sum(axis=0)
    return out


def _call(next_n: int, two_d: bool, seed: int):
    rng = np.random.default_rng(seed)
    context = [130, 67, 200][: 3 if next_n == 1 else 2]
    batch, max_context_len = len(context), 256
    cache, table = _paged(rng, context)
    q = rng.integers(0, 256, (batch, next_n, HEADS, HEAD_DIM), dtype=np.uint8)
    q = np.where((q & 0x7F) == 0x7F, q ^ 1, q)
    weights = rng.standard_normal((batch * next_n, HEADS)).astype(np.float32)
    lens = np.array(context, np.int32)
    windows = (lens[:, None] - next_n + np.arange(next_n) + 1).reshape(-1)
    if two_d:  # newer releases: one length a token (here each token sees one key less than the 1-D rule)
        windows = windows - 1
        lens = windows.reshape(batch, next_n).astype(np.int32)
    return q, cache, weights, lens, table, max_context_len, windows


CUDA = pytest.param(
    "cuda",
    marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a CUDA device")],
)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("next_n", [1, 2])
@pytest.mark.parametrize("two_d", [False, True], ids=["context_lens-1d", "context_lens-2d"])
@pytest.mark.parametrize("tuple_q", [False, True], ids=["q-tensor", "q-tuple"])
def test_paged_logits_match_deep_gemms_definition(device, next_n, two_d, tuple_q):
    q, cache, weights, lens, table, max_context_len, windows = _call(next_n, two_d, seed=next_n + 2 * two_d)
    want = _model(q, cache, weights, windows, table, max_context_len)
    tq = torch.from_numpy(q).view(torch.float8_e4m3fn).to(device)  # as an engine holds it
    lens_t = torch.from_numpy(lens).to(device)
    metadata = deep_gemm.get_paged_mqa_logits_metadata(lens_t, BLOCK, 132)
    assert metadata.shape == (133, 2) and metadata.dtype == torch.int32 and metadata.device == tq.device
    tensors = (torch.from_numpy(a).to(device) for a in (cache, weights, table))
    tc, tw, tt = tensors
    args = ((tq, None) if tuple_q else tq, tc, tw, lens_t)
    got = deep_gemm.fp8_paged_mqa_logits(*args, tt, metadata, max_context_len).cpu().numpy()
    assert got.shape == (q.shape[0] * next_n, max_context_len) and got.dtype == np.float32
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))  # DeepGEMM's mask, exactly
    # The package's bound on the same call in its own form (kpool 1: an entry is a pool; each token its own
    # request at position window - 1).
    tokens = len(windows)
    flat = (q.reshape(tokens, HEADS, HEAD_DIM), weights, cache[:, :, 0], np.repeat(table, next_n, axis=0))
    bits = _gpu_bits() if device == "cuda" else 24  # the device's D-sum width on the GPU, float32 on the CPU
    bound = index_logits_bound(
        *flat, np.arange(tokens + 1), windows - 1, kpool=1, max_pools=max_context_len, accumulation_bits=bits
    )
    verdict = index_logits_agree(got, want, bound)
    assert verdict["ok"], verdict


def _gpu_bits() -> int:
    from kpool_cupy.tools.op_checks import _device_accumulation_bits

    return _device_accumulation_bits()


def test_the_metadata_and_the_logits_call_refuse_bad_arguments_by_name():
    q, cache, weights, lens, table, max_context_len, _ = _call(2, False, seed=9)
    tq, tc, tw, tl, tt = (torch.from_numpy(a) for a in (q, cache, weights, lens, table))
    call = deep_gemm.fp8_paged_mqa_logits
    with pytest.raises(ValueError, match=r"^Invalid q: expected a tensor or \(values, None\)"):
        call((tq, torch.ones(4)), tc, tw, tl, tt, None, max_context_len)
    with pytest.raises(ValueError, match=r"^Invalid q: expected a 4-D tensor \[B, next_n, H, D\]"):
        call(tq[0], tc, tw, tl, tt, None, max_context_len)
    with pytest.raises(ValueError, match=r"^Invalid context_lens: expected shape \[2\] or \[2, 2\]"):
        call(tq, tc, tw, tl[:1], tt, None, max_context_len)
    with pytest.raises(TypeError, match=r"^Invalid context_lens: expected dtype int32"):
        call(tq, tc, tw, tl.float(), tt, None, max_context_len)
    with pytest.raises(ValueError, match=r"^Invalid block_table: expected shape \[2, max_blocks\]"):
        call(tq, tc, tw, tl, tt[:1], None, max_context_len)
    with pytest.raises(ValueError, match=r"^Invalid max_context_len: expected an integer in \[1, 2147483647\], got 0$"):
        call(tq, tc, tw, tl, tt, None, 0)
    # Past int32 pool ids: refused before the result (8 GiB a token here) is allocated (the hostile review).
    with pytest.raises(
        ValueError, match=r"^Invalid max_context_len: expected an integer in \[1, 2147483647\], got 2147"
    ):
        call(tq, tc, tw, tl, tt, None, 2**31)
    with pytest.raises(TypeError, match=r"^Invalid max_context_len: expected an integer, got float$"):  # a type
        call(tq, tc, tw, tl, tt, None, 256.0)
    with pytest.raises(TypeError, match=r"^Invalid weights: expected dtype float32"):  # the scorer's own check
        call(tq, tc, tw.double(), tl, tt, None, max_context_len)
    with pytest.raises(ValueError, match=r"^Invalid num_sms: expected an integer >= 1"):
        deep_gemm.get_paged_mqa_logits_metadata(tl, BLOCK, 0)


def test_lengths_that_leave_the_table_are_refused_with_validate_and_score_minus_inf_without():
    # Refusals name DeepGEMM's arguments (the scorer's names in parentheses), never one the caller did not pass.
    q, cache, weights, lens, table, _, windows = _call(1, False, seed=4)
    args = [torch.from_numpy(a) for a in (q, cache, weights, lens + 64, table)]  # one page more than written
    args[0] = args[0].view(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"^Invalid max_context_len: expected at least the 264 pools token 2 sees"):
        deep_gemm.fp8_paged_mqa_logits(*args, None, 256, validate=True)
    with pytest.raises(ValueError, match=r"^Invalid block_table: .*\(kpool_index_logits_fp8's cache_block_table\)$"):
        deep_gemm.fp8_paged_mqa_logits(*args, None, 320, validate=True)
    max_context_len = 320
    got = deep_gemm.fp8_paged_mqa_logits(*args, None, max_context_len).numpy()
    for t, window in enumerate(windows):  # the entries in the missing page score -inf, nothing else changes
        assert np.isneginf(got[t, -(-window // BLOCK) * BLOCK :]).all()


def _flat_call(seed: int):
    """vLLM's prefill shape: two requests' keys gathered into one array (96 and 64 keys), the last 16 and 32
    tokens of each, token at position p of request r seeing keys [offset_r, offset_r + p + 1)."""
    rng = np.random.default_rng(seed)
    keys = 160
    values = rng.integers(0, 256, (keys, HEAD_DIM), dtype=np.uint8)
    values = np.where((values & 0x7F) == 0x7F, values ^ 1, values)
    scales = np.exp2(rng.integers(-6, 3, keys)).astype(np.float32)
    starts = np.concatenate([np.zeros(16), np.full(32, 96)]).astype(np.int32)
    ends = np.concatenate([np.arange(80, 96) + 1, 96 + np.arange(32, 64) + 1]).astype(np.int32)
    q = rng.integers(0, 256, (48, HEADS, HEAD_DIM), dtype=np.uint8)
    q = np.where((q & 0x7F) == 0x7F, q ^ 1, q)
    weights = rng.standard_normal((48, HEADS)).astype(np.float32)
    return q, values, scales, weights, starts, ends


def _flat_model(q, values, scales, weights, starts, ends):
    keys = values.view(E4M3).astype(np.float64) * scales.astype(np.float64)[:, None]
    dots = np.einsum("thd,nd->thn", q.view(E4M3).astype(np.float64), keys)
    logits = (weights.astype(np.float64)[:, :, None] * np.maximum(dots, 0)).sum(axis=1)
    n = np.arange(values.shape[0])[None, :]
    return np.where((n >= starts[:, None]) & (n < ends[:, None]), logits, -np.inf)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("tuple_q", [False, True], ids=["q-tensor", "q-tuple"])
def test_flat_logits_match_deep_gemms_definition(device, tuple_q):
    q, values, scales, weights, starts, ends = _flat_call(5)
    want = _flat_model(q, values, scales, weights, starts, ends)
    tq = torch.from_numpy(q).view(torch.float8_e4m3fn).to(device)
    kv = (torch.from_numpy(values).view(torch.float8_e4m3fn).to(device), torch.from_numpy(scales).to(device))
    ks, ke = torch.from_numpy(starts).to(device), torch.from_numpy(ends).to(device)
    tw = torch.from_numpy(weights).to(device)
    got = deep_gemm.fp8_mqa_logits((tq, None) if tuple_q else tq, kv, tw, ks, ke).cpu().numpy()
    assert got.shape == (48, 160) and got.dtype == np.float32
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))  # the windows, exactly
    # The package's bound: the keys as one page of 160 entries, each token its own request seeing [0, ke).
    page = np.concatenate([values.reshape(-1), scales.view(np.uint8)]).reshape(1, 160, HEAD_DIM + 4)
    bits = _gpu_bits() if device == "cuda" else 24
    bound = index_logits_bound(q, weights, page, np.zeros((48, 1), np.int32), np.arange(49), ends - 1, kpool=1,
                               max_pools=160, accumulation_bits=bits)  # fmt: skip
    verdict = index_logits_agree(got, want, bound)  # compared where both are finite: inside the windows
    assert verdict["ok"], verdict


def test_the_flat_call_refuses_bad_arguments_by_deep_gemms_names():
    q, values, scales, weights, starts, ends = _flat_call(6)
    tq, tv, ts, tw, ks, ke = (torch.from_numpy(a) for a in (q, values, scales, weights, starts, ends))
    call = deep_gemm.fp8_mqa_logits
    with pytest.raises(TypeError, match=r"^Invalid kv: expected a pair \(values \[N, D\], scales \[N\]\)"):
        call(tq, tv, tw, ks, ke)
    with pytest.raises(ValueError, match=r"^Invalid kv\[0\]: expected shape \[N, 128\] \(q's head_dim\)"):
        call(tq, (tv[:, :64], ts), tw, ks, ke)
    with pytest.raises(ValueError, match=r"^Invalid kv\[1\]: expected shape \[160\] \(a scale a key\)"):
        call(tq, (tv, ts[:-1]), tw, ks, ke)
    # Dtypes are TypeErrors (docs/validation.md), as the scorer's own are: a hostile round found ValueErrors.
    with pytest.raises(TypeError, match=r"^Invalid kv\[0\]: expected dtype float8_e4m3fn \(or uint8"):
        call(tq, (tv.float(), ts), tw, ks, ke)
    with pytest.raises(TypeError, match=r"^Invalid kv\[1\]: expected dtype float32, got float16$"):
        call(tq, (tv, ts.half()), tw, ks, ke)
    # More keys than int32 pool ids (a stride-0 view: no memory): refused before the result and the cache
    # page (146 GiB here) are allocated (the hostile review).
    many = tv[:1].expand(2**31, tv.shape[1])
    with pytest.raises(
        ValueError, match=r"^Invalid kv\[0\]: expected at most 2147483647 keys .*, got shape \(2147483648, 128\)$"
    ):
        call(tq, (many, ts), tw, ks, ke)
    # A tensor on another device than q is named (torch's meta device stands in for a GPU here): the hostile
    # round found torch's own errors from the copy and the mask instead.
    elsewhere = {
        "cu_seq_len_k_start": lambda: call(tq, (tv, ts), tw, ks.to("meta"), ke),
        "kv[0]": lambda: call(tq, (tv.to("meta"), ts), tw, ks, ke),
        "kv[1]": lambda: call(tq, (tv, ts.to("meta")), tw, ks, ke),
    }
    for name, refused in elsewhere.items():
        wanted = rf"^Invalid {re.escape(name)}: expected a tensor on cpu like q, got one on meta$"
        with pytest.raises(ValueError, match=wanted):
            refused()
    with pytest.raises(ValueError, match=r"^Invalid cu_seq_len_k_start: expected shape \[48\]"):
        call(tq, (tv, ts), tw, ks[:-1], ke)
    with pytest.raises(
        ValueError, match=r"^Invalid cu_seq_len_k_end: expected values in \[0, 160\] .*, got 161 at 38$"
    ):
        call(tq, (tv, ts), tw, ks, ke + 10, validate=True)  # a window past the keys, as passed
    got = call(tq, (tv, ts), tw, ks, ke + 10).numpy()  # without validation: cut at the keys, nothing read past
    assert np.isfinite(got[47, 96:]).all()


def test_adapter_refusals_name_what_the_caller_passed_and_no_call_wraps_or_crashes():
    # The hostile review's findings: lengths checked as passed (it said "got -1" of a derived value), the
    # scorer's hint about cache_lengths gone, 2-D requests said to be tokens, int64 lengths past 2^32 kept
    # whole, and zero tokens an empty result.
    q, cache, weights, lens, table, max_context_len, _ = _call(2, False, seed=7)
    tq = torch.from_numpy(q).view(torch.float8_e4m3fn)
    tc, tw, tt = (torch.from_numpy(a) for a in (cache, weights, table))
    short = torch.tensor([9, 1], dtype=torch.int32)  # request 1 shorter than its step of 2 tokens
    with pytest.raises(ValueError, match=r"^Invalid context_lens: expected values of at least 2 .*, got 1 at 1$"):
        deep_gemm.fp8_paged_mqa_logits(tq, tc, tw, short, tt, None, max_context_len, validate=True)
    with pytest.raises(ValueError) as error:  # one page more than written: the table's refusal, in DeepGEMM's terms
        deep_gemm.fp8_paged_mqa_logits(tq, tc, tw, torch.from_numpy(lens + 64), tt, None, 320, validate=True)
    assert str(error.value).startswith("Invalid block_table: ") and "cache_lengths counts" not in str(error.value)
    two_d = torch.from_numpy(np.repeat(lens[:, None], 2, axis=1) + 64)
    with pytest.raises(ValueError, match=r"its request r is token \(r // next_n, r % next_n\)"):
        deep_gemm.fp8_paged_mqa_logits(tq, tc, tw, two_d, tt, None, 320, validate=True)
    # The upper bound as passed too: past it, the scorer named the derived cache_lengths' value (context_lens -
    # next_n) and range.
    huge = torch.tensor([2**62 + 2, int(lens[1])], dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^Invalid context_lens: expected values in \[2, 4611686018427387905\] "
                       r".*, got 4611686018427387906 at 0$"):  # fmt: skip
        deep_gemm.fp8_paged_mqa_logits(tq, tc, tw, huge, tt, None, max_context_len, validate=True)
    huge = torch.tensor([[1, 2], [3, 2**62 + 1]], dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^Invalid context_lens: expected values in \[1, 4611686018427387904\] "
                       r".*, got 4611686018427387905 at \(1, 1\)$"):  # fmt: skip
        deep_gemm.fp8_paged_mqa_logits(tq, tc, tw, huge, tt, None, max_context_len, validate=True)
    wide = torch.tensor([2**32 + int(lens[0]), int(lens[1])], dtype=torch.int64)  # not the same as lens
    with pytest.raises(ValueError, match=r"^Invalid max_context_len: "):
        deep_gemm.fp8_paged_mqa_logits(tq, tc, tw, wide, tt, None, max_context_len, validate=True)
    empty = deep_gemm.fp8_paged_mqa_logits(tq[:0], tc, tw[:0], torch.from_numpy(lens[:0]), tt[:0], None, 16,
                                           validate=True)  # fmt: skip
    assert empty.shape == (0, 16)
    with pytest.raises(TypeError, match=r"^Invalid context_lens: expected dtype int32"):
        deep_gemm.get_paged_mqa_logits_metadata(torch.ones(2), BLOCK, 132)


def test_the_least_lengths_of_each_dtype_see_nothing_and_degenerate_shapes_and_pairs_are_named():
    # helper-55's findings: the adapters subtracted from the lengths as given, so an int32 or int64 least value
    # wrapped round to a huge length and its token saw every key; next_n 0 with 1-D lengths raised torch's
    # RuntimeError from arange; q's errors named the [B * next_n, H, D] view without saying so; a bad pair
    # said only "got a tuple"; "pools" in a refusal with no word that a pool is a key here.
    q, cache, weights, lens, table, max_context_len, _ = _call(2, False, seed=11)
    tq = torch.from_numpy(q).view(torch.float8_e4m3fn)
    tc, tw, tt = (torch.from_numpy(a) for a in (cache, weights, table))
    for least in (torch.tensor([-(2**31), int(lens[1])], dtype=torch.int32),
                  torch.tensor([-(2**63), int(lens[1])], dtype=torch.int64),
                  torch.tensor([[-(2**31), -(2**31) + 1], [5, 6]], dtype=torch.int32),
                  torch.tensor([[-(2**63), -(2**63) + 1], [5, 6]], dtype=torch.int64)):  # fmt: skip
        got = deep_gemm.fp8_paged_mqa_logits(tq, tc, tw, least, tt, None, max_context_len).numpy()
        assert np.isneginf(got[:2]).all(), least  # request 0's two tokens
        assert np.isfinite(got[2:, :5]).all(), least  # request 1's see its keys
    values = torch.from_numpy(cache[0, :, 0, :HEAD_DIM].copy()).view(torch.float8_e4m3fn)
    scales = torch.ones(BLOCK)
    flat_q = tq.reshape(-1, HEADS, HEAD_DIM)[:2]
    for dtype, least in ((torch.int32, -(2**31)), (torch.int64, -(2**63))):
        ends = torch.tensor([least, 3], dtype=dtype)
        got = deep_gemm.fp8_mqa_logits(flat_q, (values, scales), tw[:2], torch.zeros(2, dtype=dtype), ends).numpy()
        assert np.isneginf(got[0]).all() and np.isfinite(got[1, :3]).all() and np.isneginf(got[1, 3:]).all()

    none = deep_gemm.fp8_paged_mqa_logits(tq[:, :0], tc, tw[:0], torch.from_numpy(lens), tt, None, 16)
    assert none.shape == (0, 16)

    wide = torch.zeros((2, 2, 129, HEAD_DIM), dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"^Invalid q: expected 1 to 128 heads .*, got 129 \(kpool_index_logits_fp8's "
                       r"q: this call's q \[B, next_n, H, D\] as \[B \* next_n, H, D\]"):  # fmt: skip
        deep_gemm.fp8_paged_mqa_logits(wide, tc, torch.zeros(4, 129), torch.from_numpy(lens), tt, None, 16)
    with pytest.raises(ValueError, match=r"^Invalid q: expected a tensor or \(values, None\) .*, "
                       r"got \(torch.Tensor, torch.Tensor\)$"):  # fmt: skip
        deep_gemm.fp8_paged_mqa_logits((tq, torch.ones(4)), tc, tw, torch.from_numpy(lens), tt, None, 16)
    with pytest.raises(ValueError, match=r"^Invalid q: expected a tensor or \(values, None\), got a tuple of 3 items$"):
        deep_gemm.fp8_paged_mqa_logits((tq, None, None), tc, tw, torch.from_numpy(lens), tt, None, 16)
    with pytest.raises(ValueError, match=r"^Invalid kv: expected a pair .*, got a tuple of 3 items$"):
        deep_gemm.fp8_mqa_logits(flat_q, (values, scales, scales), tw[:2], torch.zeros(2, dtype=torch.int32),
                                 torch.ones(2, dtype=torch.int32))  # fmt: skip
    with pytest.raises(ValueError, match=r"^Invalid max_context_len: .* \(kpool_index_logits_fp8's max_pools, at kpool "
                       r"1: a pool is a key; its token t is q\[t // next_n, t % next_n\]\)$"):  # fmt: skip
        deep_gemm.fp8_paged_mqa_logits(tq, tc, tw, torch.from_numpy(lens), tt, None, int(lens.max()) - 1,
                                       validate=True)  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_max_seqlen_k_puts_each_window_first_and_its_keys_score_as_in_the_full_result(device):
    # Newer DeepGEMM's 7th argument (its test: fp8_mqa_logits(..., max_seqlen_k=(ke - ks).max(),
    # clean_logits=False) is [S, max_seqlen_k], column c key ks + c). Here the columns past a window are -inf
    # (DeepGEMM leaves them unspecified), a window wider than the width keeps its first keys (validate=True
    # refuses it), and windows reaching below key 0 or past the keys score -inf there.
    q, values, scales, weights, starts, ends = _flat_call(7)
    starts[:3], ends[-2:] = [-5, -1, 2], [170, 165]  # below key 0; past the 160 keys (validate refuses those)
    names = ("q", "values", "scales", "weights", "ks", "ke")
    arrays = (q, values, scales, weights, starts, ends)
    t = {n: torch.from_numpy(a).to(device) for n, a in zip(names, arrays, strict=True)}
    kv = (t["values"].view(torch.float8_e4m3fn), t["scales"])
    tq = t["q"].view(torch.float8_e4m3fn)
    full = deep_gemm.fp8_mqa_logits(tq, kv, t["weights"], t["ks"], t["ke"]).cpu().numpy()
    widest = int((ends - starts).max())
    for width in (widest, widest + 7, widest - 10):
        got = deep_gemm.fp8_mqa_logits(tq, kv, t["weights"], t["ks"], t["ke"], False, width).cpu().numpy()
        assert got.shape == (48, width) and got.dtype == np.float32
        for row in range(48):
            keys = np.arange(starts[row], starts[row] + min(ends[row] - starts[row], width))
            inside = (keys >= 0) & (keys < 160)
            # The same scorer on the same key and token: the same bits as the [S, N] result's column.
            np.testing.assert_array_equal(got[row, : len(keys)][inside], full[row, keys[inside]])
            assert np.isneginf(got[row, : len(keys)][~inside]).all() and np.isneginf(got[row, len(keys) :]).all()
    with pytest.raises(ValueError, match=rf"^Invalid max_seqlen_k: expected at least every window's width \(ke - ks\)"
                       rf", got {widest - 10}, below token \d+'s width \d+$"):  # fmt: skip
        deep_gemm.fp8_mqa_logits(tq, kv, t["weights"], t["ks"], t["ke"].clamp(max=160), False, widest - 10,
                                 validate=True)  # fmt: skip
    with pytest.raises(ValueError, match=r"^Invalid max_seqlen_k: expected an integer in \[0, 2147483647\], got -1$"):
        deep_gemm.fp8_mqa_logits(tq, kv, t["weights"], t["ks"], t["ke"], False, -1)
    none = deep_gemm.fp8_mqa_logits(tq, (kv[0][:0], kv[1][:0]), t["weights"], t["ks"], t["ke"], False, 4)
    assert none.shape == (48, 4) and torch.isneginf(none).all()


def test_newer_releases_names_and_arguments_give_the_same_logits():
    # helper-61 read DeepGEMM's bindings: newer releases add fp8_fp4_mqa_logits / fp8_fp4_paged_mqa_logits
    # (which vLLM looks up; logits_dtype float32 or bfloat16, q as (values, None)), indices=None on the paged
    # call and its metadata (a request id a q row, for DeepGEMM's scheduler), clean_logits=False by default on
    # the paged call, and bfloat16/float16 weights.
    q, cache, weights, lens, table, max_context_len, _ = _call(1, True, seed=12)
    weights = torch.from_numpy(weights).bfloat16().float()  # exact in bfloat16 and float16 both
    tq = torch.from_numpy(q).view(torch.float8_e4m3fn)
    tc, tl, tt = (torch.from_numpy(a) for a in (cache, lens, table))
    want = deep_gemm.fp8_paged_mqa_logits(tq, tc, weights, tl, tt, None, max_context_len)
    ids = torch.arange(3, dtype=torch.int32)
    metadata = deep_gemm.get_paged_mqa_logits_metadata(tl, BLOCK, 8, ids)
    for got in (
        deep_gemm.fp8_paged_mqa_logits(tq, tc, weights.bfloat16(), tl, tt, metadata, max_context_len, False, ids),
        deep_gemm.fp8_paged_mqa_logits(tq, tc, weights.half(), tl, tt, metadata, max_context_len, indices=ids),
        deep_gemm.fp8_fp4_paged_mqa_logits(
            (tq, None), tc, weights, tl, tt, metadata, max_context_len, False, torch.float32, ids
        ),
    ):
        assert torch.equal(got, want)
    rounded = deep_gemm.fp8_fp4_paged_mqa_logits((tq, None), tc, weights, tl, tt, None, max_context_len,
                                                 logits_dtype=torch.bfloat16)  # fmt: skip
    assert rounded.dtype == torch.bfloat16 and torch.equal(rounded, want.bfloat16())
    for bad, wanted in (
        (ids[:2], r"ValueError: Invalid indices: expected None or shape \[3\] .*, got shape \(2,\)"),
        (ids.float(), r"TypeError: Invalid indices: expected dtype int32 \(or int64\), got float32"),
        (ids.to("meta"), r"ValueError: Invalid indices: expected a tensor on cpu like the lengths"),
    ):
        for call in (
            lambda bad: deep_gemm.get_paged_mqa_logits_metadata(tl, BLOCK, 8, bad),
            lambda bad: deep_gemm.fp8_paged_mqa_logits(tq, tc, weights, tl, tt, None, max_context_len, False, bad),
        ):
            with pytest.raises((ValueError, TypeError)) as refused:
                call(bad)
            assert re.match(wanted, f"{refused.type.__name__}: {refused.value}"), refused.value
    with pytest.raises(TypeError, match=r"^Invalid logits_dtype: expected torch.float32 or torch.bfloat16, got torch"
                       r".float16$"):  # fmt: skip
        deep_gemm.fp8_fp4_paged_mqa_logits(tq, tc, weights, tl, tt, None, max_context_len, logits_dtype=torch.float16)

    q, values, scales, flat_weights, starts, ends = _flat_call(13)
    flat = (torch.from_numpy(q).view(torch.float8_e4m3fn),
            (torch.from_numpy(values).view(torch.float8_e4m3fn), torch.from_numpy(scales)),
            torch.from_numpy(flat_weights), torch.from_numpy(starts), torch.from_numpy(ends))  # fmt: skip
    want = deep_gemm.fp8_mqa_logits(*flat)
    assert torch.equal(deep_gemm.fp8_fp4_mqa_logits((flat[0], None), *flat[1:], False, 0, torch.float32, None), want)
    rounded = deep_gemm.fp8_fp4_mqa_logits((flat[0], None), *flat[1:], logits_dtype=torch.bfloat16)
    assert rounded.dtype == torch.bfloat16 and torch.equal(rounded, want.bfloat16())
    windows = deep_gemm.fp8_fp4_mqa_logits((flat[0], None), *flat[1:], False, 64)
    assert torch.equal(windows, deep_gemm.fp8_mqa_logits(*flat, False, 64))


def test_deep_gemms_keyword_names_are_taken():
    # DeepGEMM's bindings name their arguments (py::arg): a caller passing them by keyword reaches the same
    # call. These names were vLLM's wrapper's (block_tables, max_model_len, cu_seqlen_ks, ...) until today.
    import inspect

    defaults = {name: inspect.signature(getattr(deep_gemm, name)).parameters["clean_logits"].default
                for name in ("fp8_paged_mqa_logits", "fp8_fp4_paged_mqa_logits", "fp8_mqa_logits",
                             "fp8_fp4_mqa_logits")}  # fmt: skip
    assert defaults == {"fp8_paged_mqa_logits": False, "fp8_fp4_paged_mqa_logits": False,
                        "fp8_mqa_logits": True, "fp8_fp4_mqa_logits": True}  # DeepGEMM's defaults  # fmt: skip
    q, cache, weights, lens, table, max_context_len, _ = _call(1, False, seed=14)
    tq = torch.from_numpy(q).view(torch.float8_e4m3fn)
    tc, tw, tl, tt = (torch.from_numpy(a) for a in (cache, weights, lens, table))
    meta = deep_gemm.get_paged_mqa_logits_metadata(context_lens=tl, block_kv=BLOCK, num_sms=4, indices=None)
    paged = {"q": tq, "kv_cache": tc, "weights": tw, "context_lens": tl, "block_table": tt, "schedule_meta": meta,
             "max_context_len": max_context_len, "clean_logits": False}  # fmt: skip
    want = deep_gemm.fp8_paged_mqa_logits(tq, tc, tw, tl, tt, meta, max_context_len)
    assert torch.equal(deep_gemm.fp8_paged_mqa_logits(**paged, indices=None), want)
    assert torch.equal(deep_gemm.fp8_fp4_paged_mqa_logits(**paged, logits_dtype=torch.float32, indices=None), want)
    q, values, scales, weights, starts, ends = _flat_call(15)
    flat = {"q": torch.from_numpy(q).view(torch.float8_e4m3fn),
            "kv": (torch.from_numpy(values).view(torch.float8_e4m3fn), torch.from_numpy(scales)),
            "weights": torch.from_numpy(weights), "cu_seq_len_k_start": torch.from_numpy(starts),
            "cu_seq_len_k_end": torch.from_numpy(ends), "clean_logits": False, "max_seqlen_k": 0}  # fmt: skip
    want = deep_gemm.fp8_mqa_logits(*flat.values())
    assert torch.equal(deep_gemm.fp8_mqa_logits(**flat), want)
    assert torch.equal(deep_gemm.fp8_fp4_mqa_logits(**flat, logits_dtype=torch.float32, schedule_meta=None), want)


def test_helper_63s_findings_least_ends_empty_inputs_and_indices_at_next_n_2():
    # (1) max_seqlen_k's widths subtracted int64 ends as given: an end at int64's least value wrapped round to
    # the largest width and its empty window scored keys; validate=True's width check wrapped the same way.
    q, values, scales, weights, starts, ends = _flat_call(16)
    tq = torch.from_numpy(q).view(torch.float8_e4m3fn)
    kv = (torch.from_numpy(values).view(torch.float8_e4m3fn), torch.from_numpy(scales))
    tw = torch.from_numpy(weights)
    ks, ke = torch.from_numpy(starts).long(), torch.from_numpy(ends).long()
    ks[0], ke[0] = 1, -(2**63)
    for width in (0, 4):
        got = deep_gemm.fp8_mqa_logits(tq, kv, tw, ks, ke, False, width)
        assert torch.isneginf(got[0]).all() and torch.isfinite(got[1, : min(ends[1], width or 160)]).all()
    ks[0], ke[0] = -(2**63), 5
    with pytest.raises(ValueError, match=r"^Invalid max_seqlen_k: expected at least every window's width .*, got 96, "
                       r"below token 0's width 4611686018427387909$"):  # fmt: skip
        deep_gemm.fp8_mqa_logits(tq, kv, tw, ks, ke, False, 96, validate=True)
    # (3) No keys, or no tokens with max_seqlen_k: the scorer's checks of q and the weights were skipped.
    none = (kv[0][:0], kv[1][:0])
    for call in (lambda w: deep_gemm.fp8_mqa_logits(tq, none, w, ks, ke),
                 lambda w: deep_gemm.fp8_mqa_logits(tq, none, w, ks, ke, False, 2),
                 lambda w: deep_gemm.fp8_mqa_logits(tq[:0], kv, w[:0], ks[:0], ke[:0], False, 2)):  # fmt: skip
        with pytest.raises(TypeError, match=r"^Invalid weights: expected dtype float32"):
            call(tw.double())
        assert torch.isneginf(call(tw)).all()
    # (4) indices at next_n 2: the metadata call wanted [B], the logits call [B * next_n]; DeepGEMM takes a
    # request id a row at next_n 1 only, and so do both calls now.
    q, cache, weights, lens, table, max_context_len, _ = _call(2, True, seed=17)
    tq, tc, tw, tl, tt = (torch.from_numpy(a) for a in (q, cache, weights, lens, table))
    ids = torch.arange(2, dtype=torch.int32)
    wanted = r"^Invalid indices: expected None at next_n above 1 .*, got a torch.Tensor at next_n 2$"
    with pytest.raises(ValueError, match=wanted):
        deep_gemm.get_paged_mqa_logits_metadata(tl, BLOCK, 8, ids)
    with pytest.raises(ValueError, match=wanted):
        deep_gemm.fp8_paged_mqa_logits(tq.view(torch.float8_e4m3fn), tc, tw, tl, tt, None, max_context_len,
                                       indices=ids)  # fmt: skip
