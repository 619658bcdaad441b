"""Finds the CUDA sources and expands them into the one text the compilers see.

This is the only module that knows where ``kernels/`` lives: inside the
installed package (a wheel puts the files at ``kpool_cupy/kernels``) or beside
the package in a source checkout or an editable install.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path, PurePosixPath

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')

# Options every NVRTC compile of these sources gets, on the GPU path and in
# compile_ptx alike. No automatic multiply-add contraction: the kernels spell
# out the fmaf they mean, so the device rounds where the emulator (built
# -ffp-contract=off) does.
NVRTC_OPTIONS = ("-std=c++17", "--fmad=false")
# What CuPy's RawModule appends to every compile (besides -arch); the
# compile-only tools add it too, so their PTX is the code CuPy runs.
CUPY_ADDS = ("-ftz=true",)


def kernels_dir() -> Path:
    """Return the folder holding the ``.cu`` and ``.cuh`` files."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "kernels", package.parent / "kernels"):
        if (candidate / "kpool_compress.cu").is_file():
            return candidate
    raise FileNotFoundError(
        f"kpool-cupy kernel sources not found in {package / 'kernels'} or {package.parent / 'kernels'}; "
        "the installation is incomplete"
    )


@functools.cache
def kernel_source(filename: str) -> str:
    """Return ``filename`` (a path under ``kernels/``) with its local ``#include "..."`` files inlined.

    Compilers get one self-contained text: CuPy's disk cache hashes the text it
    is handed, not the files it includes, so an edited header must change this
    text or a stale binary would load. Includes resolve against the including
    file's folder, as a C preprocessor's do. ``#line`` directives keep compiler
    messages pointing at the real files. Each file is inlined once, like an
    include guard.
    """
    return _expand(kernels_dir(), PurePosixPath(filename), set())


def _expand(root: Path, name: PurePosixPath, seen: set[str]) -> str:
    key = _normalize(name)
    if key in seen:
        return ""
    seen.add(key)
    lines = [f'#line 1 "kernels/{key}"']
    for number, line in enumerate((root / key).read_text().splitlines(), start=1):
        match = _INCLUDE.match(line)
        included = PurePosixPath(_normalize(name.parent / match.group(1))) if match else None
        if included is not None and (root / str(included)).is_file():
            lines.append(_expand(root, included, seen))
            lines.append(f'#line {number + 1} "kernels/{key}"')
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def _normalize(path: PurePosixPath) -> str:
    """``bench/../kpool_common.cuh`` as ``kpool_common.cuh``; a path leaving kernels/ is an error."""
    parts: list[str] = []
    for part in path.parts:
        if part == "..":
            if not parts:
                raise ValueError(f"kernel source path {path} leaves kernels/")
            parts.pop()
        elif part != ".":
            parts.append(part)
    return "/".join(parts)
