#!/usr/bin/env bash
# The whole suite: set up .venv if needed, lint, then pytest. GPU tests skip
# themselves where CuPy has no device. Extra arguments go to pytest.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
ruff check .
ruff format --check .
python -m pytest "$@"
