#!/usr/bin/env bash
# Everything a lent GPU machine should run in one call, with nothing to install
# there: that machine has no network but has CuPy (CUDA 13), NumPy, ml_dtypes,
# click, pytest, torch and matplotlib. The package runs from this checkout
# through PYTHONPATH. Exit status: non-zero if any step failed.
#
#     scripts/gpu_check.sh            the real run, results under $OUT (or ./gpu-results)
#     scripts/gpu_check.sh --smoke    the same steps with the quick benchmark, one sample and
#                                     one call per input set: how tests/test_gpu_check_script.py
#                                     runs it on the CPU through tests/cupy_double
#
# What comes back is at most 5 files in $OUT, whatever happens:
#   summary.txt          environment, every step's exit status, limit, seconds and last
#                        line, the precompile's count, the check verdicts, memcheck's
#                        summary, the benchmark tables
#   bench.json           the benchmark (rewritten after every record: host costs, the empty
#                        kernel, the decode side and the FP8 records first, then the sweep),
#                        bench.png its plot (redrawn after every shape of the sweep)
#   bench-compile.json   the quick sweep with torch.compile, cold
#   logs.tar.gz          every step's whole log, and the benchmark's table as it stood
# summary.txt and logs.tar.gz are rewritten after every step, so a run cut
# short keeps what it did.
#
# The first step compiles every kernel variant the later steps launch
# (scripts/gpu_variants.json, recorded on the CuPy double by
# scripts/gpu_variants.py), in parallel processes, into CuPy's on-disk kernel
# cache; no later step waits for NVRTC on its own kernels (CuPy's own array
# kernels, a few dozen small ones, still compile where first used). The GPU
# run adds the sm_90a builds (wgmma) of the scorer and the fused select at
# head_dim 128, into the GPU path's cubin cache.
#
# The check step ends, in the GPU run, with scripts/gpu_index_check.py: the
# scorer and the selection against the reference on each tensor-core path of
# the device (on an H200: the sm_90a build chosen through
# KPOOL_CUPY_SM90_BUILD=sm_90a, plain sm_90, forced f16). The wgmma GPU test
# (tests/test_emulator_wgmma.py) runs in the pytest-gpu step, with every other
# gpu-marked test.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
smoke=0
if [[ ${1:-} == --smoke ]]; then
    smoke=1
elif [[ $# -gt 0 ]]; then
    echo "usage: scripts/gpu_check.sh [--smoke]" >&2
    exit 2
fi
out="${OUT:-$root/gpu-results}"
mkdir -p "$out"
logs="$(mktemp -d)"
trap 'rm -rf "$logs" "$logs.index-rows"' EXIT
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-python3}"
export PATH="$PATH:/usr/local/cuda/bin"  # compute-sanitizer

# Step limits, in seconds: the sum with the 2 s that `timeout` may wait after
# TERM before KILL, per step, is at most 360 s (6 minutes of one call; a cold
# torch.compile included: it has its own step, and the full sweep leaves it
# out).
#
# Sized from the GPU runs so far (H200, driver 580.159.04, CuPy 14.2.0,
# CUDA 13.0, 2026-12-04; docs/benchmarks.md): seconds each step took there,
# with margin; bench gets the rest. In the first run's first try
# (first-try-summary.txt) the bench step was cut at its old 110 s inside the
# FP8 decode records, while every other step used under half of its old
# limit; in its second try every step finished (177 s in all, bench 113 s).
# The scorer's records, added since, took 57 s in a call of their own
# (docs/gpu-runs/2026-12-04-h200/index-bench.json). In the second run
# (docs/gpu-runs/2026-12-04-h200-backward) the bench step was cut at its
# 187 s.
#
# NVRTC, measured on this CPU-only machine (scripts/gpu_variants.py time:
# NVRTC 12.9, 2 cores, 2026-12-06), for the 339 variants of
# scripts/gpu_variants.json (363 less the 25 of kpool_compress_backward_rest,
# which the backward no longer launches, and one more for the ring-close
# records' plain close, 2026-12-05), sm_90 cubins: 128.9 s one after
# another (64.0 when last timed, 2026-12-04: kpool_index_topk's 29 variants
# have grown since from 9.4 to 43.6 s, the fused select's 20 from 15.1 to
# 44.7, the scorer's 6 from 1.3 to 3.0; their sm_90 path's MMA_E4M3_HMMA and e4m3
# builds take the same time); over 16 processes (scripts/gpu_variants.py estimate) 8.1 s. The H200 machine's
# precompile took 8.7 s with 16 processes for 248, slowest variant 4.1 s.
steps=(environment precompile pytest-gpu check memcheck bench bench-compile)
declare -A limit=(
    [environment]=5      # nvidia-smi and versions (2 s on the H200); torch's read from its metadata, not imported
    [precompile]=33      # 339 variants over 16 processes (9 s and 8 s on the H200 for 248, 11 s for 363; 13 s estimated from NVRTC here with a process's start), and 59 sm_90a builds (19 took 9.0 s of NVRTC 12.9 serial on 2 cores; the fused select's one-page twins add 13 of about 2 s each here, its paired twins 27 more, not timed)
    [pytest-gpu]=50      # the gpu-marked tests, kernels precompiled (24 s and 16 s on the H200: 181 passed; the backward's added since, and on 2026-12-05 the DeepGEMM adapter's and a captured decode step's, whose dozen variants the manifest lacks: under 1 s of NVRTC each)
    [check]=50           # kpool-cupy check: compress and its backward on three and two dtypes, every other op on bfloat16 (16 runs: 18 s; 11: 15 s, 12 s); then scripts/gpu_index_check.py on three paths, not yet run on a GPU (estimated 25 s: its float64 references took 10 s on the 2-core CPU machine, a dozen NVRTC compiles, CuPy's start)
    [memcheck]=8         # compute-sanitizer over tests/run_memcheck.py: every family's check and garbage calls (3 s, 2 s, 3 s)
    [bench]=150          # the rest: host costs, empty kernel, decode side, FP8, the scorer (57 s alone), full sweep (113 s); cut at 187 s in the last run (2026-12-04-h200-backward), so a run keeps what it measured before the cut
    [bench-compile]=50   # the quick sweep's three shapes with torch.compile, from a cold start (41 s and 24 s on the H200)
)
kill_after=2
declare -A status seconds
if (( smoke )); then
    # One sample, and no round repeated to 32 calls: the double runs every
    # call on the CPU emulator. The kernels launched are the same.
    bench_args=(--quick --samples 1)
    precompile_sm90a=()  # the double cannot load a cubin: it runs every kernel from its source
    compile_samples=1
    min_calls=1
    # The smoke run goes through the CuPy double on the CPU, where a step's
    # time is the machine's load: a step may take ten times its limit there
    # (a guard against a hang); the table keeps the GPU run's limits.
    limit_scale=10
else
    bench_args=(--samples 10 --skip torch-compile)  # a sample replays a whole round: up to tens of thousands of calls
    precompile_sm90a=(--sm90a)  # for the index check's sm_90a path
    compile_samples=10
    min_calls=32  # calls per captured round at least: the graph's own launch is spread over 32 or more
    limit_scale=1
fi

summary() {  # the whole summary.txt, from what is done so far
    echo "kpool-cupy GPU check$( (( smoke )) && echo ' (smoke run: each step may take ten times its limit)'), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo
    cat "$logs/environment.log" 2>/dev/null
    echo
    printf '%-15s %5s %6s %8s  %s\n' step exit limit seconds "last line"
    local name total=0
    for name in "${steps[@]}"; do
        total=$((total + limit[$name] + kill_after))
        local last=""
        [[ -f $logs/$name.log ]] && last="$(tail -n 1 "$logs/$name.log" | tr -d '\r' | cut -c1-100)"
        printf '%-15s %5s %6s %8s  %s\n' "$name" "${status[$name]:-not run}" "${limit[$name]}" \
            "${seconds[$name]:--}" "$last"
    done
    echo "limits with kill-after: $total s (exit 124 or 137: the step was cut off at its limit)"
    echo
    echo "== precompile"
    grep -E "^(precompiled|FAILED)" "$logs/precompile.log" 2>/dev/null
    echo "== check"
    # Each report's op, the settings it takes (a setting the op does not take is null) and its verdict.
    grep '^{"backend"' "$logs/check.log" 2>/dev/null | "$py" -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    taken = [r["dtype"] or ""] + [f"{n} {r[n]}" for n in ("head_dim", "kpool") if r[n] is not None]
    op, ok = r["op"], str(r["ok"]).lower()
    print(f"{op} " + ", ".join(t for t in taken if t) + f": ok {ok}")'
    grep -E '^index check:' "$logs/check.log" 2>/dev/null  # scripts/gpu_index_check.py's verdict, with every failed row
    echo "== memcheck"
    grep -E "ERROR SUMMARY|garbage calls per op|strided|check cases|never called" "$logs/memcheck.log" 2>/dev/null
    echo "== bench"
    cat "$logs/bench-table.txt" 2>/dev/null  # rewritten after every record: a cut run's table is what it measured
    echo "== bench-compile"
    awk '/^shape +implementation/{p=1} p' "$logs/bench-compile.log" 2>/dev/null
}

pack() {  # summary.txt and logs.tar.gz, rewritten after every step
    summary > "$out/summary.txt"
    tar -czf "$out/logs.tar.gz.tmp" -C "$logs" . && mv "$out/logs.tar.gz.tmp" "$out/logs.tar.gz"
}

run() {  # run NAME COMMAND...: the step's log in $logs, under its limit; then pack
    local name=$1 began=$SECONDS
    shift
    timeout --kill-after="$kill_after" "$((limit[$name] * limit_scale))" "$@" > "$logs/$name.log" 2>&1
    status[$name]=$?
    seconds[$name]=$((SECONDS - began))
    pack
}

run environment bash -c '
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | sed "s/^/gpu: /"
    "$1" - <<"PY"
import importlib.metadata as metadata
import cupy, numpy, ml_dtypes
print("cupy:", cupy.__version__, "| CUDA runtime:", cupy.cuda.runtime.runtimeGetVersion(),
      "| driver:", cupy.cuda.runtime.driverGetVersion(), "| numpy:", numpy.__version__, "| ml_dtypes:", ml_dtypes.__version__)
for name in ("torch", "triton", "matplotlib"):
    try:
        print(f"{name}:", metadata.version(name))
    except metadata.PackageNotFoundError:
        print(f"{name}: not installed")
PY
' environment "$py"
cat "$logs/environment.log"

# Every kernel variant the steps below launch, compiled once into CuPy's disk cache.
run precompile "$py" scripts/gpu_precompile.py ${precompile_sm90a[@]+"${precompile_sm90a[@]}"}

run pytest-gpu "$py" -m pytest -m gpu -p no:cacheprovider -q -rs tests --ignore=tests/test_compress_properties.py  # no hypothesis there
# All skipped means no device was usable: that is a failure here, not a pass.
if [[ ${status[pytest-gpu]} == 0 ]] && ! grep -q " passed" "$logs/pytest-gpu.log"; then
    status[pytest-gpu]=5
    pack
fi

# stdout of each check is its JSON report, one line, in the log with what CuPy says. Then, in the GPU run, the
# index check: one JSON line a case and path, and its verdict. The smoke run leaves it out: the double cannot load
# the sm_90a cubin, and the check's long contexts would take the emulator many minutes.
run check bash -c '
    passed=0 runs=0
    for run in "compress bfloat16" "compress float16" "compress float32" "ring_close bfloat16" \
        "seed_tail bfloat16" "tail_update bfloat16" "expand_topk bfloat16" "compress_fp8 bfloat16" \
        "ring_close_fp8 bfloat16" "tail_update_fp8 bfloat16" "hadamard_quant_fp8 bfloat16" \
        "index_logits_fp8 bfloat16" "index_topk bfloat16" "index_select_fp8 bfloat16" \
        "compress_backward bfloat16" "compress_backward float32"; do
        read -r op dtype <<< "$run"
        runs=$((runs + 1))
        "$1" -m kpool_cupy check --backend cupy --op "$op" --dtype "$dtype" --json && passed=$((passed + 1))
    done
    if [[ $2 == 0 ]]; then
        "$1" scripts/gpu_index_check.py --no-timing | tee "$3"
        index=${PIPESTATUS[0]}
        verdict="index check exit $index"
    else
        index=0
        verdict="index check not run on the double"
    fi
    echo "checks passed: $passed of $runs; $verdict"
    [[ $passed == "$runs" && $index == 0 ]]
' check "$py" "$smoke" "$logs.index-rows"

# The bench times the sm_90a build (wgmma) beside the default one only where this run's index check ran to its
# verdict and passed every sm_90a row (a row's own "ok" closes it): an untried kernel that faults would end the
# bench's process and every record after it.
index_rows="$logs.index-rows"  # the index check's rows, also in check.log
if grep -q '^index check:' "$index_rows" 2> /dev/null && grep -q '"path": "sm_90a"' "$index_rows" &&
    ! grep '"path": "sm_90a"' "$index_rows" | grep -q '"ok": false}$'; then
    export KPOOL_CUPY_BENCH_SM90A=1
fi

if command -v compute-sanitizer > /dev/null; then
    # CuPy's pool off, strided views made on the device, garbage offsets for
    # every op with validate=False: any access outside an array is an error.
    run memcheck compute-sanitizer --tool memcheck --error-exitcode 3 --leak-check no \
        "$py" tests/run_memcheck.py --count 8
else
    echo "compute-sanitizer not found on PATH" > "$logs/memcheck.log"
    status[memcheck]=127
    seconds[memcheck]=0
    pack
fi

# The selection's and the backward's records are left out here: the limits' sum has no room for them (they run on their own:
# the selection's, with kpool_index_topk's and the prefill record under compute-sanitizer, by scripts/gpu_select_check.sh;
# the backward's by scripts/gpu_backward_check.sh).
run bench "$py" -m kpool_cupy bench "${bench_args[@]}" --min-calls "$min_calls" --no-select --no-backward --json "$out/bench.json" \
    --plot "$out/bench.png" --table "$logs/bench-table.txt"
# torch.compile cold, on the quick shapes, against this package alone (the
# other alternatives, the decode side and the FP8 records were measured above).
run bench-compile "$py" -m kpool_cupy bench --quick --samples "$compile_samples" --min-calls "$min_calls" --no-decode-side --no-fp8 --no-index --no-select --no-backward \
    --skip upstream-geometry --skip cupy-composite --skip torch-eager --skip triton --skip torch.ops.kpool --json "$out/bench-compile.json"

echo
awk '/^step +exit/{p=1} /^$/{if (p) exit} p' "$out/summary.txt"
failed=0
for name in "${steps[@]}"; do
    [[ ${status[$name]:-} == 0 ]] || failed=1
done
exit $failed
