#!/usr/bin/env bash
# The tests marked `torch` (tests/conftest.py: those that import torch) on the
# oldest and the newest torch the [torch] extra takes, each in a venv of its
# own; `scripts/test.sh --full` (what CI runs) calls this after the suite,
# whose .venv runs torch 2.13.0's CPU build.
#
#   KPOOL_TORCH_VERSIONS   the releases, space-separated (default "2.11.0 2.15.0");
#                          empty: run none
#
# PyPI's Linux builds of these releases are CUDA 13 builds (5.1 and 5.8 GB
# installed here); they run on the CPU. Each venv holds the
# package's dependencies with its test, cuda13 and torch extras (the cuda12
# extra's CUDA 12 toolkit conflicts with the CUDA 13 one these torch builds
# pin; the torch extra's range must admit the release), not the package: the
# checkout's own code runs, through PYTHONPATH. The venvs live in
# $XDG_CACHE_HOME/kpool-cupy/torch-venvs (default ~/.cache/...), so a clean
# clone (CI) reuses them, and are made again when pyproject.toml, this script
# or the Python changes, or a venv's torch no longer imports. Machine-wide pip
# constraints (this machine's /etc/xdg/pip caps torch at 2.14.1) are lifted for
# these installs only, with an empty PIP_CONSTRAINT file: each pins its torch
# exactly. Every release runs; the script fails after the last if any failed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
versions="${KPOOL_TORCH_VERSIONS-2.11.0 2.15.0}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}"
[[ "$cache" == /* ]] || cache="$HOME/.cache"  # the XDG rule: a relative path is ignored
venvs="$cache/kpool-cupy/torch-venvs"
python="${PYTHON:-python3}"
want="$({ cat "$root/pyproject.toml" "${BASH_SOURCE[0]}"; "$python" -VV; } | sha256sum | cut -d' ' -f1)"
failed=()

for version in $versions; do
    venv="$venvs/torch-$version"
    if [[ ! -f "$venv/.kpool-cupy-$want" ]] || ! "$venv/bin/python" -c "import torch" 2> /dev/null; then
        echo "torch $version: making $venv"
        rm -rf "$venv"
        mkdir -p "$venvs"
        "$python" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --upgrade pip
        PIP_CONSTRAINT=/dev/null "$venv/bin/python" -m pip install --quiet "$root[test,cuda13,torch]" "torch==$version"
        "$venv/bin/python" -m pip uninstall --quiet --yes kpool-cupy
        echo "$want" > "$venv/.kpool-cupy-$want"
    fi
    got="$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')"
    if [[ "$got" != "$version" ]]; then
        echo "torch $version: the venv holds torch $got" >&2
        exit 1
    fi
    echo "torch $version: the tests marked torch"
    if ! (cd "$root" && PYTHONPATH="$root" "$venv/bin/python" -m pytest -p no:cacheprovider \
        -n "${KPOOL_TEST_WORKERS:-2}" -m torch -q); then
        failed+=("$version")
    fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "the tests marked torch failed on torch ${failed[*]}" >&2
    exit 1
fi
