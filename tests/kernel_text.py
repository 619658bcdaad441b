"""The text of a test's own kernel (tests/kernels/): kernels/ holds only the package's kernels, so a test prepends
the package headers its kernel needs, and names its lines by their text."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

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


def probe_build(code: str, name: str, symbol: str, arch: str) -> tuple[str, str, str]:
    """Kernel ``name`` of the text ``code`` built for ``arch`` ('sm_NN' or 'sm_NNa'): its PTX, ptxas's report on
    it (the function's line, then its stack and spills) and its SASS (nvdisasm), each cut to the function
    ``symbol`` (its name as compiled: the module holds the file's other kernels too). Skipped where this NVRTC or
    ptxas has no ``arch``."""
    from kpool_cupy.kernel.nvrtc import code_ptx
    from kpool_cupy.tools import sass

    virtual = arch.replace("sm_", "compute_")
    try:
        ptx = code_ptx(code, name, virtual)
    except RuntimeError as error:
        if virtual in str(error):
            pytest.skip(f"this NVRTC has no {virtual}: {error}")
        raise
    ptxas, nvdisasm = sass.find_tool("ptxas"), sass.find_tool("nvdisasm")
    with tempfile.TemporaryDirectory(prefix="kpool-probe-") as folder:
        ptx_file, cubin = Path(folder, "probe.ptx"), Path(folder, "probe.cubin")
        ptx_file.write_text(ptx)
        done = subprocess.run(
            [ptxas, f"-arch={arch}", "-v", str(ptx_file), "-o", str(cubin)], capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0 and arch in done.stderr and "not defined" in done.stderr:
            pytest.skip(f"this ptxas has no {arch}: {done.stderr.strip()}")
        assert done.returncode == 0, done.stderr
        listing = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, timeout=120, check=True)
    (probe_ptx,) = [entry for entry in ptx.split(".entry ") if entry.startswith(symbol + "(")]
    lines = (done.stdout + done.stderr).splitlines()
    (properties,) = [i for i, line in enumerate(lines) if line.endswith(f"Function properties for {symbol}")]
    report = [line for line in lines if f"'{symbol}'" in line] + [lines[properties + 1]]  # its stack and spills
    (probe_sass,) = [section for section in listing.stdout.split("\n.text.") if section.startswith(symbol + ":")]
    return probe_ptx, "\n".join(report), probe_sass
