# Sourced by scripts/gpu_select_check.sh and scripts/gpu_backward_check.sh with their own arguments and
# `gpu_records_start NAME "$@"`: the checkout's root as the working folder, bench_args for a full run or
# (--smoke) the quick records with one sample, smoke=1 then, $out ($OUT or ./gpu-results), the package from
# this checkout through PYTHONPATH, $py, and $summary begun with the environment. Any other argument: usage,
# exit 2.
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
