"""The 16-byte access path: taken wherever alignment allows it, never where it does not.

On a GPU the first half is speed and the second a misaligned-address fault.
The emulator counts every 16-byte load and store of a launch and aborts on a
misaligned one, so both halves are checked here, for every op that uses it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from model import BF16

from kpool_cupy import emulate
from kpool_cupy.emulator.launch import recording

ROOT = Path(__file__).resolve().parent.parent
HEAD_DIM, KPOOL = 16, 3
LANES = HEAD_DIM // 8  # threads per pool or request, 8 channels each


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths, cached = [7, 0, 5, 2, 9], [2, 4, 0, 1, 6]
    k = rng.standard_normal((sum(lengths), HEAD_DIM)).astype(BF16)
    gate = (3 * rng.standard_normal((sum(lengths), HEAD_DIM))).astype(BF16)
    ape = rng.standard_normal((KPOOL, HEAD_DIM)).astype(np.float32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tail = rng.standard_normal((len(lengths), 2, KPOOL, HEAD_DIM)).astype(BF16)
    slots = np.arange(len(lengths), dtype=np.int32)
    return k, gate, ape, offsets, np.asarray(cached, np.int32), tail, slots


def _accesses(launches) -> int:
    (launch,) = launches
    return launch.vector_accesses


# With bf16 keys, 8 channels are one 16-byte vector of k, one of gate, one
# of a ring row and one of a pooled row; 8 float32 ape channels are two. A
# pool of KPOOL members costs each thread KPOOL * (1 + 1 + 2) loads and one
# store, a copied token one load and one store of its key and of its gate.
PER_POOL = LANES * (4 * KPOOL + 1)
PER_TOKEN = LANES * 4


def test_compress_takes_the_16_byte_path_for_every_operand():
    k, gate, ape, offsets, cached, _, _ = _inputs()
    with recording() as launches:
        pooled = emulate.kpool_compress(k, gate, ape, offsets, cached)
    assert _accesses(launches) == pooled.shape[0] * PER_POOL > 0


def test_ring_close_takes_the_16_byte_path_for_every_operand():
    k, gate, ape, offsets, cached, tail, slots = _inputs()
    with recording() as launches:
        _, closed = emulate.kpool_ring_close(tail, k, gate, ape, offsets, cached, slots)
    assert _accesses(launches) == int((closed >= 0).sum()) * PER_POOL > 0


def test_seed_tail_takes_the_16_byte_path_for_every_operand():
    k, gate, _, offsets, cached, tail, slots = _inputs()
    stashed = int(np.minimum(np.diff(offsets), tail.shape[2]).sum())  # each request's last min(n, ring) tokens
    with recording() as launches:
        emulate.kpool_seed_tail(tail, k, gate, offsets, cached, slots)
    assert _accesses(launches) == stashed * PER_TOKEN > 0


def test_tail_update_takes_the_16_byte_path_for_every_operand():
    _, _, ape, _, _, tail, slots = _inputs()
    rng = np.random.default_rng(3)
    step_k = rng.standard_normal((5, 2, HEAD_DIM)).astype(BF16)
    step_gate = rng.standard_normal((5, 2, HEAD_DIM)).astype(BF16)
    positions = np.array([[4, 5], [8, -1], [-1, -1], [0, 1], [11, 12]], np.int32)
    with recording() as launches:
        _, closed = emulate.kpool_tail_update(tail, step_k, step_gate, ape, positions, slots)
    # Every token's key and gate are loaded, padding too (the loads do not
    # wait for its position); only a real token's are stored in the ring.
    padding = int((positions < 0).sum())
    expected = int((positions >= 0).sum()) * PER_TOKEN + padding * PER_TOKEN // 2 + int((closed >= 0).sum()) * PER_POOL
    assert _accesses(launches) == expected > 0


# Every op that may use 16-byte access, handed each such operand as a view
# whose base is one element off alignment ("shifted") or whose rows sit at a
# stride that is not a multiple of 16 bytes ("padded"; for a decode step's
# [R, next_n, D] tokens also each of the two outer strides alone). An alignment check
# that answers "aligned" regardless makes the emulator abort, as the GPU
# would fault; a right one gives the bits of the same call on aligned copies.
_MISALIGNED = textwrap.dedent(
    """
    import sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    from test_vector_access import _inputs
    from kpool_cupy import emulate
    from kpool_cupy.emulator.launch import recording

    def shifted(a):
        raw = np.zeros(a.nbytes + 64, np.uint8)
        start = (-raw.ctypes.data) % 16 + a.itemsize
        view = raw[start : start + a.nbytes].view(a.dtype).reshape(a.shape)
        view[...] = a
        return view

    def padded(a):
        view = np.zeros((*a.shape[:-1], a.shape[-1] + 1), a.dtype)[..., : a.shape[-1]]
        view[...] = a
        return view

    def token_stride_odd(a):  # [R, n, D]: request stride aligned (8 tokens of D + 1), token stride not
        view = np.zeros((a.shape[0], 8, a.shape[2] + 1), a.dtype)[:, : a.shape[1], : a.shape[2]]
        view[...] = a
        return view

    def request_stride_odd(a):  # [R, n, D]: token stride aligned, request stride one element more
        rows = np.zeros((a.shape[0], a.shape[1] * a.shape[2] + 1), a.dtype)
        view = rows[:, : a.shape[1] * a.shape[2]].reshape(a.shape)
        assert view.base is not None and view.strides[1] % 16 == 0 and view.strides[0] % 16 != 0
        view[...] = a
        return view

    k, gate, ape, offsets, cached, tail, slots = _inputs()
    rng = np.random.default_rng(3)
    step = dict(
        k=rng.standard_normal((5, 2, 16)).astype(k.dtype),
        gate=rng.standard_normal((5, 2, 16)).astype(k.dtype),
        positions=np.array([[4, 5], [8, -1], [-1, -1], [0, 1], [11, 12]], np.int32),
    )
    pools = emulate.kpool_compress(k, gate, ape, offsets, cached).shape[0]
    ops = {{
        "compress": (emulate.kpool_compress, dict(k=k, gate=gate, ape=ape, input_row_offsets=offsets,
                      cache_lengths=cached, out=np.zeros((pools, 16), k.dtype)), ["k", "gate", "ape", "out"]),
        "ring_close": (emulate.kpool_ring_close, dict(tail=tail, k=k, gate=gate, ape=ape, input_row_offsets=offsets,
                        cache_lengths=cached, slot_idx=slots, out=np.zeros((5, 16), k.dtype)),
                       ["tail", "k", "gate", "ape", "out"]),
        "seed_tail": (emulate.kpool_seed_tail, dict(tail=tail, k=k, gate=gate, input_row_offsets=offsets,
                       cache_lengths=cached, slot_idx=slots), ["tail", "k", "gate"]),
        "tail_update": (emulate.kpool_tail_update, dict(tail=tail, ape=ape, slot_idx=slots,
                         out=np.zeros((5, 1, 16), k.dtype), **step), ["tail", "k", "gate", "ape", "out"]),
    }}
    # Operands an op requires C-contiguous can only be shifted.
    contiguous = {{"compress": (), "ring_close": ("tail",), "seed_tail": ("tail",), "tail_update": ("tail", "out")}}
    checked = 0
    for op, (function, arguments, operands) in ops.items():
        def run(arguments, fresh=None):
            # Fresh copies of what the op writes, but for `fresh`: a view shifted or padded just now.
            arguments = {{n: a.copy() if n in ("tail", "out") and n != fresh else a for n, a in arguments.items()}}
            with recording() as launches:
                result = function(**arguments)
            written = [a for n, a in arguments.items() if n in ("tail", "out")]
            return result, written, launches[0].vector_accesses

        want, want_written, aligned = run(arguments)
        for name in operands:
            three_d = arguments[name].ndim == 3 and name not in contiguous[op]
            for make in (shifted, padded, token_stride_odd, request_stride_odd):
                if make is not shifted and name in contiguous[op]:
                    continue
                if make in (token_stride_odd, request_stride_odd) and not three_d:
                    continue
                changed = dict(arguments)
                changed[name] = make(arguments[name])
                got, got_written, accesses = run(changed, fresh=name)
                results = (got if isinstance(got, tuple) else (got,)) if got is not None else ()
                wanted = (want if isinstance(want, tuple) else (want,)) if want is not None else ()
                for a, b in zip([*got_written, *results], [*want_written, *wanted], strict=True):
                    same = np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
                    assert same, (op, name, make.__name__)
                assert accesses < aligned, (op, name, make.__name__, accesses, aligned)
                checked += 1
    print("checked", checked)
    """
)


@pytest.mark.slow
def test_misaligned_and_odd_stride_views_never_take_the_16_byte_path():
    script = _MISALIGNED.format(tests=str(ROOT / "tests"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "checked 34" in done.stdout, done.stdout
