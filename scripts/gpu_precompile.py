"""Compile every kernel variant the GPU run launches, in parallel processes: scripts/gpu_check.sh's first step.

    python scripts/gpu_precompile.py [--jobs N] [--manifest scripts/gpu_variants.json] [--sm90a]

Each variant of the manifest (scripts/gpu_variants.py writes it) is compiled
and loaded the way the GPU path does it (``kernel_function``: the same
source text, NVRTC options and name expression, so the same key in CuPy's
on-disk kernel cache); the later steps, in processes of their own, then find
every variant in that cache instead of waiting for NVRTC. A variant that
issues wgmma (``builds_for_sm90a``: the scorer's and the fused select's MMA
argument) is an sm_90a cubin instead, built into the GPU path's own cubin
cache (``kernel.nvrtc.kernel_cubin``) and not loaded, so any machine with
NVRTC can build it. ``--sm90a`` adds the sm_90a build of every head_dim-128
scorer and fused-select variant of the manifest (``sm90a_targets``): what
the engine's shapes launch with KPOOL_CUPY_SM90_BUILD=sm_90a, as
scripts/gpu_index_check.py's sm_90a path does. The longest compiles (as
measured when the manifest was written; an sm_90a build as its sm_90 twin)
go first, so the processes finish together. Prints one line per failure and
a summary; exits 1 when a variant failed to compile.
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
ENGINE_HEAD_DIM = 128  # the indexer's head_dim in the engines this package serves: its sm_90a builds are precompiled


def template_arguments(instance: str) -> tuple[str, list[str]]:
    """``name<a, b, c>`` as ("name", ["a", "b", "c"]), in the spelling ``Kernel.instance`` writes (C types hold
    spaces, never commas)."""
    name, _, rest = instance.partition("<")
    return name, rest.removesuffix(">").split(", ") if rest else []


def declared_template(source: str, instance: str) -> dict[str, str]:
    """The template arguments of ``instance`` by parameter name, as spelled (``{"HEAD_DIM": "128", "MMA": "1",
    ...}``); empty for a kernel of ``source`` that is not declared (the inline empty kernel)."""
    from kpool_cupy.kernel import declarations

    name, arguments = template_arguments(instance)
    for kernel in vars(declarations).values():
        if isinstance(kernel, declarations.Kernel) and kernel.name == name and kernel.source == source:
            return dict(zip([t.name for t in kernel.template], arguments, strict=True))
    return {}


def builds_sm90a(source: str, instance: str) -> bool:
    """Whether ``instance`` issues wgmma: an sm_90a build, not the device's plain one."""
    from kpool_cupy.kernel.declarations import builds_for_sm90a

    template = declared_template(source, instance)
    return "MMA" in template and builds_for_sm90a({"MMA": int(template["MMA"])})


def sm90a_targets(variants: list[dict]) -> list[dict]:
    """The sm_90a build (MMA_WGMMA) of every scorer and fused-select variant of ``variants`` at the engine's
    head_dim that takes sm_90's mma.sync (MMA_E4M3_HMMA), with its twin's NVRTC time; those already listed left
    out. A fused select on a 16-byte aligned cache has two twins: its sm_90a launch copies a key tile from one
    page where the pages hold a multiple of 64 pools (VECTOR's INDEX_TILE_PAGES), row by row elsewhere; and each
    of a select's twins has one more that scores tokens of at most 32 heads two to a chain (INDEX_PAIRED_TOKENS)."""
    from kpool_cupy.kernel.declarations import (
        INDEX_LOGITS_FP8,
        INDEX_PAIRED_TOKENS,
        INDEX_SELECT_FP8,
        INDEX_TILE_PAGES,
        INDEX_VECTOR_CACHE,
        MMA_E4M3_HMMA,
        MMA_WGMMA,
    )

    listed = {(v["source"], v["instance"]) for v in variants}
    targets: dict[tuple[str, str], dict] = {}
    for variant in variants:
        template = declared_template(variant["source"], variant["instance"])
        name, arguments = template_arguments(variant["instance"])
        if name not in (INDEX_LOGITS_FP8.name, INDEX_SELECT_FP8.name):
            continue
        if template["HEAD_DIM"] != str(ENGINE_HEAD_DIM) or template["MMA"] != str(MMA_E4M3_HMMA):
            continue
        arguments[list(template).index("MMA")] = str(MMA_WGMMA)
        vectors = [int(template["VECTOR"])]
        if name == INDEX_SELECT_FP8.name:
            if vectors[0] & INDEX_VECTOR_CACHE:
                vectors.append(vectors[0] | INDEX_TILE_PAGES)
            vectors += [vector | INDEX_PAIRED_TOKENS for vector in vectors]  # heads not known here: both
        for vector in vectors:
            arguments[list(template).index("VECTOR")] = str(vector)
            twin = (variant["source"], f"{name}<{', '.join(arguments)}>")
            if twin not in listed:
                targets[twin] = {"source": twin[0], "instance": twin[1], "nvrtc_s": variant.get("nvrtc_s")}
    return list(targets.values())


def compile_variant(source: str, instance: str) -> tuple[str, float, str | None]:
    """Compile and load one variant on device 0, or build an sm_90a one into the cubin cache (nothing loaded):
    (instance, seconds, None), or the error's first line."""
    began = time.perf_counter()
    try:
        if builds_sm90a(source, instance):
            from kpool_cupy.kernel.nvrtc import kernel_cubin

            kernel_cubin(source, instance, "sm_90a")
        elif source == INLINE:
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
    """The manifest's variants."""
    return json.loads(path.read_text())["variants"]


def longest_first(variants: list[dict]) -> list[dict]:
    """``variants``, the longest NVRTC compile first (unmeasured ones last)."""
    return sorted(variants, key=lambda v: -(v.get("nvrtc_s") or 0.0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiling processes")
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument(
        "--sm90a", action="store_true", help="also the sm_90a builds of the scorer and the fused select (wgmma)"
    )
    options = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    variants = load_manifest(options.manifest)
    extra = sm90a_targets(variants) if options.sm90a else []
    began = time.perf_counter()
    failed: set[str] = set()
    slowest = 0.0
    # spawn: no worker inherits a CUDA context (none is made here, but a fork after one would be unusable).
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(options.jobs, 1), mp_context=context) as pool:
        futures = [pool.submit(compile_variant, v["source"], v["instance"]) for v in longest_first(variants + extra)]
        for future in futures:
            instance, seconds, error = future.result()
            slowest = max(slowest, seconds)
            if error is not None:
                failed.add(instance)
                print(f"FAILED {instance}: {error}", flush=True)
    elapsed = time.perf_counter() - began
    measured = sum(v.get("nvrtc_s") or 0.0 for v in variants)
    done = sum(v["instance"] not in failed for v in variants)
    print(
        f"precompiled {done} of {len(variants)} kernel variants in {elapsed:.1f} s with "
        f"{options.jobs} processes (slowest {slowest:.1f} s; NVRTC alone, measured when the manifest was "
        f"written: {measured:.1f} s serial)",
        flush=True,
    )
    if options.sm90a:
        done = sum(v["instance"] not in failed for v in extra)
        print(f"precompiled {done} of {len(extra)} sm_90a builds of the scorer and the fused select", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
