"""torch.ops.kpool's CUDA kernels for a script run on the CuPy double (tests/double.py): CPU tensors stand in
for CUDA ones, read through NumPy views, and ``current[0]`` for torch's current stream (the null stream; a test
sets a capturing one). Importing it rewires ``kpool_cupy.torch.kernels`` for the whole process, so only such a
script imports it (with tests/ on sys.path)."""

from __future__ import annotations

from typing import Any

import cupy  # the double, first on PYTHONPATH
import numpy as np
from cupy import cuda
from test_torch_ops import from_numpy

from kpool_cupy.torch import kernels
from kpool_cupy.torch.schema import SPECS, overloads
from kpool_cupy.torch.tensors import to_numpy

current = [cuda.Stream.null]
real_launch_stream = kernels._launch_stream  # for a test of the lookup itself
kernels._torch_stream = lambda device: current[0]
kernels._launch_stream = lambda device_id: current[0]
kernels.to_cupy = lambda name, tensor: to_numpy(name, tensor).view(cupy.ndarray)
kernels.from_cupy = lambda array: from_numpy(np.asarray(array).view(np.ndarray))


def op(name: str, overload: str = "") -> Any:
    """The CUDA kernel of op ``name``'s ``overload`` ("": the default), as torch.ops.kpool registers it."""
    spec = next(s for s in SPECS if s.name == name)
    return kernels.cuda_kernel(spec, next(o for o in overloads(spec) if o.name == overload))
