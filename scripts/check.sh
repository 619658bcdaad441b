#!/usr/bin/env bash
# The main job: set up .venv if needed (the package alone, and CuPy where an
# NVIDIA driver is present; scripts/_venv.sh), then check the kernel against
# the float64 reference on this machine (the GPU when CuPy has one, else the
# CUDA source run on the CPU). Extra arguments go to `kpool-cupy check`.
KPOOL_VENV=main
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
kpool-cupy check "$@"
