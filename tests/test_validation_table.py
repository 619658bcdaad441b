"""Walks docs/validation.md: every row is one bad call, checked on each backend it names."""

from __future__ import annotations

import re

import numpy as np
import pytest
from model import BF16, make_batch
from validation_tables import Row, table

from kpool_cupy import emulate, reference
from kpool_cupy.ops import OPS
from kpool_cupy.ops.framework.examples import example_batch

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


def _one_byte_in(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` starting one byte past an address its element size divides."""
    buffer = np.zeros(array.nbytes + array.itemsize, np.uint8)
    start = (-buffer.ctypes.data) % array.itemsize + 1
    moved = buffer[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    moved[...] = array
    return moved


def _narrow(a):
    a["k"], a["gate"], a["ape"] = a["k"][:, :12], a["gate"][:, :12], a["ape"][:, :12]


MUTATIONS = {
    "k-not-array": _set(k=lambda a: a["k"].tolist()),
    "k-device-array-on-cpu": _device_array,
    "k-rank": _set(k=lambda a: a["k"][None]),
    "k-dtype": _set(k=lambda a: a["k"].astype(np.int16)),
    "k-last-dim": _set(k=lambda a: np.asfortranarray(a["k"])),
    "k-row-stride": _set(k=lambda a: np.lib.stride_tricks.as_strided(a["k"], (a["k"].shape[0] - 1, 128), (257, 2))),
    "k-unaligned": _set(k=lambda a: _one_byte_in(a["k"])),
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


@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
def test_a_host_array_on_the_gpu_path_names_the_ops_cpu_backends(spec):
    # The hint named kpool_compress's whatever op was called (a hostile round).
    pytest.importorskip("cupy")
    import kpool_cupy

    args, kwargs = spec.example(example_batch())
    with pytest.raises(TypeError, match=rf"host arrays go to kpool_cupy\.reference\.{spec.name} or "
                                        rf"kpool_cupy\.emulate\.{spec.name}$"):  # fmt: skip
        getattr(kpool_cupy, spec.name)(*args, **kwargs)


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


# kpool_compress_backward: the "Backward function" table.


def good_backward() -> dict:
    """compress's good call (3 pools, bfloat16, head_dim 128, kpool 4) with a gradient row per pool."""
    rng = np.random.default_rng(2)
    return good() | {"grad_pooled": rng.standard_normal((3, 128)).astype(BF16)}


def _read_only(name: str, like: str, dtype=None):
    def mutate(a):
        array = np.zeros(a[like].shape, dtype or a[like].dtype)
        array.flags.writeable = False
        a[name] = array

    return mutate


def _broadcast_rows(name: str, like: str):
    """A writable array whose rows are all one row (row stride 0): writes to one row land in every row."""

    def rows(a):
        row = np.zeros((1, a[like].shape[1]), a[like].dtype)
        return np.lib.stride_tricks.as_strided(row, a[like].shape, (0, row.itemsize), writeable=True)

    return _set(**{name: rows})


def _grad_gate_over_grad(a):
    # grad_pooled is the first 3 rows of a [15, 128] buffer whose rows are grad_gate.
    buffer = np.zeros(a["gate"].shape, BF16)
    buffer[:3] = a["grad_pooled"]
    a["grad_pooled"], a["grad_gate"] = buffer[:3], buffer


def _one_array_for_both(a):
    a["grad_k"] = a["grad_gate"] = np.zeros(a["k"].shape, BF16)


BACKWARD_MUTATIONS = {
    "bw-grad-not-array": _set(grad_pooled=lambda a: a["grad_pooled"].tolist()),
    "bw-grad-dtype": _set(grad_pooled=lambda a: a["grad_pooled"].astype(np.float64)),
    "bw-grad-rank": _set(grad_pooled=lambda a: a["grad_pooled"].reshape(-1)),
    "bw-grad-width": _set(grad_pooled=lambda a: a["grad_pooled"][:, :-8]),
    "bw-grad-strides": _set(
        grad_pooled=lambda a: np.lib.stride_tricks.as_strided(np.zeros(2000, np.uint8).view(BF16), (3, 128), (256, 3))
    ),
    "bw-grad-rows": _set(grad_pooled=lambda a: a["grad_pooled"][:2]),
    "bw-k-dtype": _set(k=lambda a: a["k"].astype(np.int16)),
    "bw-ape-width": _set(ape=lambda a: a["ape"][:, :-8]),
    "bw-offsets-end": _set(input_row_offsets=lambda a: np.array([0, 9, 14], np.int32)),
    "bw-pool-row-offsets-mismatch": _set(pool_row_offsets=lambda a: np.array([0, 2, 4], np.int64)),
    "bw-grad-k-shape": _set(grad_k=lambda a: np.zeros((14, 128), BF16)),
    "bw-grad-k-dtype": _set(grad_k=lambda a: np.zeros((15, 128), np.float32)),
    "bw-grad-k-last-dim": _set(grad_k=lambda a: np.asfortranarray(np.zeros((15, 128), BF16))),
    "bw-grad-k-read-only": _read_only("grad_k", "k"),
    "bw-grad-k-overlapping": _broadcast_rows("grad_k", "k"),
    "bw-grad-k-is-k": _set(grad_k=lambda a: a["k"]),
    "bw-grad-gate-shape": _set(grad_gate=lambda a: np.zeros((14, 128), BF16)),
    "bw-grad-gate-dtype": _set(grad_gate=lambda a: np.zeros((15, 128), np.float16)),
    "bw-grad-gate-read-only": _read_only("grad_gate", "gate"),
    "bw-grad-gate-over-grad": _grad_gate_over_grad,
    "bw-grad-gate-is-grad-k": _one_array_for_both,
    "bw-grad-ape-shape": _set(grad_ape=lambda a: np.zeros((3, 128), np.float32)),
    "bw-grad-ape-dtype": _set(grad_ape=lambda a: np.zeros((4, 128), BF16)),
    "bw-grad-ape-read-only": _read_only("grad_ape", "ape"),
    "bw-grad-ape-overlapping": _broadcast_rows("grad_ape", "ape"),
    "bw-grad-ape-is-ape": _set(grad_ape=lambda a: a["ape"]),
    "bw-validate-not-bool": _set(validate=lambda a: "False"),
}

BACKWARD_ROWS = table("Backward function")
BACKWARD_IDS = [row.id for row in BACKWARD_ROWS]


def test_backward_table_and_mutations_match():
    assert len(BACKWARD_ROWS) >= 20, "the backward table in docs/validation.md did not parse"
    assert sorted(BACKWARD_IDS) == sorted(BACKWARD_MUTATIONS)


def test_the_good_backward_call_passes_on_the_cpu():
    # The control for every row below: unmutated, the call is accepted, and with every output given too.
    outputs = {"grad_k": np.zeros((15, 128), BF16), "grad_gate": np.zeros((15, 128), BF16)}
    outputs["grad_ape"] = np.zeros((4, 128), np.float32)
    for run in (emulate.kpool_compress_backward, reference.kpool_compress_backward):
        shapes = [grad.shape for grad in run(**good_backward())]
        assert shapes == [(15, 128), (15, 128), (4, 128)], shapes
        assert all(got is given for got, given in zip(run(**good_backward(), **outputs), outputs.values(), strict=True))


def bad_backward_call(row_id: str) -> dict:
    args = good_backward()
    BACKWARD_MUTATIONS[row_id](args)
    return args


@pytest.mark.parametrize("backend", ["emulate", "reference"])
@pytest.mark.parametrize("row", BACKWARD_ROWS, ids=BACKWARD_IDS)
def test_backward_cpu_backends(backend, row: Row):
    run = {"emulate": emulate.kpool_compress_backward, "reference": reference.kpool_compress_backward}[backend]
    _expect(run, bad_backward_call(row.id), row.argument, row.error)


# Layouts cupy.asarray copies contiguous and writable, or arrays it cannot take: their checks hold on the same
# metadata on the GPU path, but these calls cannot show it there.
HOST_ONLY = {
    "bw-grad-not-array", "bw-grad-strides", "bw-grad-k-last-dim", "bw-grad-k-read-only", "bw-grad-k-overlapping",
    "bw-grad-k-is-k", "bw-grad-gate-read-only", "bw-grad-gate-over-grad", "bw-grad-gate-is-grad-k",
    "bw-grad-ape-read-only", "bw-grad-ape-overlapping", "bw-grad-ape-is-ape",
}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("row", BACKWARD_ROWS, ids=BACKWARD_IDS)
def test_backward_gpu_path(row: Row):
    import cupy

    import kpool_cupy

    if row.id in HOST_ONLY:
        pytest.skip("a layout or array cupy.asarray does not carry to the device")
    args = {
        name: cupy.asarray(value) if isinstance(value, np.ndarray) else value
        for name, value in bad_backward_call(row.id).items()
    }
    _expect(kpool_cupy.kpool_compress_backward, args, row.argument, row.error)
