"""Compile every kernel variant the GPU run launches, in parallel processes: scripts/gpu_check.sh's first step.

    python scripts/gpu_precompile.py [--jobs N] [--manifest scripts/gpu_variants.json]

Each variant of the manifest (scripts/gpu_variants.py writes it) is compiled
and loaded the way the GPU path does it (``kernel_function``: the same
source text, NVRTC options and name expression, so the same key in CuPy's
on-disk kernel cache); the later steps, in processes of their own, then find
every variant in that cache instead of waiting for NVRTC. The longest
compiles (as measured when the manifest was written) go first, so the
processes finish together. Prints one line per failure and a summary; exits
1 when a variant failed to compile.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "scripts" / "gpu_variants.json"
INLINE = "inline"  # the source of the benchmark's empty kernel, whose text is kpool_cupy.bench.empty's


def compile_variant(source: str, instance: str) -> tuple[str, float, str | None]:
    """Compile and load one variant on device 0: (instance, seconds, None), or the error's first line."""
    began = time.perf_counter()
    try:
        if source == INLINE:
            from kpool_cupy.bench.empty import EMPTY_NAME, empty_kernel

            if instance != EMPTY_NAME:
                raise ValueError(f"Invalid instance: expected {EMPTY_NAME!r} for an inline kernel, got {instance!r}")
            empty_kernel()
        else:
            from kpool_cupy.backends.cupy import kernel_function

            kernel_function(source, instance, 0)
    except Exception as error:  # every failure is reported by name; the others still compile
        lines = str(error).splitlines()
        return instance, time.perf_counter() - began, f"{type(error).__name__}: {lines[0] if lines else ''}"
    return instance, time.perf_counter() - began, None


def load_manifest(path: Path) -> list[dict]:
    """The manifest's variants, the longest NVRTC compile first (unmeasured ones last)."""
    variants = json.loads(path.read_text())["variants"]
    return sorted(variants, key=lambda v: -(v.get("nvrtc_s") or 0.0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiling processes")
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    options = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    variants = load_manifest(options.manifest)
    began = time.perf_counter()
    failed = 0
    slowest = 0.0
    # spawn: no worker inherits a CUDA context (none is made here, but a fork after one would be unusable).
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(options.jobs, 1), mp_context=context) as pool:
        futures = [pool.submit(compile_variant, v["source"], v["instance"]) for v in variants]
        for future in futures:
            instance, seconds, error = future.result()
            slowest = max(slowest, seconds)
            if error is not None:
                failed += 1
                print(f"FAILED {instance}: {error}", flush=True)
    elapsed = time.perf_counter() - began
    measured = sum(v.get("nvrtc_s") or 0.0 for v in variants)
    print(
        f"precompiled {len(variants) - failed} of {len(variants)} kernel variants in {elapsed:.1f} s with "
        f"{options.jobs} processes (slowest {slowest:.1f} s; NVRTC alone, measured when the manifest was "
        f"written: {measured:.1f} s serial)",
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
