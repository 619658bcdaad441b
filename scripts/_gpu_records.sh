# Sourced by scripts/gpu_select_check.sh and scripts/gpu_backward_check.sh with their own arguments and
# `gpu_records_start NAME "$@"`: the checkout's root as the working folder, bench_args for a full run or
# (--smoke) the quick records with one sample, smoke=1 then, $out ($OUT or ./gpu-results), the package from
# this checkout through PYTHONPATH, $py, and $summary begun with the environment. Any other argument: usage,
# exit 2. Then `gpu_records_bench NAME LIMIT FLAGS...` runs the bench on the records FLAGS turn on.
gpu_records_start() {
    local name="$1"
    shift
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    cd "$root" || exit 1
    bench_args=(--samples 10 --min-calls 32)
    smoke=0
    if [[ ${1:-} == --smoke ]]; then
        bench_args=(--quick --samples 1 --min-calls 1)
        smoke=1
    elif [[ $# -gt 0 ]]; then
        echo "usage: scripts/gpu_${name}_check.sh [--smoke]" >&2
        exit 2
    fi
    out="${OUT:-$root/gpu-results}"
    mkdir -p "$out"
    export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
    py="${PYTHON:-python3}"
    summary="$out/summary.txt"
    {
        echo "kpool-cupy $name check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n 1
        "$py" -c "import cupy; print('cupy', cupy.__version__, 'cuda runtime', cupy.cuda.runtime.runtimeGetVersion())" 2>&1
    } > "$summary"
}

# `kpool-cupy bench` on NAME's records alone (FLAGS: the record families to turn on, and off what is on by
# default) within LIMIT seconds: bench-NAME.json, its table and log under $out; its exit status and seconds,
# then its table, appended to $summary. Returns the bench's exit status.
gpu_records_bench() {
    local name="$1" limit="$2" start=$SECONDS code
    shift 2
    timeout -k 2 "$limit" "$py" -m kpool_cupy bench "${bench_args[@]}" --skip torch-compile --no-decode-side \
        --no-fp8 --no-sweep --no-index "$@" --json "$out/bench-$name.json" --table "$out/bench-$name-table.txt" \
        > "$out/bench-$name.log" 2>&1
    code=$?
    echo "bench exit $code, $((SECONDS - start)) s" >> "$summary"
    cat "$out/bench-$name-table.txt" >> "$summary" 2>/dev/null
    return $code
}
