"""What compute-sanitizer runs in scripts/gpu_check.sh: every GPU op, CuPy's memory pool off.

    compute-sanitizer --tool memcheck --error-exitcode 3 python tests/run_memcheck.py --count 8

With the pool off (``cupy.cuda.set_allocator(None)``) every array is its own
allocation, so an access past an array's end leaves the allocation; in
CuPy's pool, sizes round up to 512 bytes and a small overrun lands in memory
the pool owns, where memcheck sees nothing.

1. Valid calls, a small fixed set: every kernel family (each op of
   ``kpool-cupy check --op``) on three of the check's batches, one per index
   dtype of the offsets and cache lengths (int32, uint32, int64; bfloat16,
   head_dim 128, kpool 4, tens of tokens), against the reference; and one
   compress whose k and gate are column blocks of one fused
   ``[tokens, 3 * head_dim]`` device buffer (strided rows), against the
   float64 model.
2. Garbage (tests/garbage.py) with ``validate=False`` for compress and the
   four lifecycle ops, then ``--count // 4`` (at least 6) calls of the FP8
   ops (garbage slots, block tables, caches, out rows;
   ``fp8_garbage_cases``) and ``--count // 8`` (at least 2) of the FP8 ring
   ops (``fp8_ring_garbage_cases``), then the scorer's and the selections'
   garbage, and ``--count // 2`` (at least 4) calls of the backward
   (``backward_garbage_cases``: grad_pooled shorter than the pools claimed,
   transposed, strided, reversed or at stride 0; given gradient outputs at a
   padded row stride). A host array that is a view of a larger buffer (every
   other row) becomes the same view of a device copy of that buffer, made on
   the device: ``cupy.asarray`` would copy the view contiguous and hide the
   stride.

Prints the calls per op and the strided views made; exits 1 when a valid
call is wrong or an op was never called. Memory errors are the sanitizer's
to report.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from garbage import (
    backward_garbage_cases,
    fp8_garbage_cases,
    fp8_ring_garbage_cases,
    garbage_cases,
    index_garbage_cases,
    ring_garbage_cases,
    select_garbage_cases,
    topk_garbage_cases,
)
from model import BF16, assert_close_to_model, make_batch, standard_lengths

from kpool_cupy.ops import OPS as OP_SPECS

# Every op must make a garbage call under the sanitizer: the op list, not a copy of it.
OPS = tuple(spec.name for spec in OP_SPECS)


def device_copy(value, cupy, views: Counter):
    """``value`` on the device; a view of a larger host buffer stays that view, of the buffer's device copy.
    A split ring's pair goes over array by array."""
    if isinstance(value, tuple):
        return tuple(device_copy(v, cupy, views) for v in value)
    if not isinstance(value, np.ndarray):
        return value
    base = value
    while isinstance(base.base, np.ndarray):
        base = base.base
    if base is value or base.dtype != value.dtype or not base.flags.c_contiguous:
        return cupy.asarray(value)
    start, remainder = divmod(value.ctypes.data - base.ctypes.data, value.itemsize)
    if remainder:
        return cupy.asarray(value)
    flat = cupy.asarray(base).reshape(-1)[start:]
    view = cupy.lib.stride_tricks.as_strided(flat, shape=value.shape, strides=value.strides)
    if view.strides != value.strides:
        raise AssertionError(f"device view strides {view.strides}, host {value.strides}")
    views["strided device views"] += 1
    return view


# One check batch per index dtype of the offsets and cache lengths (kpool_cupy.tools.cases.check_cases).
INDEX_CASES = {"ragged-tails": "int32", "cache-near-2^32": "uint32", "cache-past-2^32": "int64"}


def family_calls(seed: int = 0) -> list[tuple[str, str, bool]]:
    """Every op of ``kpool-cupy check --op`` on the INDEX_CASES batches: (op, index dtype, right)."""
    from kpool_cupy.tools.cases import check_cases
    from kpool_cupy.tools.op_checks import OP_CHECKS
    from kpool_cupy.tools.self_check import backend_for, check_case

    backend = backend_for("cupy")
    cases = [case for case in check_cases(128, 4, BF16, seed) if case.name in INDEX_CASES]
    rng = np.random.default_rng([seed, 1])  # as run_check draws the ring noise and the selected ids
    done = []
    for op in OP_CHECKS:
        for case in cases:
            if str(case.input_row_offsets.dtype) != INDEX_CASES[case.name]:
                raise AssertionError(f"{case.name}: offsets are {case.input_row_offsets.dtype}")
            done.append((op, INDEX_CASES[case.name], check_case(backend, case, 4, op, rng).ok))
    return done


def valid_calls(cupy, kpool_cupy) -> bool:
    """Every family once per index dtype, and a strided compress; True when every result is right."""
    done = family_calls()
    ok = bool(done) and all(right for _, _, right in done)
    families, dtypes = len({op for op, _, _ in done}), len({dtype for _, dtype, _ in done})
    print(f"check cases: {len(done)} ({families} families x {dtypes} index dtypes), all right: {ok}", flush=True)
    for op, dtype, right in done:
        if not right:
            print(f"WRONG: {op} with {dtype} offsets", flush=True)
    batch = make_batch(*standard_lengths(4), seed=21)
    tokens = batch.k.shape[0]
    fused = cupy.zeros((tokens, 3 * 128), dtype=BF16)
    fused[:, :128] = cupy.asarray(batch.k)
    fused[:, 256:] = cupy.asarray(batch.gate)
    k, gate = fused[:, :128], fused[:, 256:]  # row stride 3 * 128 elements, made on the device
    got = kpool_cupy.kpool_compress(
        k, gate, cupy.asarray(batch.ape), cupy.asarray(batch.input_row_offsets), cupy.asarray(batch.cache_lengths)
    )
    assert_close_to_model(cupy.asnumpy(got), batch.model(), BF16)
    print(f"strided compress: k and gate rows {k.strides[0]} bytes apart, right", flush=True)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser()
    # 8: every op called (see below) in a few seconds; under compute-sanitizer each new variant's first
    # launch is slow, and the garbage's variants are drawn from its sizes and dtypes.
    parser.add_argument("--count", type=int, default=8, help="garbage calls per family (compress, lifecycle)")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()

    import cupy

    cupy.cuda.set_allocator(None)  # before the first allocation: no pool rounding sizes up
    import kpool_cupy

    ok = valid_calls(cupy, kpool_cupy)
    calls: Counter = Counter()
    views: Counter = Counter()

    def run(function: str, case: dict) -> None:
        arguments = {name: device_copy(value, cupy, views) for name, value in case.items()}
        getattr(kpool_cupy, function)(**arguments, validate=False)
        cupy.cuda.get_current_stream().synchronize()  # an error is then the call's own
        calls[function] += 1

    for case in garbage_cases(options.seed, options.count):
        run("kpool_compress", case)
    print(f"garbage compress calls: {calls['kpool_compress']}", flush=True)
    for function, case in ring_garbage_cases(options.seed, options.count):
        run(f"kpool_{function}", case)
    # At least one turn of each FP8 family's kinds, so every FP8 op is called.
    for function, case in fp8_garbage_cases(options.seed, max(options.count // 4, 6)):
        run(function, case)
    for function, case in fp8_ring_garbage_cases(options.seed, max(options.count // 8, 2)):
        run(function, case)
    for function, case in index_garbage_cases(options.seed, max(options.count // 2, 4)):
        run(function, case)
    for function, case in topk_garbage_cases(options.seed, max(options.count // 2, 8)):
        run(function, case)
    for function, case in select_garbage_cases(options.seed, max(options.count // 2, 8)):
        run(function, case)
    for function, case in backward_garbage_cases(options.seed, max(options.count // 2, 4)):
        run(function, case)
    print("garbage calls per op:", ", ".join(f"{op} {calls[op]}" for op in OPS), flush=True)
    print(f"strided device views: {views['strided device views']}", flush=True)
    missing = [op for op in OPS if calls[op] == 0]
    if missing:
        print(f"never called: {', '.join(missing)} (raise --count)", flush=True)
    print("memcheck driver done", flush=True)
    return 0 if ok and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
