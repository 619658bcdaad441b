"""The VECTOR bits are spelled once in kernels/kpool_common.cuh and mirrored once in Python; index types are named
once."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kpool_cupy.kernel import codes
from kpool_cupy.kernel.declarations import KERNELS, Kernel
from kpool_cupy.kernel.geometry import (
    APE_COLUMNS,
    APE_SLICES,
    EXPAND_SPAN,
    EXPAND_THREADS,
    MAX_HEAD_DIM,
    STREAM_BYTES,
    TARGET_THREADS_PER_BLOCK,
    WHOLE_POOL_BYTES,
    expand_geometry,
    group_block_bound,
    group_geometry,
)
from kpool_cupy.kernel.sources import kernels_dir

_ENUM = re.compile(r"enum\s+(\w+)\s*:\s*int\s*\{([^}]*)\}")


def _header_enums() -> dict[str, dict[str, int]]:
    text = "".join((kernels_dir() / name).read_text() for name in ("kpool_common.cuh", "kpool_fp8.cuh"))
    enums = {}
    for name, body in _ENUM.findall(text):
        entries = [entry.split("=") for entry in body.split(",") if entry.strip()]
        enums[name] = {key.strip(): int(value) for key, value in entries}
    return enums


def test_python_mirror_equals_the_header():
    header = _header_enums()["VectorAccess"]
    spelled = {re.sub(r"(?<!^)(?=[A-Z])", "_", key.removeprefix("kVector")).upper(): v for key, v in header.items()}
    assert spelled == {member.name: int(member.value) for member in codes.VectorAccess}


def test_fp8_target_mirror_equals_the_header():
    # kp::Fp8Target's kFp8Rows, kFp8Slots, kFp8Table as codes.Fp8Target's ROWS, SLOTS, TABLE.
    header = _header_enums()["Fp8Target"]
    spelled = {key.removeprefix("kFp8").upper(): value for key, value in header.items()}
    assert spelled == {member.name: int(member.value) for member in codes.Fp8Target}


def test_the_prefetch_sizes_are_the_headers():
    text = (kernels_dir() / "kpool_common.cuh").read_text()
    (whole, stream) = re.findall(r"kWholePoolBytes = (\d+), kStreamBytes = (\d+)", text)[0]
    assert (int(whole), int(stream)) == (WHOLE_POOL_BYTES, STREAM_BYTES)


def test_the_expansion_block_is_the_headers():
    text = (kernels_dir() / "kpool_expand.cuh").read_text()
    threads = int(re.findall(r"kExpandThreads = (\d+);", text)[0])
    run = int(re.findall(r"kExpandRun = (\d+);", text)[0])
    assert (threads, threads * run) == (EXPAND_THREADS, EXPAND_SPAN)
    # A span per row and EXPAND_SPAN columns without compact, one per row with it.
    assert [expand_geometry(3, w, False).items for w in (1, 1024, 1025, 2051)] == [3, 3, 6, 9]
    assert expand_geometry(3, 2051, True).items == 3


def test_the_ape_sum_block_is_the_headers():
    # The reference sums ape's partials in the kernel's slices and pairwise levels (reference_kernels.py), and
    # ape_sum_geometry gives a block per APE_COLUMNS elements: both read these two numbers.
    text = (kernels_dir() / "kpool_compress.cu").read_text()
    (slices, columns) = re.findall(r"kApeSlices = (\d+), kApeColumns = (\d+)", text)[0]
    assert (int(slices), int(columns)) == (APE_SLICES, APE_COLUMNS)


def test_the_split_ring_launch_bound_holds_every_block_group_geometry_makes():
    # Tail update on a split ring is built with __launch_bounds__(group_block_bound(HEAD_DIM)):
    # a bigger block would fail to launch, so the header's rule and the geometry must agree.
    text = (kernels_dir() / "kpool_common.cuh").read_text()
    (floor,) = re.findall(r"kChannelsPerThread : (\d+);", text)
    assert int(floor) == TARGET_THREADS_PER_BLOCK
    for head_dim in range(8, MAX_HEAD_DIM + 1, 8):
        for groups in (1, 3, 10_000):
            assert group_geometry(head_dim, groups).block <= group_block_bound(head_dim), (head_dim, groups)
    assert group_block_bound(128) == 256 and group_block_bound(MAX_HEAD_DIM) == MAX_HEAD_DIM // 8


def test_the_spread_geometry_spreads_small_batches_in_whole_warps_under_the_launch_bound():
    from kpool_cupy.kernel.geometry import spread_geometry

    for head_dim in range(8, MAX_HEAD_DIM + 1, 8):
        lanes = head_dim // 8
        for requests in (1, 2, 63, 64, 512, 513, 100_000):
            g = spread_geometry(head_dim, requests)
            groups = g.block // lanes
            assert g.block % lanes == 0 and g.items == g.grid * groups >= requests > g.items - groups, (head_dim, g)
            assert g.block <= group_block_bound(head_dim), (head_dim, requests, g)  # tail update's launch bound
            if lanes <= 32 and 32 % lanes == 0:
                assert g.block % 32 == 0, (head_dim, requests, g)  # whole warps: the FP8 shuffles name all 32
    # The engines' decode shape (head_dim 128): blocks on at least 16 SMs at
    # 64 requests and 128 at 512 (group_geometry's 256-thread blocks gave 4 and 32).
    assert [spread_geometry(128, b).grid for b in (1, 64, 512)] == [1, 32, 128]


def test_the_block_size_limit_is_the_launch_bound():
    # The kernels' __launch_bounds__ promise no block above kMaxThreadsPerBlock;
    # a launch past it fails on the GPU (too many resources requested).
    (bound,) = re.findall(r"kMaxThreadsPerBlock\s*=\s*(\d+)", (kernels_dir() / "kpool_common.cuh").read_text())
    assert group_geometry(MAX_HEAD_DIM, 1).block == int(bound)  # the bound is no looser than it must be
    for head_dim in range(8, MAX_HEAD_DIM + 1, 8):
        assert group_geometry(head_dim, 10_000).block <= int(bound), head_dim
    assert expand_geometry(10_000, 2051, False).block <= int(bound)


def _index_positions(kernel: Kernel) -> list[int]:
    """Where ``kernel``'s index typename parameters (those defaulting to int32) sit in its template."""
    return [i for i, t in enumerate(kernel.template) if t.kind == "typename" and t.default is not None]


@pytest.mark.parametrize("kernel", [k for k in KERNELS if _index_positions(k)], ids=lambda k: k.name)
def test_every_index_dtype_spells_a_distinct_template_argument(kernel):
    # Each index array's dtype reaches the instance as its own C integer type.
    required = {
        t.name: np.float32 if t.kind == "typename" else 4
        for t in kernel.template
        if t.default is None and t.name != "VECTOR"
    }
    positions = _index_positions(kernel)
    spelled = {}
    for dtype, ctype in ((np.int32, "int"), (np.uint32, "unsigned int"), (np.int64, "long long")):
        indexes = {kernel.template[i].name: np.dtype(dtype) for i in positions}
        name = kernel.instance(**required, **indexes)
        arguments = name.removeprefix(f"{kernel.name}<").removesuffix(">").split(", ")
        assert len(arguments) == len(kernel.template), name
        assert [arguments[i] for i in positions] == [ctype] * len(positions), name
        spelled[ctype] = name
    assert len(set(spelled.values())) == 3


def test_vector_access_needs_the_base_and_every_stepped_stride_aligned():
    buffer = np.zeros((4, 40), np.float32)  # rows of 160 bytes
    assert codes.allows_vector_access(buffer[:, :16])
    assert not codes.allows_vector_access(buffer[:, 1:17])  # base 4 bytes off
    assert not codes.allows_vector_access(np.zeros((4, 41), np.float32)[:, :16])  # rows of 164 bytes
    assert codes.allows_vector_access(np.zeros((1, 41), np.float32)[:, :16])  # one row: its stride is never stepped
    steps = np.zeros((2, 3, 20), np.float32)[:, :, :16]  # 3-D: both outer strides are stepped
    assert codes.allows_vector_access(steps)
    assert not codes.allows_vector_access(np.zeros((2, 3, 17), np.float32)[:, :, :16])
