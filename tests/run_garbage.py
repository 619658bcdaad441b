"""Feed garbage offsets with validate=False to one backend; run under a sanitizer.

    python tests/run_garbage.py --backend emulate --count 300   (under LD_PRELOAD=libasan)
    compute-sanitizer --tool memcheck python tests/run_garbage.py --backend cupy --count 200

Runs, by family (--families, all four by default):

- compress: --count compress calls;
- lifecycle: --count lifecycle calls (ring close, seed tail, tail update,
  expand), --count // 2 expand calls with a garbage block table or
  compacting and --count // 4 lifecycle calls on split rings
  (tests/garbage.py, ``ring_garbage_cases``);
- fp8: --count // 2 calls of kpool_compress_fp8 (garbage slots, block
  tables, caches and out rows) and hadamard_quant_fp8
  (``fp8_garbage_cases``), then --count // 4 of kpool_ring_close_fp8 and
  kpool_tail_update_fp8 (``fp8_ring_garbage_cases``), and --count // 24 of
  kpool_index_logits_fp8 (``index_garbage_cases``), kpool_index_topk
  (``topk_garbage_cases``) and kpool_index_select_fp8
  (``select_garbage_cases``);
- backward: --count // 4 calls of kpool_compress_backward
  (``backward_garbage_cases``: compress's garbage offsets, grad_pooled of
  fewer rows than the pools claimed, at odd strides);

and prints how many ran. Any access outside the arrays is the sanitizer's
to report.
"""

from __future__ import annotations

import argparse
import itertools
import sys
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

FAMILIES = ("compress", "lifecycle", "fp8", "backward")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["emulate", "reference", "cupy"], required=True)
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated, of " + ", ".join(FAMILIES))
    options = parser.parse_args()
    families = options.families.split(",")
    if not set(families) <= set(FAMILIES):
        parser.error(f"--families: expected some of {', '.join(FAMILIES)}, got {options.families}")
    if options.backend == "cupy":
        import cupy

        import kpool_cupy as module

        def convert(value):
            if isinstance(value, tuple):  # a split ring
                return tuple(convert(v) for v in value)
            return cupy.asarray(value) if isinstance(value, np.ndarray) else value

        def finish():
            cupy.cuda.get_current_stream().synchronize()
    else:
        import importlib

        module = importlib.import_module(f"kpool_cupy.{options.backend}")

        def convert(value):
            return value

        def finish():
            pass

    families_cases = []  # of (function, keywords), each family generated as it runs
    if "compress" in families:
        families_cases.append(("kpool_compress", case) for case in garbage_cases(options.seed, options.count))
    if "lifecycle" in families:
        cases = ring_garbage_cases(options.seed, options.count)
        families_cases.append((f"kpool_{function}", case) for function, case in cases)
    if "fp8" in families:
        families_cases.append(fp8_garbage_cases(options.seed, options.count // 2))
        families_cases.append(fp8_ring_garbage_cases(options.seed, options.count // 4))
        families_cases.append(index_garbage_cases(options.seed, options.count // 24))
        families_cases.append(topk_garbage_cases(options.seed, options.count // 24))
        families_cases.append(select_garbage_cases(options.seed, options.count // 24))
    if "backward" in families:
        families_cases.append(backward_garbage_cases(options.seed, options.count // 4))
    calls = 0
    for function, case in itertools.chain.from_iterable(families_cases):
        getattr(module, function)(**{name: convert(value) for name, value in case.items()}, validate=False)
        finish()
        calls += 1
    print(f"garbage calls: {calls}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
