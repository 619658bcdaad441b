#!/usr/bin/env bash
# Issue 34's GPU run in one call, after scripts/gpu_check.sh's own (or alone):
#
#     scripts/gpu_select_check.sh            results under $OUT (or ./gpu-results)
#     scripts/gpu_select_check.sh --smoke    the quick records, one sample, memcheck's program at a small
#                                            shape: how tests/test_gpu_select_script.py runs it on the CPU
#                                            through tests/cupy_double
#
#   bench-select.json    `kpool-cupy bench --select` alone: the fused select against its two-step and a torch
#                        composite (the `select ...` records), then kpool_index_topk against torch.topk (the
#                        `topk ...` records); rewritten after every record, so a cut run keeps what it measured
#   memcheck-select.log  compute-sanitizer memcheck over scripts/gpu_select_memcheck.py: the select bench's
#                        prefill-1x2048 record's calls once each (the device assert docs/benchmarks.md reports),
#                        the whole log
#   summary.txt          each step's exit status and seconds, the bench's table, memcheck's verdict lines
#
# The package runs from this checkout through PYTHONPATH; nothing is installed. Limits: the bench 420 s (14
# select records took about 3 minutes in the 2026-12-04 run; the 6 topk records are smaller), memcheck 150 s.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_gpu_records.sh"
gpu_records_start select "$@"
memcheck_args=()
(( smoke )) && memcheck_args=(--quick)
export PATH="$PATH:/usr/local/cuda/bin"  # compute-sanitizer
failed=0

gpu_records_bench select 420 --no-backward --select || failed=1

start=$SECONDS
if command -v compute-sanitizer > /dev/null; then
    timeout -k 2 150 compute-sanitizer --tool memcheck --error-exitcode 3 --leak-check no \
        "$py" scripts/gpu_select_memcheck.py "${memcheck_args[@]}" > "$out/memcheck-select.log" 2>&1
    code=$?
else
    echo "compute-sanitizer not found on PATH" > "$out/memcheck-select.log"
    code=127
fi
echo "memcheck exit $code, $((SECONDS - start)) s" >> "$summary"
(( code == 0 )) || failed=1
grep -E "^call |ERROR SUMMARY|rows equal|fused ==|skipped" "$out/memcheck-select.log" >> "$summary"
exit $failed
