"""Finds the CUDA sources and expands them into the one text the compilers see.

This is the only module that knows where ``kernels/`` lives: inside the
installed package (a wheel puts the files at ``kpool_cupy/kernels``) or beside
the package in a source checkout or an editable install.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


def kernels_dir() -> Path:
    """Return the folder holding the ``.cu`` and ``.cuh`` files."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "kernels", package.parent / "kernels"):
        if (candidate / "kpool_compress.cu").is_file():
            return candidate
    raise FileNotFoundError(
        f"kpool-cupy kernel sources not found in {package / 'kernels'} or {package.parent / 'kernels'}; "
        "the installation is incomplete"
    )


@functools.cache
def kernel_source(filename: str) -> str:
    """Return ``filename`` with its local ``#include "..."`` files inlined.

    Compilers get one self-contained text: CuPy's disk cache hashes the text it
    is handed, not the files it includes, so an edited header must change this
    text or a stale binary would load. ``#line`` directives keep compiler
    messages pointing at the real files. Each file is inlined once, like an
    include guard.
    """
    return _expand(kernels_dir(), filename, set())


def _expand(folder: Path, filename: str, seen: set[str]) -> str:
    if filename in seen:
        return ""
    seen.add(filename)
    lines = [f'#line 1 "kernels/{filename}"']
    for number, line in enumerate((folder / filename).read_text().splitlines(), start=1):
        match = _INCLUDE.match(line)
        if match and (folder / match.group(1)).is_file():
            lines.append(_expand(folder, match.group(1), seen))
            lines.append(f'#line {number + 1} "kernels/{filename}"')
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"
