#!/usr/bin/env bash
# The whole suite: set up .venv if needed, lint, then pytest. GPU tests skip
# themselves where CuPy has no device. Extra arguments go to pytest. The
# tests run on two worker processes (pytest-xdist): most of the suite's time
# is compiling and sanitized emulator runs, one core each; KPOOL_TEST_WORKERS
# sets another count (0: in this process).
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
ruff check .
ruff format --check .
python -m pytest -n "${KPOOL_TEST_WORKERS:-2}" "$@"
