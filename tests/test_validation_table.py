"""Walks docs/validation.md: every row is one bad call, checked on each backend it names."""

from __future__ import annotations

import re

import numpy as np
import pytest
from model import BF16, make_batch
from validation_tables import Row, table

from kpool_cupy import emulate, reference

BACKENDS = ("all", "host", "cupy", "multi-gpu")


def good() -> dict:
    # 9 tokens from position 0 (pools 0, 1) and 6 from position 3 (pool 1): 3 pools.
    batch = make_batch([9, 6], [0, 3], seed=1)
    return dict(
        k=batch.k,
        gate=batch.gate,
        ape=batch.ape,
        input_row_offsets=batch.input_row_offsets,
        cache_lengths=batch.cache_lengths,
    )


def _set(**changes):
    return lambda a: a.update({name: change(a) for name, change in changes.items()})


def _wide(a):
    a["k"], a["gate"], a["ape"] = (np.zeros((a["k"].shape[0], 4104), BF16),) * 2 + (np.zeros((4, 4104), np.float32),)


def _read_only_out(a):
    a["out"] = np.empty((3, 128), BF16)
    a["out"].flags.writeable = False


def _device_array(a):
    class OtherFrameworkArray:  # has array metadata but is not a NumPy array
        shape, dtype, strides, ndim = (15, 128), BF16, (256, 2), 2

    a["k"] = OtherFrameworkArray()


def _fused_out_over_gate(a):
    # k, gate and out as column slices of one [tokens, 384] buffer, out's
    # columns starting half-way into gate's.
    fused = np.zeros((a["k"].shape[0], 384), BF16)
    fused[:, :128], fused[:, 128:256] = a["k"], a["gate"]
    a["k"], a["gate"], a["out"] = fused[:, :128], fused[:, 128:256], fused[:3, 192:320]


def _narrow(a):
    a["k"], a["gate"], a["ape"] = a["k"][:, :12], a["gate"][:, :12], a["ape"][:, :12]


MUTATIONS = {
    "k-not-array": _set(k=lambda a: a["k"].tolist()),
    "k-device-array-on-cpu": _device_array,
    "k-rank": _set(k=lambda a: a["k"][None]),
    "k-dtype": _set(k=lambda a: a["k"].astype(np.int16)),
    "k-last-dim": _set(k=lambda a: np.asfortranarray(a["k"])),
    "k-row-stride": _set(k=lambda a: np.lib.stride_tricks.as_strided(a["k"], (a["k"].shape[0] - 1, 128), (257, 2))),
    "k-head-dim-zero": _set(k=lambda a: a["k"][:, :0]),
    "k-head-dim-not-8": _narrow,
    "k-head-dim-too-large": _wide,
    "gate-shape": _set(gate=lambda a: a["gate"][:-1]),
    "gate-dtype": _set(gate=lambda a: a["gate"].astype(np.float64)),
    "gate-last-dim": _set(gate=lambda a: np.asfortranarray(a["gate"])),
    "ape-dtype": _set(ape=lambda a: a["ape"].astype(np.float16)),
    "ape-kpool-zero": _set(ape=lambda a: a["ape"][:0]),
    "ape-kpool-too-large": _set(ape=lambda a: np.zeros((1025, a["ape"].shape[1]), np.float32)),
    "ape-width": _set(ape=lambda a: a["ape"][:, :-8]),
    "ape-rank": _set(ape=lambda a: a["ape"][0]),
    "ape-last-dim": _set(ape=lambda a: np.asfortranarray(a["ape"])),
    "input_row_offsets-dtype": _set(input_row_offsets=lambda a: a["input_row_offsets"].astype(np.float32)),
    "input_row_offsets-rank": _set(input_row_offsets=lambda a: a["input_row_offsets"][None]),
    "input_row_offsets-strided": _set(input_row_offsets=lambda a: np.repeat(a["input_row_offsets"], 2)[::2]),
    "input_row_offsets-empty": _set(input_row_offsets=lambda a: a["input_row_offsets"][:0]),
    "input_row_offsets-start": _set(input_row_offsets=lambda a: a["input_row_offsets"] + 1),
    "input_row_offsets-decreasing": _set(input_row_offsets=lambda a: np.array([0, 10, 9], np.int32)),
    "input_row_offsets-end": _set(input_row_offsets=lambda a: np.array([0, 9, 14], np.int32)),
    "cache_lengths-length": _set(cache_lengths=lambda a: np.zeros(3, np.int32)),
    "cache_lengths-dtype": _set(cache_lengths=lambda a: a["cache_lengths"].astype(np.int16)),
    "cache_lengths-rank": _set(cache_lengths=lambda a: a["cache_lengths"][None]),
    "cache_lengths-strided": _set(cache_lengths=lambda a: np.repeat(a["cache_lengths"], 2)[::2]),
    "cache_lengths-negative": _set(cache_lengths=lambda a: np.array([0, -1], np.int32)),
    "cache_lengths-huge": _set(cache_lengths=lambda a: np.array([0, 2**62], np.int64)),
    "pool_row_offsets-length": _set(pool_row_offsets=lambda a: np.array([0, 2], np.int64)),
    "pool_row_offsets-dtype": _set(pool_row_offsets=lambda a: np.array([0, 2, 3], np.float64)),
    "pool_row_offsets-rank": _set(pool_row_offsets=lambda a: np.array([[0, 2, 3]], np.int64)),
    "pool_row_offsets-mismatch": _set(pool_row_offsets=lambda a: np.array([0, 2, 4], np.int64)),
    "out-rows": _set(out=lambda a: np.empty((2, 128), BF16)),
    "out-width": _set(out=lambda a: np.empty((3, 64), BF16)),
    "out-dtype": _set(out=lambda a: np.empty((3, 128), np.float64)),
    "out-dtype-name": _set(out_dtype=lambda a: "int8"),
    "out-dtype-mismatch": _set(out=lambda a: np.empty((3, 128), np.float32), out_dtype=lambda a: "bfloat16"),
    "out-rank": _set(out=lambda a: np.empty(3 * 128, BF16)),
    "out-read-only": _read_only_out,
    "out-last-dim": _set(out=lambda a: np.asfortranarray(np.empty((3, 128), BF16))),
    "out-overlapping": _set(
        out=lambda a: np.lib.stride_tricks.as_strided(np.zeros((1, 128), BF16), (3, 128), (0, 2), writeable=True)
    ),
    "out-shares-k": _set(out=lambda a: a["k"][:3]),
    "out-shares-fused-gate": _fused_out_over_gate,
    "host-array-on-gpu": lambda a: None,  # the GPU path gets the host arrays as they are
    "stream-type": _set(stream=lambda a: "default"),
    "validate-not-bool": _set(validate=lambda a: "False"),
    "rotate-not-bool": _set(rotate=lambda a: np.array([True, False])),
    "two-devices": lambda a: None,  # moved to device 1 in the test itself
}

ROWS = table("The validation contract")
IDS = [row.id for row in ROWS]


def test_table_and_mutations_match():
    assert len(ROWS) >= 30, "the table in docs/validation.md did not parse"
    assert sorted(IDS) == sorted(MUTATIONS)
    assert {row.backends for row in ROWS} <= set(BACKENDS), {row.backends for row in ROWS}


def bad_call(row_id: str) -> dict:
    args = good()
    MUTATIONS[row_id](args)
    return args


def _expect(run, args, argument, error):
    with pytest.raises(error, match=rf"^Invalid {re.escape(argument)}: expected .+, got .+"):
        run(**args)


@pytest.mark.parametrize("backend", ["emulate", "reference"])
@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_cpu_backends(backend, row: Row):
    if row.backends not in ("all", "host"):
        pytest.skip(f"a {row.backends} row")
    run = {"emulate": emulate.kpool_compress, "reference": reference.kpool_compress}[backend]
    _expect(run, bad_call(row.id), row.argument, row.error)


def test_the_good_call_passes_everywhere_on_the_cpu():
    # The control for every row above: unmutated, the call is accepted.
    for run in (emulate.kpool_compress, reference.kpool_compress):
        assert run(**good()).shape == (3, 128)


CUPY_ROWS = [row for row in ROWS if row.backends == "cupy"]
DEVICE_ROWS = [row for row in ROWS if row.backends in ("all", "multi-gpu")]


@pytest.mark.parametrize("row", CUPY_ROWS, ids=[r.id for r in CUPY_ROWS])
def test_gpu_path_before_any_cuda_call(row: Row):
    # These errors come before the GPU path touches a device: they hold wherever CuPy imports.
    pytest.importorskip("cupy")
    import kpool_cupy

    _expect(kpool_cupy.kpool_compress, bad_call(row.id), row.argument, row.error)


@pytest.mark.gpu
@pytest.mark.parametrize("row", DEVICE_ROWS, ids=[r.id for r in DEVICE_ROWS])
def test_gpu_path(row: Row):
    import cupy

    import kpool_cupy

    if row.backends == "multi-gpu":
        if cupy.cuda.runtime.getDeviceCount() < 2:
            pytest.skip("needs two CUDA devices")
        args = {name: cupy.asarray(value) for name, value in good().items()}
        with cupy.cuda.Device(1):
            args["gate"] = cupy.asarray(good()["gate"])
        _expect(kpool_cupy.kpool_compress, args, row.argument, row.error)
        return
    args = {
        name: cupy.asarray(value) if isinstance(value, np.ndarray) else value
        for name, value in bad_call(row.id).items()
    }
    _expect(kpool_cupy.kpool_compress, args, row.argument, row.error)
