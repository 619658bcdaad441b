"""Arrays whose first element sits between elements are refused, naming the argument (a hostile round).

Every kernel loads an element at its natural alignment at least. A view that
starts a byte into a buffer (``buf[1:].view(bfloat16)``) passed every check:
the emulator then made misaligned loads (undefined in its C++; UBSan saw them)
and a GPU would fault with a misaligned address. The check reads metadata only.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from kpool_cupy import emulate, reference
from kpool_cupy.ops import OPS
from kpool_cupy.ops.framework.examples import example_batch, named

BACKENDS = {"emulate": emulate, "reference": reference}


def _misaligned(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` whose first element starts one byte past an aligned address."""
    buffer = np.zeros(array.nbytes + array.itemsize, np.uint8)
    start = (-buffer.ctypes.data) % array.itemsize + 1  # one byte past the first aligned address
    moved = buffer[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    moved[...] = array
    return moved


def _cases():
    """(op, argument, the name the error gives, the call with that argument moved) for every argument of each
    op's example call whose elements are wider than a byte."""
    batch = example_batch(split=True)  # a split ring: its two arrays are named tail[0] and tail[1]
    for spec in OPS:
        call = named(spec.operand_names, spec.example(batch))
        for name, value in call.items():
            parts = value if isinstance(value, tuple) else (value,)
            for i, part in enumerate(parts):
                if not isinstance(part, np.ndarray) or part.itemsize == 1 or not part.size:
                    continue
                moved = _misaligned(part)
                given = (
                    tuple(moved if j == i else p for j, p in enumerate(parts)) if isinstance(value, tuple) else moved
                )
                shown = f"{name}[{i}]" if isinstance(value, tuple) else name
                yield spec.name, name, shown, {**call, name: given}


CASES = list(_cases())


def test_every_op_has_arguments_to_move():
    assert {op for op, *_ in CASES} == {spec.name for spec in OPS}
    assert len(CASES) > 3 * len(OPS)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize(("op", "argument", "shown", "call"), CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_a_misaligned_argument_is_refused_by_name(backend, op, argument, shown, call):
    wanted = f"Invalid {shown}: expected a first element at a multiple of "
    with pytest.raises(ValueError, match="^" + re.escape(wanted) + r"\d+ bytes \(its element size\), got address 0x"):
        getattr(BACKENDS[backend], op)(**call)


def test_an_aligned_view_into_a_byte_buffer_is_taken():
    # The check is the address, not where the array came from: a view at an aligned offset runs.
    batch = example_batch()
    spec = next(s for s in OPS if s.name == "kpool_compress")
    call = named(spec.operand_names, spec.example(batch))
    k = call["k"]
    buffer = np.zeros(k.nbytes + 16, np.uint8)
    start = (-buffer.ctypes.data) % 16
    call["k"] = buffer[start : start + k.nbytes].view(k.dtype).reshape(k.shape)
    call["k"][...] = k
    want = reference.kpool_compress(**{**call, "k": k})
    for backend in BACKENDS.values():
        assert np.array_equal(
            np.asarray(backend.kpool_compress(**call)).view(np.uint8), np.asarray(want).view(np.uint8)
        )
