#!/usr/bin/env bash
# Issue 35's backward records in one call, after scripts/gpu_check.sh's own (whose bench leaves them out for
# time) or alone:
#
#     scripts/gpu_backward_check.sh            results under $OUT (or ./gpu-results)
#     scripts/gpu_backward_check.sh --smoke    the quick record, one sample: how
#                                              tests/test_gpu_backward_script.py runs it on the CPU through
#                                              tests/cupy_double
#
#   bench-backward.json  `kpool-cupy bench --backward` alone: kpool_compress_backward (its pooling launch and
#                        its ape sum, in one graph replay) against a copy of the same bytes and torch autograd
#                        through an eager implementation, at B1, B8 and B32 x 4,096 tokens, head_dim 128,
#                        kpool 4 (the `backward ...` records issue 35 names); rewritten after every record
#   summary.txt          the environment, the bench's exit status and seconds, its table
#
# The package runs from this checkout through PYTHONPATH; nothing is installed. Limit: 240 s (the three
# records' own wall times added to 19 s in the 2026-12-04 run, 15 of them the first's, its builds included:
# docs/gpu-runs/2026-12-04-h200-backward/bench-backward-rounds.json).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_gpu_records.sh"
gpu_records_start backward "$@"

gpu_records_bench backward 240 --no-select --backward || exit 1
