"""Feed garbage offsets with validate=False to one backend; run under a sanitizer.

    python tests/run_garbage.py --backend emulate --count 300   (under LD_PRELOAD=libasan)
    compute-sanitizer --tool memcheck python tests/run_garbage.py --backend cupy --count 200

Runs --count compress calls, --count lifecycle calls (ring close, seed tail,
tail update, expand), --count // 2 expand calls with a garbage block table
or compacting and --count // 4 lifecycle calls on split rings
(tests/garbage.py, ``ring_garbage_cases``), and prints how many
ran. Any access outside the arrays is the sanitizer's to report.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from garbage import garbage_cases, ring_garbage_cases


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["emulate", "reference", "cupy"], required=True)
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
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

    calls = 0
    for case in garbage_cases(options.seed, options.count):
        module.kpool_compress(**{name: convert(value) for name, value in case.items()}, validate=False)
        finish()
        calls += 1
    for function, case in ring_garbage_cases(options.seed, options.count):
        getattr(module, f"kpool_{function}")(**{name: convert(value) for name, value in case.items()}, validate=False)
        finish()
        calls += 1
    print(f"garbage calls: {calls}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
