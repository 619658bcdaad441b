"""The text of a test's own kernel (tests/kernels/): kernels/ holds only the package's kernels, so a test prepends
the package headers its kernel needs, and names its lines by their text."""

from __future__ import annotations

from pathlib import Path

from kpool_cupy.kernel.sources import kernel_source

ROOT = Path(__file__).resolve().parent.parent


def kernel_code(source: str, *headers: str) -> str:
    """``headers`` of kernels/ (kpool_portability.h first), then tests' ``source`` under its own file name."""
    return "".join(kernel_source(h) for h in headers) + f'#line 1 "{source}"\n' + (ROOT / source).read_text()


def line_of(source: str, text: str) -> int:
    """The 1-based line of ``source`` that holds ``text`` (stripped), which must occur once."""
    lines = [i for i, line in enumerate((ROOT / source).read_text().splitlines(), start=1) if line.strip() == text]
    assert len(lines) == 1, (text, lines)
    return lines[0]
