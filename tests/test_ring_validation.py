"""Walks the ring and expand table of docs/validation.md on both CPU backends (and the GPU path where one exists)."""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16
from validation_tables import Row, refused, table

from kpool_cupy import emulate, reference

FUNCTIONS = ("ring_close", "seed_tail", "tail_update", "expand_topk")


def good(function: str) -> dict:
    """A valid call of ``function``: kpool 4, head_dim 16, two requests on slots 2 and 0."""
    rng = np.random.default_rng(0)
    k = rng.standard_normal((11, 16)).astype(BF16)
    common = {
        "tail": np.zeros((3, 2, 4, 16), BF16),
        "k": k,
        "gate": k.copy(),
        "input_row_offsets": np.array([0, 5, 11], np.int32),
        "cache_lengths": np.array([2, 7], np.int32),
        "slot_idx": np.array([2, 0], np.int32),
    }
    ape = rng.standard_normal((4, 16)).astype(np.float32)
    if function == "ring_close":
        return {**common, "ape": ape}
    if function == "seed_tail":
        return common
    if function == "tail_update":
        step = rng.standard_normal((2, 3, 16)).astype(BF16)
        positions = np.array([[5, 6, 7], [9, 10, -1]], np.int32)
        return {"tail": common["tail"], "k": step, "gate": step.copy(), "ape": ape, "positions": positions,
                "slot_idx": common["slot_idx"]}  # fmt: skip
    pool_ids = rng.integers(-1, 5, (11, 3)).astype(np.int32)
    return {"pool_ids": pool_ids, "input_row_offsets": common["input_row_offsets"],
            "cache_lengths": common["cache_lengths"], "kpool": 4}  # fmt: skip


def _read_only_tail(a):
    a["tail"].flags.writeable = False


def _read_only_closed(a):
    a["closed"] = np.zeros((2, 1), np.int32)
    a["closed"].flags.writeable = False


def _closed_over_out(a):
    out = np.zeros((2, 16), np.float32)
    a.update(out=out, closed=out.reshape(-1).view(np.int32)[:2])


def _split(a, gate_dtype=None, rows: int = 4):
    """The call's ring as a pair (key_ring, gate_ring), the gate ring (and gate) in ``gate_dtype``."""
    if gate_dtype is not None:
        a["gate"] = a["gate"].astype(gate_dtype)
    slots, head_dim = a["tail"].shape[0], a["tail"].shape[-1]
    a["tail"] = (np.zeros((slots, rows, head_dim), BF16), np.zeros((slots, rows, head_dim), a["gate"].dtype))


def _split_then(change):
    def mutate(a):
        _split(a, np.float32)
        keys, gates = a["tail"]
        a["tail"] = change(keys, gates)

    return mutate


def _read_only(array):
    array.flags.writeable = False
    return array


MUTATIONS = {
    "tail-dtype": lambda a: a.update(tail=a["tail"].astype(np.float32)),
    "tail-shape": lambda a: a.update(tail=np.zeros((3, 2, 3, 16), BF16)),
    "tail-ring-too-long": lambda a: a.update(tail=np.zeros((1, 2, 65537, 16), BF16)),
    "tail-rank": lambda a: a.update(tail=a["tail"][0]),
    "tail-slot-span": lambda a: a.update(
        tail=np.lib.stride_tricks.as_strided(a["tail"], (3, 2, 4, 16), (256, 128, 2**31, 2), writeable=False)
    ),
    "tail-last-dim": lambda a: a.update(tail=np.zeros((3, 2, 4, 32), BF16)[..., ::2]),
    "tail-self-overlap": lambda a: a.update(
        tail=np.lib.stride_tricks.as_strided(np.zeros((3, 2, 1, 16), BF16), (3, 2, 4, 16), (128, 64, 0, 2))
    ),
    "seed-kpool-above-ring": lambda a: a.update(kpool=5),
    "split-pair-length": lambda a: a.update(tail=(a["tail"][:, 0], a["tail"][:, 1], a["tail"][:, 1])),
    "split-key-dtype": _split_then(lambda keys, gates: (keys.astype(np.float32), gates)),
    "split-gate-dtype": _split_then(lambda keys, gates: (keys, gates.astype(BF16))),
    "split-rank": _split_then(lambda keys, gates: (keys[:, None], gates)),
    "split-shapes-differ": _split_then(lambda keys, gates: (keys, gates[:2])),
    "split-ring-too-short": _split_then(lambda keys, gates: (keys[:, :3], gates[:, :3])),
    "split-gate-last-dim": _split_then(lambda keys, gates: (keys, np.zeros((3, 4, 32), np.float32)[..., ::2])),
    "split-gate-read-only": _split_then(lambda keys, gates: (keys, _read_only(gates))),
    "split-rings-overlap": _split_then(lambda keys, gates: (gates.view(BF16)[..., :16], gates)),
    "split-key-slot-span": _split_then(
        lambda keys, gates: (
            np.lib.stride_tricks.as_strided(keys, (3, 4, 16), (128, 2**31, 2), writeable=False),
            gates,
        )
    ),
    "tail-read-only": _read_only_tail,
    "gate-dtype-differs": lambda a: a.update(gate=a["gate"].astype(np.float32)),
    "slot-dtype": lambda a: a.update(slot_idx=a["slot_idx"].astype(np.float32)),
    "slot-length": lambda a: a.update(slot_idx=a["slot_idx"][:1]),
    "slot-range": lambda a: a.update(slot_idx=np.array([2, 3], np.int32)),
    "slot-repeated": lambda a: a.update(slot_idx=np.array([0, 0], np.int32)),
    "closed-dtype": lambda a: a.update(closed=np.zeros(2, np.int64)),
    "closed-short": lambda a: a.update(closed=np.zeros(1, np.int32)),
    "ring-out-rows": lambda a: a.update(out=np.zeros((1, 16), BF16)),
    "ring-out-dtype-mismatch": lambda a: a.update(out=np.zeros((2, 16), BF16), out_dtype="float16"),
    "ring-out-shares-closed": _closed_over_out,
    "seed-tail-over-k": lambda a: a.update(k=a["tail"].reshape(-1, 16)[:11], gate=a["k"]),
    "step-out-in-ring": lambda a: a.update(out=a["tail"].reshape(-1, 16)[:2].reshape(2, 1, 16)),
    "pool-id-too-big": lambda a: a.update(cache_lengths=np.array([2, 2**40 + 1], np.int64)),
    "step-rank": lambda a: a.update(k=a["k"][:, 0], gate=a["gate"][:, 0]),
    "step-gate-dtype": lambda a: a.update(gate=a["gate"].astype(np.float32)),
    "step-head-dim-too-large": lambda a: a.update(
        k=np.zeros((2, 3, 4104), BF16),
        gate=np.zeros((2, 3, 4104), BF16),
        ape=np.zeros((4, 4104), np.float32),
        tail=np.zeros((3, 2, 4, 4104), BF16),
    ),
    "positions-shape": lambda a: a.update(positions=np.zeros((2, 4), np.int32)),
    "positions-dtype": lambda a: a.update(positions=a["positions"].astype(np.float32)),
    "positions-pool-id-too-big": lambda a: a.update(positions=np.array([[5, 6, 2**40 * 4 - 1], [9, 10, -1]], np.int64)),
    "positions-noncontiguous": lambda a: a.update(positions=a["positions"][:, ::-1]),
    "positions-below-padding": lambda a: a.update(positions=np.array([[5, 6, 7], [9, -2, -1]], np.int32)),
    "positions-too-many-closes": lambda a: a.update(positions=np.array([[3, 7, 11], [9, 10, -1]], np.int32)),
    "step-out-shape": lambda a: a.update(out=np.zeros((2, 0, 16), BF16)),
    "step-closed-shape": lambda a: a.update(closed=np.zeros(2, np.int32)),
    "step-out-dtype": lambda a: a.update(out=np.zeros((2, 1, 16), np.int32)),
    "step-out-dtype-name": lambda a: a.update(out_dtype=np.float64),
    "closed-read-only": _read_only_closed,
    "pool-ids-dtype": lambda a: a.update(pool_ids=a["pool_ids"].astype(np.float32)),
    "pool-ids-rank": lambda a: a.update(pool_ids=a["pool_ids"][:, 0]),
    "pool-ids-noncontiguous": lambda a: a.update(pool_ids=np.asfortranarray(a["pool_ids"])),
    "expand-kpool": lambda a: a.update(kpool=0),
    "expand-kpool-type": lambda a: a.update(kpool=4.0),
    "expand-block-size-missing": lambda a: a.update(block_table=np.zeros((2, 8), np.int32)),
    "expand-block-size-range": lambda a: a.update(block_table=np.zeros((2, 8), np.int32), block_size=0),
    "expand-block-table-dtype": lambda a: a.update(block_table=np.zeros((2, 8), np.int64), block_size=4),
    "expand-block-table-shape": lambda a: a.update(block_table=np.zeros((3, 8), np.int32), block_size=4),
    "expand-block-table-last-dim": lambda a: a.update(block_table=np.zeros((2, 16), np.int32)[:, ::2], block_size=4),
    "expand-block-past-table": lambda a: a.update(block_table=np.zeros((2, 1), np.int32), block_size=4),
    "expand-kpool-too-large": lambda a: a.update(kpool=2**31),
    "expand-offsets-end": lambda a: a.update(input_row_offsets=np.array([0, 5, 10], np.int32)),
}

ROWS = table("Ring and expand functions")


def _call(module, function: str, args: dict):
    args = dict(args)
    if function == "ring_close":
        return module.kpool_ring_close(**args)
    if function == "seed_tail":
        return module.kpool_seed_tail(**args)
    if function == "tail_update":
        return module.kpool_tail_update(**args)
    return module.kpool_expand_topk(**args)


def test_table_and_mutations_match():
    assert len(ROWS) >= 20, "the ring table in docs/validation.md did not parse"
    assert sorted(r.id for r in ROWS) == sorted(MUTATIONS)
    assert {r.function for r in ROWS} <= set(FUNCTIONS), {r.function for r in ROWS}


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
def test_good_calls_pass(module):
    # The control: each function accepts its unmutated call.
    for function in FUNCTIONS:
        _call(module, function, good(function))


@pytest.mark.parametrize("module", [emulate, reference], ids=["emulate", "reference"])
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_call_names_the_argument(module, row: Row):
    args = good(row.function)
    MUTATIONS[row.id](args)
    with refused(row):
        _call(module, row.function, args)


@pytest.mark.gpu
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_gpu_bad_call_names_the_argument(row: Row):
    import cupy

    import kpool_cupy

    row_id, function = row.id, row.function
    args = good(function)
    MUTATIONS[row_id](args)
    if row_id in ("tail-last-dim", "tail-self-overlap", "tail-slot-span", "tail-read-only", "closed-read-only",
                  "positions-noncontiguous", "pool-ids-noncontiguous", "expand-block-table-last-dim"):  # fmt: skip
        pytest.skip("CuPy copies a strided host array contiguous and has no read-only arrays")
    if row_id in ("ring-out-shares-closed", "seed-tail-over-k", "step-out-in-ring"):
        pytest.skip("copies share nothing: tests/test_overlap.py makes the shared views on the device")
    if row_id in ("split-gate-last-dim", "split-gate-read-only", "split-key-slot-span", "split-rings-overlap"):
        pytest.skip("CuPy copies a strided host array contiguous, has no read-only arrays, and copies share nothing")

    def on_device(value):
        if isinstance(value, tuple):
            return tuple(on_device(v) for v in value)
        return cupy.asarray(value) if isinstance(value, np.ndarray) else value

    device = {name: on_device(v) for name, v in args.items()}
    with refused(row):
        _call(kpool_cupy, function, device)
