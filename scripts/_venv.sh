# Sourced by check.sh (the main job) and test.sh: make .venv if missing and
# install what the caller needs (KPOOL_VENV: main or test), again whenever
# pyproject.toml or this script changed since that install.
#
#   main  the package alone (NumPy, ml_dtypes, click), which runs the check
#         on the emulator with the host C++ compiler; where an NVIDIA driver
#         is present, CuPy and NVRTC for the driver's CUDA as well, so the
#         check runs on the GPU.
#   test  the package with its test and CUDA 12 extras (CuPy's and NVRTC's
#         wheels install without a GPU and give compile_ptx its NVRTC), and
#         torch 2.13.0's CPU build for tests/test_torch_*.py: the wheel in
#         pip's find-links where there is one, else from PyTorch's CPU index
#         (a bare "torch" from PyPI is a CUDA build of several GB).
# A test install serves the main job too.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [[ ! -x .venv/bin/python ]]; then
    "${PYTHON:-python3}" -m venv .venv
fi
what="${KPOOL_VENV:-test}"
want="$(cat pyproject.toml scripts/_venv.sh | sha256sum | cut -d' ' -f1)"
installed() { [[ -f ".venv/.kpool-cupy-$1" && "$(cat ".venv/.kpool-cupy-$1")" == "$want" ]]; }

# The CuPy extra for this machine's NVIDIA driver (cuda12 or cuda13), empty without one.
driver_extra() {
    command -v nvidia-smi > /dev/null || return 0
    local major
    major="$(nvidia-smi 2> /dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\)\..*/\1/p' | head -n 1)"
    if [[ "$major" == 12 ]]; then echo cuda12; elif [[ -n "$major" && "$major" -ge 13 ]]; then echo cuda13; fi
}

# pip's find-links folders hold a torch 2.13.0 wheel.
local_torch() {
    local folder
    for folder in $(.venv/bin/python -m pip config get global.find-links 2> /dev/null; echo "${PIP_FIND_LINKS:-}"); do
        compgen -G "$folder/torch-2.13.0*.whl" > /dev/null && return 0
    done
    return 1
}

if ! installed "$what" && ! { [[ "$what" == main ]] && installed test; }; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    if [[ "$what" == main ]]; then
        extra="$(driver_extra)"
        .venv/bin/python -m pip install --quiet -e ".${extra:+[$extra]}"
    else
        .venv/bin/python -m pip install --quiet -e ".[test,cuda12]"
        if local_torch; then
            .venv/bin/python -m pip install --quiet "torch==2.13.0"
        else
            .venv/bin/python -m pip install --quiet "torch==2.13.0" --extra-index-url https://download.pytorch.org/whl/cpu
        fi
    fi
    echo "$want" > ".venv/.kpool-cupy-$what"
fi
export PATH="$root/.venv/bin:$PATH"
