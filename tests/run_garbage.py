"""Feed garbage offsets with validate=False to one backend; run under a sanitizer.

    python tests/run_garbage.py --backend emulate --count 300   (under LD_PRELOAD=libasan)
    compute-sanitizer --tool memcheck python tests/run_garbage.py --backend cupy --count 200

Prints how many calls ran. Any access outside the arrays is the sanitizer's to report.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from garbage import garbage_cases


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["emulate", "reference", "cupy"], required=True)
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    if options.backend == "cupy":
        import cupy

        import kpool_cupy

        def run(case):
            device = {name: None if a is None else cupy.asarray(a) for name, a in case.items()}
            kpool_cupy.kpool_compress(**device, validate=False)
            cupy.cuda.get_current_stream().synchronize()
    else:
        import importlib

        backend = importlib.import_module(f"kpool_cupy.{options.backend}")

        def run(case):
            backend.kpool_compress(**case, validate=False)

    calls = 0
    for case in garbage_cases(options.seed, options.count):
        run(case)
        calls += 1
    print(f"garbage calls: {calls}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
