"""The kernel variants scripts/gpu_check.sh launches, recorded on the CuPy double, and NVRTC's time for each.

    python scripts/gpu_variants.py record     # rewrite scripts/gpu_variants.json from a run on the double
    python scripts/gpu_variants.py time       # compile each with NVRTC here (sm_90 cubin), store the seconds
    python scripts/gpu_variants.py estimate   # the serial total and the time over N processes

``record`` runs ``scripts/gpu_check.sh --smoke`` through tests/cupy_double
(every step: the gpu-marked tests, the checks, the memcheck driver, the
quick benchmark and its torch.compile run) and the full benchmark sweep with
its timing loops cut to a call or four per input set (``sweep-launches``),
with ``CUPY_DOUBLE_LAUNCH_RECORD`` set, so the double writes each kernel a
process launches. The GPU run differs from the smoke run only in the
benchmark's shapes and sample counts, and the second run covers the shapes.
tests/test_gpu_check_script.py checks that both runs launch nothing the
manifest lacks. ``time`` needs NVRTC (the ``cuda12`` extra) but no GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "scripts" / "gpu_variants.json"
DOUBLE = ROOT / "tests" / "cupy_double"
RECORD = "CUPY_DOUBLE_LAUNCH_RECORD"  # tests/cupy_double/cupy: LAUNCH_RECORD
INLINE = "inline"
ARCH = "sm_90"  # an H100's and an H200's: CuPy asks NVRTC for the device's cubin
SPOT_SETS = 4  # calls per implementation in sweep-launches: operand alignments repeat within 4 sets

FAKE_SANITIZER = """#!/bin/sh
# Stands in for compute-sanitizer: drops its options, runs the program.
while [ $# -gt 0 ]; do
    case "$1" in
        --tool|--error-exitcode|--leak-check) shift 2 ;;
        --*) shift ;;
        *) break ;;
    esac
done
exec "$@"
"""

Variant = tuple[str, str]  # (source under kernels/, or "inline"; instance)


def read_record(path: Path) -> set[Variant]:
    """The (source, instance) pairs a launch record holds, the package's kernels only (a ``.cu`` of kernels/, or
    text the package builds, "inline"): a gpu test's own kernel (tests/kernels/, its text after the package's
    headers, so recorded under the first header's name) is compiled by that test, not by the precompile."""
    if not path.is_file():
        return set()
    pairs = {tuple(line.split("\t", 1)) for line in path.read_text().splitlines() if line}
    return {pair for pair in pairs if not pair[0].endswith((".h", ".cuh"))}  # type: ignore[misc]


def double_env(record: Path, **extra: str) -> dict[str, str]:
    """The environment that runs the GPU path on the double and records its launches into ``record``."""
    path = os.pathsep.join(filter(None, [str(DOUBLE), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return {**os.environ, "PYTHONPATH": path, RECORD: str(record), **extra}


def smoke_launches(work: Path, timeout: int = 3600) -> tuple[set[Variant], subprocess.CompletedProcess[str]]:
    """Run ``scripts/gpu_check.sh --smoke`` on the double (a stand-in compute-sanitizer on PATH); what it launched."""
    record = work / "smoke-launches.tsv"
    record.unlink(missing_ok=True)
    bin_dir = work / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    sanitizer = bin_dir / "compute-sanitizer"
    sanitizer.write_text(FAKE_SANITIZER)
    sanitizer.chmod(0o755)
    env = double_env(record, OUT=str(work / "out"), PYTHON=sys.executable)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--smoke"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return read_record(record), done


def sweep_launches(work: Path, timeout: int = 3600) -> set[Variant]:
    """What the full benchmark (every shape, the decode side, the FP8 records) launches, on the double."""
    record = work / "sweep-launches.tsv"
    record.unlink(missing_ok=True)
    subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "sweep-launches"],
        env=double_env(record), cwd=ROOT, check=True, timeout=timeout,
    )  # fmt: skip
    return read_record(record)


def run_sweep_once() -> None:
    """The full sweep with every timing loop cut to ``SPOT_SETS`` calls (kernel variants do not depend on how
    often a call repeats); run inside the double."""
    from kpool_cupy.bench import host_step, run, tail_fp8, timing
    from kpool_cupy.bench.impls import IMPLEMENTATIONS
    from kpool_cupy.bench.shapes import sweep

    def once(call: Any, sets: int, samples: int, refusal: str | None = None) -> tuple[list[float], str, None]:
        for i in range(min(sets, SPOT_SETS)):
            call(i)
        return [1.0], timing.GRAPH, None

    def host_once(call: Any, calls: int = 1, repeats: int = 1) -> float:
        call()
        return 1.0

    timing.device_times = once
    run.host_call_microseconds = tail_fp8.host_call_microseconds = host_step.host_call_microseconds = host_once
    run.graph_replay_milliseconds = lambda call, replays=1: host_once(call)
    # The decode step's host records at the quick step: the full one's scorer and selections take minutes a call
    # on the emulator, and launch the same variants (head_dim 128, the 512-entry buffer every pool_topk up to
    # 512 takes, the same index types and alignment).
    full = host_step.decode_step_host_costs
    run.decode_step_host_costs = lambda repeats=1, quick=False: full(repeats, quick=True)
    chosen = [name for name in IMPLEMENTATIONS if name != "torch-compile"]  # as gpu_check.sh's bench step
    # The scorer's records are left out: their inputs reach gigabytes (128K tokens of context at 512 requests),
    # and every one launches the variant the smoke run's quick records launch (head_dim 128, e4m3, every
    # operand 16-byte aligned, int32 offsets and lengths). The selection's records are not in gpu_check.sh's
    # bench step at all.
    run.run_sweep(sweep(False), chosen, 1, contextlib.nullcontext, quick=False, index=False, select=False)


def nvrtc_seconds(source: str, instance: str) -> float:
    """Wall time of one NVRTC compile of the variant to a cubin for ARCH, as CuPy makes it."""
    from kpool_cupy.bench.empty import EMPTY_KERNEL
    from kpool_cupy.kernel import nvrtc

    code = EMPTY_KERNEL if source == INLINE else nvrtc.kernel_source(source)
    began = time.perf_counter()
    nvrtc.compile_code(code, source, instance, [f"--gpu-architecture={ARCH}"], "cubin")
    return time.perf_counter() - began


def parallel_seconds(seconds: list[float], jobs: int) -> float:
    """The makespan of the compiles over ``jobs`` processes, longest first (as gpu_precompile.py hands them out)."""
    finish = [0.0] * max(jobs, 1)
    for s in sorted(seconds, reverse=True):
        heapq.heapreplace(finish, finish[0] + s)
    return max(finish)


def write_manifest(variants: set[Variant], timed: dict[Variant, float], note: dict[str, Any]) -> None:
    rows = [
        {"source": source, "instance": instance, "nvrtc_s": round(timed[(source, instance)], 3)}
        if (source, instance) in timed
        else {"source": source, "instance": instance}
        for source, instance in sorted(variants)
    ]
    MANIFEST.write_text(json.dumps({"measured": note, "variants": rows}, indent=1) + "\n")


def load() -> tuple[dict[str, Any], set[Variant], dict[Variant, float]]:
    if not MANIFEST.is_file():
        return {}, set(), {}
    data = json.loads(MANIFEST.read_text())
    variants = {(v["source"], v["instance"]) for v in data["variants"]}
    timed = {(v["source"], v["instance"]): v["nvrtc_s"] for v in data["variants"] if "nvrtc_s" in v}
    return data.get("measured", {}), variants, timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["record", "time", "estimate", "sweep-launches"])
    parser.add_argument("--jobs", type=int, default=16, help="processes for estimate (a lent GPU machine has 16)")
    options = parser.parse_args()
    if options.command == "sweep-launches":
        run_sweep_once()
        return 0
    note, variants, timed = load()
    if options.command == "record":
        if not MANIFEST.is_file():  # the run's precompile step reads it
            write_manifest(set(), {}, {})
        with tempfile.TemporaryDirectory(prefix="gpu-variants-") as work:
            smoke, done = smoke_launches(Path(work))
            if done.returncode != 0:
                print(done.stdout[-4000:], done.stderr[-4000:], file=sys.stderr)
                return 1
            found = smoke | sweep_launches(Path(work))
        write_manifest(found, timed, note)
        print(f"{len(found)} variants ({len(found - variants)} new, {len(variants - found)} gone)")
        return 0
    if options.command == "time":
        from cupy_backends.cuda.libs import nvrtc as bindings

        timed = {variant: nvrtc_seconds(*variant) for variant in sorted(variants)}
        version = ".".join(str(n) for n in bindings.getVersion())
        note = {"nvrtc": version, "arch": ARCH, "cpus_here": os.cpu_count(), "serial_s": round(sum(timed.values()), 1)}
        write_manifest(variants, timed, note)
    seconds = list(timed.values())
    print(
        f"{len(variants)} variants, {len(seconds)} timed: NVRTC {sum(seconds):.1f} s serial here, "
        f"{parallel_seconds(seconds, options.jobs):.1f} s over {options.jobs} processes (compiles alone), "
        f"slowest {max(seconds, default=0):.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
