"""The argument codes are spelled once in kernels/kpool_common.cuh and mirrored once in Python."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kpool_cupy.kernel import codes
from kpool_cupy.kernel.sources import kernels_dir

_ENUM = re.compile(r"enum\s+(\w+)\s*:\s*int\s*\{([^}]*)\}")


def _header_enums() -> dict[str, dict[str, int]]:
    text = (kernels_dir() / "kpool_common.cuh").read_text()
    enums = {}
    for name, body in _ENUM.findall(text):
        entries = [entry.split("=") for entry in body.split(",") if entry.strip()]
        enums[name] = {key.strip(): int(value) for key, value in entries}
    return enums


@pytest.mark.parametrize(("enum", "prefix"), [(codes.IndexKind, "kIndex"), (codes.VectorAccess, "kVector")])
def test_python_mirror_equals_the_header(enum, prefix):
    header = _header_enums()[enum.__name__]
    assert {key.removeprefix(prefix).upper(): value for key, value in header.items()} == {
        member.name: int(member.value) for member in enum
    }


def test_every_index_dtype_has_a_kind():
    assert {np.dtype(d) for d in (np.int32, np.uint32, np.int64)} == set(codes.INDEX_KINDS)


def test_vector_access_needs_the_base_and_every_stepped_stride_aligned():
    buffer = np.zeros((4, 40), np.float32)  # rows of 160 bytes
    assert codes.allows_vector_access(buffer[:, :16])
    assert not codes.allows_vector_access(buffer[:, 1:17])  # base 4 bytes off
    assert not codes.allows_vector_access(np.zeros((4, 41), np.float32)[:, :16])  # rows of 164 bytes
    assert codes.allows_vector_access(np.zeros((1, 41), np.float32)[:, :16])  # one row: its stride is never stepped
    steps = np.zeros((2, 3, 20), np.float32)[:, :, :16]  # 3-D: both outer strides are stepped
    assert codes.allows_vector_access(steps)
    assert not codes.allows_vector_access(np.zeros((2, 3, 17), np.float32)[:, :, :16])
