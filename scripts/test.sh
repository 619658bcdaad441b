#!/usr/bin/env bash
# The suite: set up .venv if needed, lint, then pytest. GPU tests skip
# themselves where CuPy has no device.
#
#   scripts/test.sh           the default tier: everything but the long sweeps
#                             and sanitized runs marked `slow` (under 5 minutes here
#                             with a warm build cache; about 6.5 from an empty one)
#   scripts/test.sh --full    everything, as CI runs it, then the tests marked
#                             `torch` on torch 2.11.0 and 2.15.0
#                             (scripts/torch_versions.sh; KPOOL_TORCH_VERSIONS)
#
# Extra arguments go to pytest. The tests run on two worker processes
# (pytest-xdist): most of the suite's time is compiling and sanitized
# emulator runs, one core each; KPOOL_TEST_WORKERS sets another count (0: in
# this process).
KPOOL_VENV=test
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
tier=(-m "not slow")
full=0
if [[ "${1:-}" == "--full" ]]; then
    tier=()
    full=1
    shift
fi
ruff check .
ruff format --check .
python -m pytest -n "${KPOOL_TEST_WORKERS:-2}" "${tier[@]}" "$@"
if [[ "$full" == 1 ]]; then
    bash "$(dirname "${BASH_SOURCE[0]}")/torch_versions.sh"
fi
