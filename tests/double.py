"""Python in a subprocess that imports tests/cupy_double/ as ``cupy``: CuPy over NumPy, kernels on the emulator.

The one way the tests run code under the double: the double first on
PYTHONPATH, then the checkout, the checkout as the working directory. The
double proves nothing about CUDA itself (tests/cupy_double/README.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOUBLE = ROOT / "tests" / "cupy_double"


def run_on_double(
    args_or_code: str | Sequence[str], *, timeout: float, extra_path: Sequence[str | Path] = ()
) -> subprocess.CompletedProcess[str]:
    """``python -c CODE`` (a string) or ``python ARGS...`` (a sequence) with the double as ``cupy``.

    ``extra_path`` goes on PYTHONPATH before the double (a pytest plugin, say).
    ``timeout`` (seconds) guards against a hang: size it at ten times the
    call's normal run. Output is captured as text; the caller checks it.
    """
    args = ["-c", args_or_code] if isinstance(args_or_code, str) else list(args_or_code)
    path = os.pathsep.join([*map(str, extra_path), str(DOUBLE), str(ROOT)])
    return subprocess.run(
        [sys.executable, *args],
        env={**os.environ, "PYTHONPATH": path},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
