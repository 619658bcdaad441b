# Sourced by check.sh and test.sh: make .venv if missing and install the
# package (editable) with its test and CUDA 12 extras, and torch's CPU wheel,
# whenever pyproject.toml or this script changed since the last install.
# CUDA 12's CuPy and NVRTC wheels install on a machine without a GPU; they
# give compile_ptx its NVRTC.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [[ ! -x .venv/bin/python ]]; then
    "${PYTHON:-python3}" -m venv .venv
fi
stamp=".venv/.kpool-cupy-installed"
want="$(cat pyproject.toml scripts/_venv.sh | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    # torch for tests/test_torch_*.py: pinned to the CPU wheel on this
    # machine's disk (a bare "torch" would resolve to a CUDA build and its
    # gigabytes of libraries).
    .venv/bin/python -m pip install --quiet -e ".[test,cuda12]" "torch==2.13.0"
    echo "$want" > "$stamp"
fi
export PATH="$root/.venv/bin:$PATH"
