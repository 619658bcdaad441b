#!/usr/bin/env bash
# Everything a lent GPU machine should run in one call, with nothing to install
# there: that machine has no network but has CuPy (CUDA 13), NumPy, ml_dtypes,
# click, pytest, torch and matplotlib. The package runs from this checkout
# through PYTHONPATH. Logs and results go to $OUT (or ./gpu-results); a summary
# table is printed last. Exit status: non-zero if any step failed.
#
# The per-step limits add up to 5 minutes, the budget of one call, so a slow
# step is cut off instead of starving the rest. The full benchmark sweep
# leaves torch.compile out (it compiles per shape); the quick sweep after it
# includes it and is the first thing to lose when time is short.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-$root/gpu-results}"
mkdir -p "$out"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-python3}"
export PATH="$PATH:/usr/local/cuda/bin"  # compute-sanitizer
declare -A status

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
    "$py" - <<'PY' 2>&1
import cupy, numpy, ml_dtypes
print("cupy:", cupy.__version__, "| CUDA runtime:", cupy.cuda.runtime.runtimeGetVersion(),
      "| driver:", cupy.cuda.runtime.driverGetVersion(), "| numpy:", numpy.__version__, "| ml_dtypes:", ml_dtypes.__version__)
try:
    import torch
    print("torch:", torch.__version__, "cuda", torch.version.cuda)
except ImportError:
    print("torch: not installed")
PY
} > "$out/environment.txt"
cat "$out/environment.txt"

run() {  # run NAME TIMEOUT COMMAND...: log to $out/NAME.log, remember the exit status
    local name=$1 limit=$2
    shift 2
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    status[$name]=$?
}

run pytest-gpu 75 "$py" -m pytest -m gpu -p no:cacheprovider -q -rs tests --ignore=tests/test_properties.py  # no hypothesis there
# All skipped means no device was usable: that is a failure here, not a pass.
if [[ ${status[pytest-gpu]} == 0 ]] && ! grep -q " passed" "$out/pytest-gpu.log"; then
    status[pytest-gpu]=5
fi
for dtype in bfloat16 float16 float32; do
    # stdout alone is the JSON report; anything CuPy says goes to the log.
    timeout 20 "$py" -m kpool_cupy check --backend cupy --dtype "$dtype" --json \
        > "$out/check-$dtype.json" 2> "$out/check-$dtype.log"
    status[check-$dtype]=$?
    head -c 300 "$out/check-$dtype.json" >> "$out/check-$dtype.log"
done
if command -v compute-sanitizer > /dev/null; then
    run memcheck 35 compute-sanitizer --tool memcheck --error-exitcode 3 \
        "$py" -m kpool_cupy check --backend cupy --kpool 4
    # Garbage offsets with validate=False (tests/garbage.py): any access
    # outside the arrays is a memcheck error.
    run memcheck-garbage 35 compute-sanitizer --tool memcheck --error-exitcode 3 \
        "$py" tests/run_garbage.py --backend cupy --count 60
else
    for name in memcheck memcheck-garbage; do
        echo "compute-sanitizer not found on PATH" > "$out/$name.log"
        status[$name]=127
    done
fi
run bench 75 "$py" -m kpool_cupy bench --samples 20 --skip torch-compile --json "$out/bench.json" --plot "$out/bench.png"
run bench-compile 20 "$py" -m kpool_cupy bench --quick --samples 10 --json "$out/bench-quick.json"

echo
echo "step                 exit  last line"
failed=0
for name in pytest-gpu check-bfloat16 check-float16 check-float32 memcheck memcheck-garbage bench bench-compile; do
    code=${status[$name]:-?}
    [[ $code == 0 ]] || failed=1
    printf '%-20s %5s  %s\n' "$name" "$code" "$(tail -n 1 "$out/$name.log" | cut -c1-100)"
done
exit $failed
