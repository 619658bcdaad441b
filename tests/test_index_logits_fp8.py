"""kpool_index_logits_fp8: the emulated tensor-core kernel against the float64 reference, within the stated bound."""

from __future__ import annotations

import numpy as np
import pytest
from index_cases import IndexCase, e4m3_bytes, index_case, infinite_scale_case, paged_cache

from kpool_cupy import emulate, reference
from kpool_cupy.backends.emulate import EmulateBackend
from kpool_cupy.backends.host import host_binding
from kpool_cupy.emulator.launch import recording
from kpool_cupy.functions import definition
from kpool_cupy.kernel.declarations import MMA_E4M3, MMA_E4M3_HMMA, MMA_F16, MMA_WGMMA
from kpool_cupy.ops.framework.binding import bind
from kpool_cupy.ops.index_logits_fp8 import SPEC
from kpool_cupy.tools.index_accuracy import gpu_accumulation_bits, index_logits_agree, index_logits_bound


def _bound(case, want):
    return index_logits_bound(*case.args, kpool=case.kpool, max_pools=want.shape[1])


def _check(case, got, want):
    verdict = index_logits_agree(got, want, _bound(case, want))
    assert verdict["ok"], verdict


def _emulate_with(mma: int, case, **options):
    """The emulator's call flow with the scorer's instruction chosen (the f16 path is what an sm_80 GPU runs)."""

    class Backend(EmulateBackend):
        def tensor_core(self) -> int:
            return mma

    call = bind(definition(SPEC), host_binding("emulate", lambda extras: Backend()))
    return call(*case.args, kpool=case.kpool, **options)


@pytest.mark.usefixtures("emulated_scorer_path")
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("heads", [1, 16, 20])
def test_emulated_logits_meet_the_float64_model_within_the_bound(head_dim, heads):
    # Ragged prefill chunks after cached prefixes at several phases of kpool, and a request with no tokens.
    rng = np.random.default_rng(head_dim * 1000 + heads)
    case = index_case(rng, head_dim=head_dim, heads=heads, counts=(5, 0, 11, 2), cache_lengths=(3, 9, 40, 0))
    want = reference.kpool_index_logits_fp8(*case.args, kpool=case.kpool)
    got = emulate.kpool_index_logits_fp8(*case.args, kpool=case.kpool)
    _check(case, got, want)


@pytest.mark.parametrize("mma", [MMA_E4M3, MMA_F16, MMA_E4M3_HMMA, MMA_WGMMA])
def test_every_tensor_core_path_meets_the_bound(mma):
    # The f16 path (sm_80) converts each e4m3 byte to f16 times 2^-8 and undoes the scale after the sum:
    # exact, so it meets the same bound as the e4m3 instruction; sm_90's (hmma) converts each to the f16 of the
    # same value, also exact. The wgmma path (sm_90a) sums in its own order,
    # which the bound (any order of the float32 sums) covers.
    rng = np.random.default_rng(7 + mma)
    # A cache of 235 pools: more than one block's pools on either path (64 or 128), so the launch's pool
    # tiles must match the kernel's.
    case = index_case(rng, heads=24, kpool=3, counts=(7, 4), cache_lengths=(700, 2))
    want = reference.kpool_index_logits_fp8(*case.args, kpool=case.kpool)
    _check(case, _emulate_with(mma, case), want)


def _every_byte_case(head_dim: int, keys_vary: bool) -> IndexCase:
    """256 scores, each of one product with 1.0 (0x38): pool p's key holds byte p at position p % head_dim and the
    query is 1.0 everywhere (keys_vary), or token i's query holds byte i at position i % head_dim against one key
    of 1.0 everywhere. Every other byte is zero, every scale and weight 1."""
    block_size = 16
    tokens, pools = (1, 256) if keys_vary else (256, 1)
    keys = np.full((256 // block_size, block_size, head_dim), 0 if keys_vary else 0x38, np.uint8)
    q = np.full((tokens, 1, head_dim), 0x38 if keys_vary else 0, np.uint8)
    for byte in range(256):
        if keys_vary:
            keys.reshape(256, head_dim)[byte, byte % head_dim] = byte
        else:
            q[byte, 0, byte % head_dim] = byte
    cache = paged_cache(keys, np.ones(keys.shape[:2], np.float32))
    table = np.arange(256 // block_size, dtype=np.int32)[None, :]
    offsets = np.array([0, tokens], np.int32)
    lengths = np.array([pools - 1], np.int32)  # the first token sees every pool (kpool 1)
    return IndexCase(q, np.ones((tokens, 1), np.float32), cache, table, offsets, lengths, 1)


@pytest.mark.parametrize("head_dim", [64, 256])
@pytest.mark.parametrize("keys_vary", [True, False], ids=["keys", "queries"])
@pytest.mark.parametrize("mma", [MMA_E4M3, MMA_F16, MMA_E4M3_HMMA, MMA_WGMMA], ids=["e4m3", "f16", "hmma", "wgmma"])
def test_every_e4m3_byte_reaches_the_tensor_cores_as_its_value(mma, keys_vary, head_dim):
    # Each logit is one product with 1.0, so exact on every path: a conversion that is wrong for any byte (a
    # subnormal's shift, a NaN, the sign) or at any position of a lane's words shows as a wrong value. The
    # reference decodes the bytes itself. With one operand all 1.0 a query byte paired with the wrong key byte
    # does not show: the bound tests (random bytes) catch that.
    case = _every_byte_case(head_dim, keys_vary)
    want = reference.kpool_index_logits_fp8(*case.args, kpool=1)
    got = _emulate_with(mma, case)
    scores = (want[0] if keys_vary else want[:, 0], got[0] if keys_vary else got[:, 0])
    assert np.isnan(scores[0]).sum() == 2 and (scores[0] > 0).sum() == 126  # 0x7f/0xff, and the positive bytes
    assert np.array_equal(scores[1], scores[0], equal_nan=True), np.flatnonzero(scores[1] != scores[0])


@pytest.mark.usefixtures("emulated_scorer_path")
@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
def test_decode_steps_with_next_n_tokens_a_request(next_n):
    # input_row_offsets = [0, n, 2n, ...]: a request's next_n rows see one more position each.
    rng = np.random.default_rng(next_n)
    lengths = (61, 64, 127, 5, 0)
    case = index_case(rng, heads=32, kpool=4, block_size=8, counts=(next_n,) * 5, cache_lengths=lengths)
    want = reference.kpool_index_logits_fp8(*case.args, kpool=case.kpool)
    got = emulate.kpool_index_logits_fp8(*case.args, kpool=case.kpool)
    _check(case, got, want)


@pytest.mark.usefixtures("emulated_scorer_path")
@pytest.mark.parametrize("kpool", [1, 2, 5, 8])
def test_every_phase_of_kpool_sees_exactly_its_complete_pools(kpool):
    # Cached lengths at every phase mod kpool: a pool counts from the token at its last member on; the rest of
    # the row is exactly -inf.
    rng = np.random.default_rng(kpool)
    lengths = tuple(range(kpool, 2 * kpool))
    case = index_case(rng, heads=8, kpool=kpool, block_size=4, counts=(3,) * kpool, cache_lengths=lengths)
    got = emulate.kpool_index_logits_fp8(*case.args, kpool=kpool)
    visible = case.visible()
    columns = np.arange(got.shape[1])
    assert got.shape[1] == visible.max()
    assert np.array_equal(np.isneginf(got), columns[None, :] >= visible[:, None])


@pytest.mark.usefixtures("emulated_scorer_path")
@pytest.mark.parametrize("heads", [1, 16, 17, 32, 33, 62, 63, 64, 65, 96, 127, 128])
def test_columns_past_the_heads_add_nothing_where_a_key_scale_is_infinite(heads):
    # A tensor core's columns past a token's heads (the mma.sync paths' tiles of 16, the wgmma path's chunks of
    # 64) hold zero query rows; only their adds' predicates keep the NaN they make at an infinite scale out of
    # the sum. The emulated kernel gives every key's logit exactly: heads * 64, or +inf. Seen failing on the
    # wgmma path with its full chunk's adds (no predicate) taken two heads early (at 62 and 63 heads).
    case = infinite_scale_case(heads)
    want = reference.kpool_index_logits_fp8(*case.args, kpool=4)
    got = emulate.kpool_index_logits_fp8(*case.args, kpool=4)
    assert np.isposinf(want).any() and (want == heads * 64).any() and not np.isnan(want).any()
    assert np.array_equal(got, want), np.argwhere(got != want)[:5]


@pytest.mark.usefixtures("emulated_scorer_path")
def test_nan_bytes_give_nan_logits_and_negative_scores_give_zero():
    # relu keeps NaN on every backend: 0x7f in one query head poisons that token's visible logits; 0xff in one
    # key poisons that pool for every token that sees it. A token whose dots are all negative scores 0 exactly
    # (relu), not a negative number.
    rng = np.random.default_rng(3)
    case = index_case(rng, heads=4, kpool=2, block_size=4, counts=(3, 2), cache_lengths=(4, 6))
    case.q[1, 2, 5] = 0x7F
    page = case.cache_block_table[1, 0]
    case.cache[page, 1, 0] = 0xFF  # request 1, pool 1: value byte 0 of entry 1
    for backend in (reference, emulate):
        got = backend.kpool_index_logits_fp8(*case.args, kpool=case.kpool)
        visible = case.visible()
        assert np.isnan(got[1, : visible[1]]).all() and not np.isnan(got[0]).any()
        assert np.isnan(got[3:, 1]).all() and not np.isnan(got[3:, 0]).any()


@pytest.mark.usefixtures("emulated_scorer_path")
def test_all_negative_dots_score_zero():
    rng = np.random.default_rng(4)
    case = index_case(rng, heads=2, kpool=1, block_size=2, counts=(1,), cache_lengths=(3,))
    case.q[:] = 0x38  # every query value 1.0
    case.cache.reshape(case.cache.shape[0], -1)[:, : 2 * 128] = 0xB8  # every key value -1.0
    for backend in (reference, emulate):
        got = backend.kpool_index_logits_fp8(*case.args, kpool=case.kpool)
        assert (got == 0).all(), got


@pytest.mark.parametrize(
    ("heads", "bits"), [(16, 24), (64, 24), (128, 24), (16, 23), (64, 23), (128, 23), (4, 13), (8, 13)]
)
def test_a_misplaced_lane_in_the_emulated_mma_breaks_the_bound(monkeypatch, heads, bits):
    # The emulated mma.sync puts fragments together by the PTX ISA's layouts; built so that one lane's A
    # elements land in reversed k order, the scores must leave the bound: the tests would see a wrong layout.
    # Each bound a test uses must catch it: 24 bits (the CPU) and 23 (f16 HMMA GPUs) by 100x and more (seen:
    # 1.4e3 at 128 heads and up, 580 at 23 bits); 13 (native FP8) only at few heads, where one wrong product
    # still shows (seen: 4 to 11x at 4 heads, 1.4 to 5x at 16, under 1 from 32 on), so the GPU test has a
    # 4-head case (at 1 head, lane 5 holds only zero rows: nothing to misplace).
    rng = np.random.default_rng(heads)
    case = index_case(rng, heads=heads, kpool=2, counts=(4, 3), cache_lengths=(30, 9))
    want = reference.kpool_index_logits_fp8(*case.args, kpool=case.kpool)
    bound = index_logits_bound(*case.args, kpool=case.kpool, max_pools=want.shape[1], accumulation_bits=bits)
    for mma in (MMA_E4M3, MMA_F16):
        monkeypatch.setenv(emulate.FLAGS_VARIABLE, "-DKP_MMA_MISPLACED_LANE=5")
        got = _emulate_with(mma, case)
        monkeypatch.delenv(emulate.FLAGS_VARIABLE)
        verdict = index_logits_agree(got, want, bound)
        assert not verdict["ok"] and verdict["worst_error_over_bound"] > (1 if bits == 13 else 100), verdict


@pytest.mark.parametrize(("heads", "bits"), [(4, 13), (16, 13), (16, 24), (64, 24), (128, 24)])
def test_a_misplaced_lane_in_the_emulated_wgmma_breaks_the_bound(monkeypatch, heads, bits):
    # The emulated wgmma puts its accumulator fragments together by the PTX ISA's layout; built so that thread 5
    # of each warpgroup takes the rows of thread 1 (KP_WGMMA_MISPLACED_LANE), the sm_90a path's scores must leave
    # the bound: by 100x and more at 24 bits (seen with the keys on M: 2.5e3 at 128 heads, 5.8e3 at 64, 1.2e4 at
    # 16), and at 13 bits (the GPU's) by more than 1 where few heads let one wrong product show (seen: 11x at 4
    # heads, 3.5x at 16).
    rng = np.random.default_rng(heads + 1)
    case = index_case(rng, heads=heads, kpool=2, counts=(4, 3), cache_lengths=(30, 9))
    want = reference.kpool_index_logits_fp8(*case.args, kpool=case.kpool)
    bound = index_logits_bound(*case.args, kpool=case.kpool, max_pools=want.shape[1], accumulation_bits=bits)
    monkeypatch.setenv(emulate.FLAGS_VARIABLE, "-DKP_WGMMA_MISPLACED_LANE=5")
    got = _emulate_with(MMA_WGMMA, case)
    monkeypatch.delenv(emulate.FLAGS_VARIABLE)
    verdict = index_logits_agree(got, want, bound)
    assert not verdict["ok"] and verdict["worst_error_over_bound"] > (1 if bits == 13 else 100), verdict


def test_the_gpu_bound_takes_its_bits_from_the_instruction():
    # f16 HMMAs (the sm_80 path, sm_90's, and e4m3 on sm_90, which ptxas lowers to them) sum in float32 with
    # truncation; native FP8 tensor cores narrower.
    assert gpu_accumulation_bits(80, MMA_F16) == gpu_accumulation_bits(90, MMA_E4M3) == 23
    assert gpu_accumulation_bits(90, MMA_E4M3_HMMA) == 23
    assert gpu_accumulation_bits(89, MMA_E4M3) == gpu_accumulation_bits(120, MMA_E4M3) == 13
    assert gpu_accumulation_bits(90, MMA_WGMMA) == 13  # sm_90a: QGMMA, native FP8 (sm_90's HMMA rule is mma.sync's)


def test_a_subnormal_scale_reads_as_zero_within_the_bound():
    # The kernels read a float32 subnormal as zero (denormals-are-zero), where the exact logit is a normal
    # number: the bound's third term covers it, and the logit is exactly 0 on the emulator.
    rng = np.random.default_rng(5)
    case = index_case(rng, heads=4, kpool=1, block_size=4, counts=(1,), cache_lengths=(3,))
    pages = case.cache.shape[0]
    flat = case.cache.reshape(pages, -1)
    flat[:, 4 * 128 :] = np.full((pages, 4), 1e-39, np.float32).view(np.uint8).reshape(pages, -1)
    case.q[:] = 0x38  # every query value 1.0
    flat[:, : 4 * 128] = 0x38  # every key value 1.0: s * dot = 1.28e-37, normal
    want = reference.kpool_index_logits_fp8(*case.args, kpool=1)
    got = emulate.kpool_index_logits_fp8(*case.args, kpool=1)
    assert (got == 0).all() and (want > 2.0**-126).all(), (got, want)
    _check(case, got, want)
    # A subnormal weight (normal scale 1): read as zero by the kernel, kept by the reference; the bound's
    # 2^-126 sum |w| term covers it (the README's words for the bound named no such term).
    flat[:, 4 * 128 :] = np.full((pages, 4), 1.0, np.float32).view(np.uint8).reshape(pages, -1)
    case.weights[:] = np.float32(2.0**-130)
    want = reference.kpool_index_logits_fp8(*case.args, kpool=1)
    got = emulate.kpool_index_logits_fp8(*case.args, kpool=1)
    assert (got == 0).all() and (want == 4 * 128 * 2.0**-130).all(), (got, want)
    _check(case, got, want)


def test_float32_overflow_is_not_within_the_bound():
    # s * dot past float32's range is +inf on the kernel where the float64 answer is finite (a tiny weight):
    # outside the bound's stated range, and the agreement check must say so rather than pass it.
    rng = np.random.default_rng(6)
    case = index_case(rng, heads=2, kpool=1, block_size=4, counts=(1,), cache_lengths=(3,))
    pages = case.cache.shape[0]
    flat = case.cache.reshape(pages, -1)
    flat[:, 4 * 128 :] = np.full((pages, 4), 1e36, np.float32).view(np.uint8).reshape(pages, -1)
    case.q[:] = 0x38
    flat[:, : 4 * 128] = 0x50  # key values 8: dot 1024, s * dot 1e39 > 3.4e38
    case.weights[:] = 1e-6
    with np.errstate(over="ignore"):
        want = reference.kpool_index_logits_fp8(*case.args, kpool=1)
        got = emulate.kpool_index_logits_fp8(*case.args, kpool=1)
        bound = _bound(case, want)
    assert np.isfinite(want).all() and np.isposinf(got).all()
    verdict = index_logits_agree(got, want, bound)
    assert not verdict["ok"] and not verdict["same_inf"], verdict
    # Heads of both signs past the range (1e39 and -1.5e39): the float64 sum rounds to -inf, the kernel's +inf
    # and -inf make NaN (as the README says).
    case.weights[:] = np.array([1.0, -1.5], np.float32)
    with np.errstate(over="ignore"):
        assert np.isneginf(reference.kpool_index_logits_fp8(*case.args, kpool=1)).all()
        assert np.isnan(emulate.kpool_index_logits_fp8(*case.args, kpool=1)).all()


def test_garbage_offsets_without_max_pools_size_the_result_as_the_kernel_reads_them():
    # validate=False and max_pools=None: the width comes from the offsets as the kernel reads them (its binary
    # search, its usable-rows rule, uint32 offsets at their full range), never from an index outside them.
    rng = np.random.default_rng(7)
    case = index_case(rng, heads=4, kpool=2, block_size=4, counts=(3, 2), cache_lengths=(5, 8))
    for offsets in ([0, 3, 4], [2, 3, 5], [5, 0, 5], [0, 9, 5]):
        case.input_row_offsets = np.array(offsets, np.int32)
        got = {b: b.kpool_index_logits_fp8(*case.args, kpool=2, validate=False) for b in (reference, emulate)}
        assert got[reference].shape == got[emulate].shape, offsets
        assert np.array_equal(np.isneginf(got[reference]), np.isneginf(got[emulate])), offsets
    case = index_case(rng, heads=4, kpool=1, block_size=4, counts=(1, 1, 1), cache_lengths=(3, 3, 3))
    case.input_row_offsets = np.array([0, 0xFFFFFFFF, 2, 3], np.uint32)  # 4294967295, not -1: unusable rows
    case.cache_lengths = case.cache_lengths.astype(np.uint32)
    for backend in (reference, emulate):
        got = backend.kpool_index_logits_fp8(*case.args, kpool=1, max_pools=4, validate=False)
        assert np.isneginf(got).all(), (backend.__name__, got)


def test_max_pools_and_out():
    # max_pools fixes the width (extra columns -inf); out= is written in place; a narrower max_pools than a
    # token sees is refused with validate=True.
    rng = np.random.default_rng(5)
    case = index_case(rng, heads=8, kpool=4, counts=(2, 3), cache_lengths=(17, 30))
    most = int(case.visible().max())
    wide = emulate.kpool_index_logits_fp8(*case.args, kpool=4, max_pools=most + 9)
    narrow = emulate.kpool_index_logits_fp8(*case.args, kpool=4)
    assert wide.shape == (5, most + 9) and np.isneginf(wide[:, most:]).all()
    assert np.array_equal(wide[:, :most], narrow)
    out = np.full((5, most), 7.0, np.float32)
    returned = emulate.kpool_index_logits_fp8(*case.args, kpool=4, out=out, validate=False)
    assert returned is out and np.array_equal(out, narrow)
    with pytest.raises(ValueError, match="max_pools"):
        emulate.kpool_index_logits_fp8(*case.args, kpool=4, max_pools=most - 1)


@pytest.mark.parametrize("backend", [reference, emulate])
def test_a_width_refusal_names_the_argument_the_caller_passed(backend):
    # An out one column short, and lengths whose pools pass int32, were refused as "Invalid max_pools" in calls
    # that never passed max_pools.
    rng = np.random.default_rng(11)
    case = index_case(rng, heads=4, kpool=4, counts=(2, 3), cache_lengths=(17, 30))
    most = int(case.visible().max())
    t = int(np.argmax(case.visible()))
    short = np.zeros((5, most - 1), np.float32)
    with pytest.raises(ValueError) as error:
        backend.kpool_index_logits_fp8(*case.args, kpool=4, out=short)
    wanted = f"at least the {most} pools token {t} sees"
    assert str(error.value) == f"Invalid out: expected {wanted}, got shape (5, {most - 1})"
    with pytest.raises(ValueError, match=rf"^Invalid max_pools: expected at least the {most} pools token {t} sees"):
        backend.kpool_index_logits_fp8(*case.args, kpool=4, max_pools=most - 1)
    one = index_case(rng, heads=4, kpool=1, counts=(1,), cache_lengths=(0,))
    one.cache_lengths = np.array([2**31 + 4], np.int64)  # the token sees pool 2^31 + 4: past int32 pool ids
    for validate in (True, False):
        with pytest.raises(ValueError) as error:
            backend.kpool_index_logits_fp8(*one.args, kpool=1, validate=validate)
        wanted = "lengths under which a token sees at most 2147483647 pools (pool ids are int32)"
        assert str(error.value) == f"Invalid cache_lengths: expected {wanted}, got token 0 seeing {2**31 + 5}"


@pytest.mark.parametrize("backend", [reference, emulate])
@pytest.mark.parametrize("validate", [True, False])
def test_an_out_wider_than_int32_pool_ids_is_refused(backend, validate):
    # max_pools= past 2^31 - 1 was refused, an out that wide was not (the hostile review of 2026-12-07): the
    # kernels take a pool id past 2^31 - 2 as past every token's reach, where the formula says the token sees it.
    # A view of 2^31 columns over one float (8 GiB it does not own): refused before anything reads it.
    rng = np.random.default_rng(15)
    case = index_case(rng, heads=4, kpool=4, counts=(1,), cache_lengths=(17,))
    wide = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape=(1, 2**31), strides=(0, 4))
    with pytest.raises(ValueError) as error:
        backend.kpool_index_logits_fp8(*case.args, kpool=4, out=wide, validate=validate)
    wanted = "at most 2147483647 pools a row (pool ids are int32)"
    assert str(error.value) == f"Invalid out: expected {wanted}, got shape (1, {2**31})"


@pytest.mark.parametrize("backend", [reference, emulate])
def test_zero_tokens_give_an_empty_result_with_validation(backend):
    # A width refusal's token index once read argmax of no tokens (the hostile review).
    rng = np.random.default_rng(14)
    case = index_case(rng, heads=4, kpool=4, counts=(0, 0), cache_lengths=(17, 30))
    assert backend.kpool_index_logits_fp8(*case.args, kpool=4).shape == (0, 0)
    assert backend.kpool_index_logits_fp8(*case.args, kpool=4, max_pools=4).shape == (0, 4)


def test_a_launch_past_the_grid_names_the_tokens():
    # The grid bound (token tiles x pool ranges < 2^31) named max_pools; pool ranges shrink as token tiles grow,
    # so only q's tokens pass it. The call claims 2^38 tokens: the launch is sized, never run.
    from dataclasses import replace

    from kpool_cupy.ops.index_logits_fp8 import index_logits_launch

    rng = np.random.default_rng(12)
    case = index_case(rng, heads=4, kpool=4, counts=(2, 3), cache_lengths=(17, 30))
    operands = dict(zip(SPEC.operand_names, (*case.args, np.zeros((5, 3), np.float32)), strict=True))
    call = SPEC.describe((*case.args, None), {"kpool": 4, "max_pools": 2**31 - 1})
    index_logits_launch(replace(call, num_tokens=2**30), operands, 2**31 - 1, MMA_E4M3)  # within the grid
    with pytest.raises(ValueError, match=rf"^Invalid q: expected few enough tokens for one launch .*, got {2**38}$"):
        index_logits_launch(replace(call, num_tokens=2**38), operands, 2**31 - 1, MMA_E4M3)


def test_a_missing_page_without_validation_scores_minus_inf():
    # validate=True refuses a negative or out-of-range page for a visible pool; without it the pool's logits
    # are -inf on both CPU backends, and nothing else changes.
    rng = np.random.default_rng(6)
    case = index_case(rng, heads=4, kpool=2, block_size=4, counts=(2, 2), cache_lengths=(9, 13))
    good = {backend: backend.kpool_index_logits_fp8(*case.args, kpool=2) for backend in (reference, emulate)}
    case.cache_block_table[1, 1] = case.cache.shape[0] + 5
    with pytest.raises(ValueError, match="cache_block_table"):
        reference.kpool_index_logits_fp8(*case.args, kpool=2)
    for backend in (reference, emulate):
        got = backend.kpool_index_logits_fp8(*case.args, kpool=2, validate=False)
        assert np.isneginf(got[2:, 4:8]).all()
        keep = np.ones(got.shape, bool)
        keep[2:, 4:8] = False
        np.testing.assert_array_equal(got[keep], good[backend][keep])


@pytest.mark.slow
@pytest.mark.parametrize("heads", [64, 128])
@pytest.mark.parametrize("index_dtype", [np.int32, np.uint32, np.int64])
def test_many_heads_and_index_dtypes(heads, index_dtype):
    rng = np.random.default_rng(heads)
    case = index_case(rng, heads=heads, kpool=4, block_size=64, counts=(2, 6), index_dtype=index_dtype)
    want = reference.kpool_index_logits_fp8(*case.args, kpool=case.kpool)
    _check(case, emulate.kpool_index_logits_fp8(*case.args, kpool=case.kpool), want)


def test_query_bytes_at_any_alignment_take_the_narrow_path():
    # q as a view one byte into a buffer: no 16-byte loads, the same logits.
    rng = np.random.default_rng(8)
    case = index_case(rng, heads=3, kpool=2, counts=(2, 2), cache_lengths=(5, 8))
    buffer = np.zeros(case.q.size + 1, np.uint8)
    shifted = buffer[1:].reshape(case.q.shape)
    shifted[...] = case.q
    want = emulate.kpool_index_logits_fp8(*case.args, kpool=2)
    args = (shifted, *case.args[1:])
    np.testing.assert_array_equal(emulate.kpool_index_logits_fp8(*args, kpool=2), want)
    assert e4m3_bytes is not None


def test_pages_at_a_stride_that_is_not_16_byte_aligned_take_the_4_byte_path():
    # A page stride of page + 4 bytes: the cache rules allow it (scales stay 4-byte aligned), 16-byte loads do
    # not; the logits are the aligned cache's, bit for bit.
    rng = np.random.default_rng(9)
    case = index_case(rng, heads=5, kpool=2, block_size=4, counts=(3, 2), cache_lengths=(7, 12))
    want = emulate.kpool_index_logits_fp8(*case.args, kpool=2)
    pages, block_size, width = case.cache.shape
    backing = np.zeros(pages * (block_size * width + 4), np.uint8)
    padded = np.ndarray(case.cache.shape, np.uint8, buffer=backing, strides=(block_size * width + 4, width, 1))
    padded[...] = case.cache
    with recording() as launches:
        got = emulate.kpool_index_logits_fp8(case.q, case.weights, padded, *case.args[3:], kpool=2)
    np.testing.assert_array_equal(got, want)
    # The query rows stay aligned (VECTOR 2: their 16-byte loads), the pages take 4-byte loads.
    assert [launch.kernel_name for launch in launches] == ["kpool_index_logits_fp8<128, 1, 2, int, int>"]


def test_logits_rows_past_2_to_the_31_elements(tmp_path):
    # out's offsets are 64-bit: the second token's row starts 2^31 floats into a sparse file-backed buffer
    # (8 GiB of address space, two rows of pages touched), and lands there.
    rng = np.random.default_rng(10)
    case = index_case(rng, heads=2, kpool=1, block_size=4, counts=(2,), cache_lengths=(3,))
    want = emulate.kpool_index_logits_fp8(*case.args, kpool=1)
    stride = 2**31 + 16  # floats between rows
    backing = np.memmap(tmp_path / "out", np.float32, "w+", shape=(stride + want.shape[1],))
    out = np.ndarray(want.shape, np.float32, buffer=backing, strides=(stride * 4, 4))
    emulate.kpool_index_logits_fp8(*case.args, kpool=1, out=out, validate=False)
    np.testing.assert_array_equal(np.asarray(backing[stride : stride + want.shape[1]]), want[1])
    np.testing.assert_array_equal(np.asarray(backing[: want.shape[1]]), want[0])
