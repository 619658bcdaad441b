"""Findings of the hostile test of issue 9, each pinned on every CPU backend.

Each test names the finding it covers; each failed before its fix.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
from model import BF16, F32

import kpool_cupy
from kpool_cupy import emulate, reference
from kpool_cupy.ops import OPS
from kpool_cupy.ops.framework.examples import example_batch, named

BACKENDS = {"emulate": emulate, "reference": reference}


def _rows(tokens: int, head_dim: int = 16, dtype=BF16, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((tokens, head_dim)).astype(dtype)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize(
    ("index_dtype", "cache"),
    [(np.int32, 2**31 - 2), (np.uint32, 2**32 - 2)],
    ids=["int32", "uint32"],
)
def test_repeated_slot_check_does_not_wrap_near_the_index_limit(backend, index_dtype, cache):
    # Finding 2: cache + tokens summed in the caller's dtype wrapped past its
    # limit, so two requests stashing into slot 0 passed the check.
    k = _rows(4)
    tail = np.zeros((2, 2, 3, 16), BF16)
    offsets = np.array([0, 2, 4], index_dtype)
    lengths = np.array([cache, cache], index_dtype)
    with pytest.raises(ValueError, match=r"^Invalid slot_idx: expected one slot per request that writes the ring"):
        BACKENDS[backend].kpool_seed_tail(tail, k, k, offsets, lengths, np.array([0, 0], np.int32))


@pytest.mark.parametrize("cache", [2**63 - 1, 2**63 - 3, 2**62])
def test_reference_seed_tail_at_the_int64_limit_writes_what_the_kernel_writes(cache):
    # Finding 3: unvalidated, a cache length near 2^63 must neither raise nor
    # write anywhere but where the emulated kernel writes (nothing, here).
    k = _rows(7, seed=1)
    rings = {name: np.zeros((2, 2, 3, 16), BF16) for name in BACKENDS}
    for name, module in BACKENDS.items():
        module.kpool_seed_tail(
            rings[name], k, k, np.array([0, 7], np.int64), np.array([cache], np.int64), np.array([1], np.int32),
            validate=False,
        )  # fmt: skip
    assert rings["emulate"].tobytes() == rings["reference"].tobytes()


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_expand_kpool_is_bounded_like_every_other_kpool(backend):
    # Finding 4: kpool = 2^31 reached the C++ compiler or a 16 GiB allocation.
    ids = np.zeros((4, 2), np.int32)
    with pytest.raises(ValueError, match=r"^Invalid kpool: expected an integer in \[1, 1024\]"):
        BACKENDS[backend].kpool_expand_topk(ids, np.array([0, 4], np.int32), np.array([0], np.int32), kpool=2**31)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")  # made on purpose here
@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("kind", ["masked", "matrix"])
def test_array_subclasses_that_change_meaning_are_refused(backend, kind):
    # Finding 6: a mask was silently ignored on one backend and crashed the other.
    k = _rows(8, dtype=F32)
    bad = np.ma.masked_array(k, mask=k > 0) if kind == "masked" else np.asmatrix(k)
    ape = np.zeros((4, 16), np.float32)
    with pytest.raises(TypeError, match=r"^Invalid gate: expected a plain array"):
        BACKENDS[backend].kpool_compress(k, bad, ape, np.array([0, 8], np.int32), np.array([0], np.int32))
    tail = np.zeros((1, 2, 4, 16), np.float32)
    with pytest.raises(TypeError, match=r"^Invalid k: expected a plain array"):
        BACKENDS[backend].kpool_seed_tail(
            tail, bad, k, np.array([0, 8], np.int32), np.array([0], np.int32), np.array([0], np.int32)
        )


def test_a_memory_map_is_still_an_array(tmp_path):
    # The subclass rule must not refuse np.memmap (tests/test_large_indices.py relies on it).
    k = np.memmap(tmp_path / "k.bin", dtype=np.float32, mode="w+", shape=(8, 16))
    k[:] = _rows(8, dtype=F32)
    ape = np.zeros((4, 16), np.float32)
    for module in BACKENDS.values():
        assert module.kpool_compress(k, k, ape, np.array([0, 8], np.int32), np.array([0], np.int32)).shape == (2, 16)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_kpool_one_follows_the_nan_policy(backend):
    # Finding 9: with one member the kernel never read the logit, so a NaN
    # gate gave the key instead of NaN.
    k = _rows(3, dtype=F32) + 2
    gate = np.zeros((3, 16), np.float32)
    gate[1, 5] = np.nan
    pooled = BACKENDS[backend].kpool_compress(
        k, gate, np.zeros((1, 16), np.float32), np.array([0, 3], np.int32), np.array([0], np.int32)
    )
    assert np.isnan(pooled[1, 5])
    assert np.array_equal(np.isnan(pooled), np.isnan(gate))  # nothing else turns NaN
    np.testing.assert_array_equal(pooled[~np.isnan(gate)], k[~np.isnan(gate)])  # kpool 1 is the identity


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("index_dtype", [np.uint32, np.int64])
def test_every_index_array_takes_every_index_dtype(backend, index_dtype):
    # Finding 14: slot_idx and positions refused int64, NumPy's default integer.
    module = BACKENDS[backend]
    step = _rows(4, seed=2).reshape(2, 2, 16)
    ape = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
    positions = np.array([[6, 7], [2, 3]])
    want_ring = np.zeros((2, 2, 4, 16), BF16)
    want = module.kpool_tail_update(want_ring, step, step, ape, positions.astype(np.int32), np.array([1, 0], np.int32))
    ring = np.zeros((2, 2, 4, 16), BF16)
    got = module.kpool_tail_update(ring, step, step, ape, positions.astype(index_dtype), np.array([1, 0], index_dtype))
    assert ring.tobytes() == want_ring.tobytes()
    for a, b in zip(got, want, strict=True):
        assert a.tobytes() == b.tobytes()
    ids = np.array([[0, 1], [2, 3]], index_dtype)
    expanded = module.kpool_expand_topk(ids, np.array([0, 2], np.int32), np.array([0], np.int32), kpool=4)
    np.testing.assert_array_equal(expanded, [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]])


@pytest.mark.parametrize("bad", [[0, 4], (0, 4), None, "0,4"], ids=["list", "tuple", "none", "str"])
def test_pool_row_offsets_gives_its_own_error_for_non_arrays(bad):
    # Finding 14: a list got "expected dtype ..., got <class 'list'>" and a
    # torch tensor NumPy's raw error.
    with pytest.raises(TypeError, match=r"^Invalid input_row_offsets: expected a NumPy or CuPy array, got builtins\."):
        kpool_cupy.pool_row_offsets(bad, np.array([0], np.int32), 4)


@pytest.mark.parametrize("module", [kpool_cupy, emulate, reference], ids=lambda m: m.__name__)
def test_namespace_holds_only_the_documented_api(module):
    # Finding 14: importlib's `version` (and `annotations`) leaked into kpool_cupy.
    extra = {n for n in dir(module) if not n.startswith("_")} - set(module.__all__)
    assert all(isinstance(getattr(module, n), types.ModuleType) for n in extra), sorted(extra)


LIMITS = [(np.int32, 2**31 - 1), (np.uint32, 2**32 - 1), (np.int64, 2**62 - 1)]  # 2^62 - 1: the largest valid cache


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize(("index_dtype", "limit"), LIMITS, ids=["int32", "uint32", "int64"])
def test_caches_at_each_index_limit_pool_like_their_residue(backend, index_dtype, limit):
    # Finding 2, for every op that reads a cache length: near the limit of
    # the caller's index dtype, only c mod kpool matters to which tokens form
    # pools and where they sit in the ring, so a huge cache must give the
    # bytes its residue gives. Any sum done in the caller's dtype would wrap.
    module, kpool = BACKENDS[backend], 4
    k, gate = _rows(9, seed=4), _rows(9, seed=5)
    ape = np.random.default_rng(6).standard_normal((kpool, 16)).astype(np.float32)
    offsets = np.array([0, 4, 9], index_dtype)
    big = np.array([limit - 6, limit - 4], index_dtype)  # both end past the int32/uint32 limit when it is theirs
    small = (big.astype(object) % kpool).astype(index_dtype)
    assert module.kpool_compress(k, gate, ape, offsets, big).tobytes() == (
        module.kpool_compress(k, gate, ape, offsets, small).tobytes()
    )
    rings = []
    for cache in (big, small):
        ring = np.zeros((2, 2, kpool, 16), BF16)
        module.kpool_seed_tail(ring, k, gate, offsets, cache, np.array([1, 0], index_dtype))
        rings.append(ring.tobytes())
    assert rings[0] == rings[1]
    ring = np.random.default_rng(7).standard_normal((2, 2, kpool, 16)).astype(BF16)
    if index_dtype is np.int64:  # pool ids past int32 are refused by name
        with pytest.raises(ValueError, match=r"^Invalid cache_lengths: expected pool ids c // kpool"):
            module.kpool_ring_close(ring, k, gate, ape, offsets, big, np.array([0, 1], np.int32))
        return
    pooled, closed = module.kpool_ring_close(ring, k, gate, ape, offsets, big, np.array([0, 1], np.int32))
    want_pooled, _ = module.kpool_ring_close(ring, k, gate, ape, offsets, small, np.array([0, 1], np.int32))
    assert closed.tolist() == [int(c) // kpool for c in big.tolist()]  # the ids themselves, not the residue's
    assert pooled.tobytes() == want_pooled.tobytes()


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_the_host_array_hint_names_the_op_called(backend):
    # Issue 36's hostile round: every op's host-array error sent the caller to kpool_cupy.kpool_compress.
    offsets, lengths = np.array([0, 2], np.int32), np.array([0], np.int32)
    with pytest.raises(TypeError, match=r"^Invalid logits: .*\(device arrays go to kpool_cupy\.kpool_index_topk\)$"):
        BACKENDS[backend].kpool_index_topk(_CudaArray(), offsets, lengths, kpool=2, pool_topk=1)
    # A list is no device array: the hint says how to make the NumPy array the backend takes.
    with pytest.raises(TypeError, match=r"^Invalid logits: .*got builtins\.list \(numpy\.asarray\(x\) makes one\)$"):
        BACKENDS[backend].kpool_index_topk([[0.0, 1.0]] * 2, offsets, lengths, kpool=2, pool_topk=1)


class _CudaArray:
    """Stands for a CUDA array of any framework: all a CPU backend reads of it is its DLPack device."""

    def __dlpack__(self, **kwargs):
        raise AssertionError("a CPU backend must not import a device array")

    def __dlpack_device__(self):
        return (2, 0)


class _NoIndexing(np.ndarray):
    """A subclass whose indexing fails: the reference indexed it, the emulator read its buffer."""

    def __getitem__(self, item):
        raise IndexError("the subclass's own indexing")


class _Doubling(np.ndarray):
    """A subclass whose ufuncs double it: the reference computed with them, the emulator read the bare bytes."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        inputs = tuple(np.asarray(i) * 2 if isinstance(i, _Doubling) else i for i in inputs)
        return getattr(ufunc, method)(*inputs, **kwargs)


@pytest.mark.parametrize("subclass", [_NoIndexing, _Doubling])
def test_an_ndarray_subclass_is_read_as_its_bare_buffer_on_both_backends(subclass):
    # A hostile round on array forms: the two backends disagreed (or the reference raised the subclass's own
    # error) for any subclass but a masked array or a matrix, which are refused. An output of a subclass comes
    # back as the caller's array, written in place.
    k, gate = _rows(12, dtype=F32), _rows(12, dtype=F32, seed=1)
    ape, offsets, cached = np.zeros((4, 16), np.float32), np.array([0, 12], np.int32), np.array([0], np.int32)
    for backend in BACKENDS.values():
        want = backend.kpool_compress(k, gate, ape, offsets, cached)  # each backend's own bits for plain arrays
        got = backend.kpool_compress(k.view(subclass), gate.view(subclass), ape.view(subclass), offsets, cached)
        assert type(got) is np.ndarray and np.array_equal(got, want)
        out = np.full(want.shape, 7, np.float32).view(subclass)
        assert backend.kpool_compress(k, gate, ape, offsets, cached, out=out) is out
        assert np.array_equal(out.view(np.ndarray), want)
    # A split ring's two arrays, as a tuple or a list (a review found the list passed on as subclasses).
    spec = next(s for s in OPS if s.name == "kpool_ring_close")
    call = named(spec.operand_names, spec.example(example_batch(split=True)))
    for backend in BACKENDS.values():
        want = backend.kpool_ring_close(**{n: v.copy() if isinstance(v, np.ndarray) else v for n, v in call.items()})
        for pair in (tuple, list):
            given = {n: v.copy() if isinstance(v, np.ndarray) else v for n, v in call.items()}
            given["tail"] = pair(a.copy().view(subclass) for a in call["tail"])
            got = backend.kpool_ring_close(**given)
            assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    # The scorer's weights (the round's case: doubled logits on the reference, none on the emulator).
    spec = next(s for s in OPS if s.name == "kpool_index_logits_fp8")
    args, kwargs = spec.example(example_batch())
    for backend in BACKENDS.values():
        want = backend.kpool_index_logits_fp8(*args, **kwargs)
        moved = [a.view(subclass) if a is args[1] else a for a in args]
        assert np.array_equal(backend.kpool_index_logits_fp8(*moved, **kwargs), want)
