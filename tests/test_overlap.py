"""Outputs that share memory with an input or another output are refused (issue 9, finding 1).

A kernel that writes bytes it, or another thread, also reads gives results
that depend on thread order: the emulator and the reference then disagree,
and a GPU would race. The check reads only array metadata (pointers, shapes,
strides), so it holds with validate=False and costs no device sync.
"""

from __future__ import annotations

import numpy as np
import pytest
from model import F32

from kpool_cupy import emulate, reference
from kpool_cupy.ops.framework.checks import shares_memory

BACKENDS = {"emulate": emulate, "reference": reference}
HEAD_DIM, KPOOL = 16, 4


def _tokens(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, HEAD_DIM)).astype(F32)


def _index(*values: int) -> np.ndarray:
    return np.array(values, np.int32)


def _compress(k, gate, out) -> dict:
    ape = np.random.default_rng(9).standard_normal((KPOOL, HEAD_DIM)).astype(np.float32)
    return dict(k=k, gate=gate, ape=ape, input_row_offsets=_index(0, 12), cache_lengths=_index(0), out=out)


def _ring_call(function: str, tail: np.ndarray, **changes) -> dict:
    k = _tokens(8, seed=1)
    ape = np.random.default_rng(2).standard_normal((KPOOL, HEAD_DIM)).astype(np.float32)
    calls = {
        "ring_close": dict(tail=tail, k=k, gate=k.copy(), ape=ape, input_row_offsets=_index(0, 4, 8),
                           cache_lengths=_index(2, 5), slot_idx=_index(0, 1)),
        "seed_tail": dict(tail=tail, k=k, gate=k.copy(), input_row_offsets=_index(0, 4, 8),
                          cache_lengths=_index(2, 5), slot_idx=_index(0, 1)),
        "tail_update": dict(tail=tail, k=k.reshape(2, 4, HEAD_DIM), gate=k.copy().reshape(2, 4, HEAD_DIM), ape=ape,
                            positions=np.array([[4, 5, 6, 7], [8, 9, -1, -1]], np.int32), slot_idx=_index(0, 1)),
    }  # fmt: skip
    return {**calls[function], **changes}


def _overlapping_cases():
    """(function, arguments, the two names the error must give), one per way an output can alias."""
    k = _tokens(12)
    gate = _tokens(12, seed=3)
    yield "compress", _compress(k, gate, k[:3]), ("out", "k")
    yield "compress", _compress(k, gate, gate[2:5]), ("out", "gate")
    ape_rows = np.zeros((2 + KPOOL, HEAD_DIM), np.float32)
    call = _compress(k, gate, ape_rows[:3])
    call["ape"] = ape_rows[2:]  # out's last row is ape's first
    yield "compress", call, ("out", "ape")
    offsets_out = np.zeros((3, HEAD_DIM), np.float32)
    call = _compress(k, gate, offsets_out)
    call["input_row_offsets"] = offsets_out.reshape(-1).view(np.int32)[:2]
    call["input_row_offsets"][:] = (0, 12)
    yield "compress", call, ("out", "input_row_offsets")

    tail = np.zeros((2, 2, KPOOL, HEAD_DIM), np.float32)
    out = np.zeros((2, HEAD_DIM), np.float32)
    yield (
        "ring_close",
        _ring_call("ring_close", tail, out=out, closed=out.reshape(-1).view(np.int32)[:2]),
        (
            "out",
            "closed",
        ),
    )
    yield "ring_close", _ring_call("ring_close", tail, out=tail.reshape(-1, HEAD_DIM)[:2]), ("out", "tail")
    ring = np.zeros((2, 2, KPOOL, HEAD_DIM), np.float32)
    shared_k = ring.reshape(-1, HEAD_DIM)[:8]
    yield "seed_tail", _ring_call("seed_tail", ring, k=shared_k, gate=shared_k.copy()), ("tail", "k")
    ring = np.zeros((2, 2, KPOOL, HEAD_DIM), np.float32)
    in_ring = ring.reshape(-1, HEAD_DIM)[:2].reshape(2, 1, HEAD_DIM)
    yield "tail_update", _ring_call("tail_update", ring, out=in_ring), ("tail", "out")
    ring = np.zeros((2, 2, KPOOL, HEAD_DIM), np.float32)
    out = np.zeros((2, 1, HEAD_DIM), np.float32)
    closed = out.reshape(-1).view(np.int32)[:2].reshape(2, 1)
    yield "tail_update", _ring_call("tail_update", ring, out=out, closed=closed), ("out", "closed")


CASES = list(_overlapping_cases())


@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize(("function", "arguments", "names"), CASES, ids=[f"{c[0]}-{'-'.join(c[2])}" for c in CASES])
def test_an_output_sharing_memory_is_refused_naming_both(backend, function, arguments, names, validate):
    written, other = names
    pattern = (
        rf"^Invalid {written}: expected memory that {other} does not use, got an array sharing bytes with {other}$"
    )
    with pytest.raises(ValueError, match=pattern):
        getattr(BACKENDS[backend], f"kpool_{function}")(**arguments, validate=validate)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_disjoint_column_slices_of_one_buffer_are_accepted(backend):
    # The fused projection: k, gate and the pooled keys side by side in one
    # [tokens, 3 * head_dim] buffer share extents but no byte.
    fused = np.zeros((12, 3 * HEAD_DIM), np.float32)
    fused[:, :HEAD_DIM], fused[:, HEAD_DIM : 2 * HEAD_DIM] = _tokens(12), _tokens(12, seed=3)
    k, gate, out = fused[:, :HEAD_DIM], fused[:, HEAD_DIM : 2 * HEAD_DIM], fused[:3, 2 * HEAD_DIM :]
    module = BACKENDS[backend]
    got = module.kpool_compress(**_compress(k, gate, out))
    want = module.kpool_compress(**_compress(k.copy(), gate.copy(), np.zeros((3, HEAD_DIM), np.float32)))
    assert got.tobytes() == want.tobytes()
    np.testing.assert_array_equal(fused[:, :HEAD_DIM], _tokens(12))  # the inputs were not touched


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [
        (np.s_[:, 0:4], np.s_[:, 4:8], False),  # neighbouring columns
        (np.s_[:, 0:5], np.s_[:, 4:8], True),  # one column in common
        (np.s_[0:2, 4:8], np.s_[2:4, 0:4], False),  # past each other's rows
        (np.s_[1:3, 6:8], np.s_[2:4, 0:2], False),  # rows in common, columns apart
        (np.s_[::-1, 0:4], np.s_[:, 2:6], True),  # a negative row stride is understood
        (np.s_[0:0, :], np.s_[:, :], False),  # nothing shares with an empty array
    ],
)
def test_the_extent_rule(a, b, shared):
    buffer = np.zeros((4, 8), np.float32)
    assert shares_memory(buffer[a], buffer[b]) is shared
    assert np.shares_memory(buffer[a], buffer[b]) is shared  # NumPy's exact answer agrees


@pytest.mark.gpu
def test_device_views_that_alias_are_refused_on_the_gpu_path():
    import cupy

    import kpool_cupy

    k = cupy.asarray(_tokens(12))
    with pytest.raises(ValueError, match=r"^Invalid out: expected memory that k does not use"):
        kpool_cupy.kpool_compress(**{n: cupy.asarray(v) for n, v in _compress(k, k, None).items() if v is not None},
                                  out=k[:3], validate=False)  # fmt: skip
    ring = cupy.zeros((2, 2, KPOOL, HEAD_DIM), cupy.float32)
    call = {n: cupy.asarray(v) for n, v in _ring_call("tail_update", ring).items()}
    with pytest.raises(ValueError, match=r"^Invalid tail: expected memory that out does not use"):
        kpool_cupy.kpool_tail_update(**call, out=ring.reshape(-1, HEAD_DIM)[:2].reshape(2, 1, HEAD_DIM))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("function", ["ring_close", "seed_tail", "tail_update"])
def test_a_split_ring_of_one_buffers_interleaved_halves_is_accepted_and_equals_separate_rings(backend, function):
    # [slots, ring, 2, D]: keys at [:, :, 0], gate scores at [:, :, 1]. The
    # two halves span the same extent but share no byte; they were refused.
    buffer = np.random.default_rng(5).standard_normal((2, KPOOL, 2, HEAD_DIM)).astype(F32)
    apart = (buffer[:, :, 0].copy(), buffer[:, :, 1].copy())
    module = getattr(BACKENDS[backend], f"kpool_{function}")
    got = module(**_ring_call(function, (buffer[:, :, 0], buffer[:, :, 1])))
    want = module(**_ring_call(function, apart))
    for g, w in zip(got or (), want or (), strict=True):
        assert g.tobytes() == w.tobytes()
    assert buffer[:, :, 0].tobytes() == apart[0].tobytes() and buffer[:, :, 1].tobytes() == apart[1].tobytes()


def _views(rng, buffer):
    """A random view of ``buffer`` as the ops take arrays: up to three outer dims at any strides (negative
    ones too), the last dim contiguous."""
    flat = buffer.reshape(-1)
    width = int(rng.integers(1, 5))
    outer = [int(rng.integers(1, 4)) for _ in range(int(rng.integers(1, 4)))]
    strides = [int(rng.integers(-24, 25)) for _ in outer]
    span = sum(abs(s) * (n - 1) for s, n in zip(strides, outer, strict=True))
    start = int(rng.integers(span, flat.size - width - span)) if flat.size - width - span > span else None
    if start is None:
        return None
    item = flat.itemsize
    return np.lib.stride_tricks.as_strided(
        flat[start:], (*outer, width), (*(s * item for s in strides), item), writeable=False
    )


def test_the_overlap_rule_is_exact_on_random_strided_views():
    # Against the bytes each view really covers: no false refusal, no missed overlap.
    rng = np.random.default_rng(11)
    buffer = np.zeros(400, np.int16)
    checked = shared = 0
    while checked < 600:
        a, b = _views(rng, buffer), _views(rng, buffer)
        if a is None or b is None:
            continue
        base = buffer.ctypes.data
        covers = []
        for view in (a, b):
            mask = np.zeros(buffer.nbytes, bool)
            for index in np.ndindex(view.shape):
                address = view.ctypes.data + sum(i * s for i, s in zip(index, view.strides, strict=True)) - base
                mask[address : address + view.itemsize] = True
            covers.append(mask)
        truth = bool((covers[0] & covers[1]).any())
        assert shares_memory(a, b) is truth, (a.shape, a.strides, b.shape, b.strides)
        checked += 1
        shared += truth
    assert shared >= 30 and checked - shared >= 30  # both answers were asked for, many times


def test_a_huge_layout_is_settled_without_touching_its_elements():
    # The rule reads addresses, shapes and strides: 2^40 bytes of interleaved
    # halves (never allocated) are settled like four rows are.
    from kpool_cupy.ops.framework.checks import _address_view  # noqa: F401  (the solver's input)

    class Fake:
        def __init__(self, offset):
            slots, ring, head_dim = 2**20, 2**10, 256
            self.shape, self.dtype, self.size = (slots, ring, head_dim), np.dtype(np.float16), slots * ring * head_dim
            self.strides = (ring * 2 * head_dim * 2, 2 * head_dim * 2, 2)
            self.ctypes = type("C", (), {"data": 2**44 + offset})()

    assert shares_memory(Fake(0), Fake(512)) is False  # the other half of each row pair
    assert shares_memory(Fake(0), Fake(2)) is True  # one element on
