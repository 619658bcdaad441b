"""Where torch is missing, importing a module that needs it says which extra to install."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["kpool_cupy.torch", "kpool_cupy.compat.deep_gemm"])
def test_a_module_that_needs_torch_names_the_extra_without_it(module):
    # A fresh interpreter in which `import torch` fails, as where torch is not installed.
    code = f"import sys; sys.modules['torch'] = None; import {module}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"ImportError: {module} needs PyTorch: pip install 'kpool-cupy[torch]'", done.stderr
