"""The reference backend: host arrays, each launch run by the kernel's NumPy implementation."""

from __future__ import annotations

import numpy as np

from ..ops.framework.spec import Launch
from .host import HostMemory, host_binding
from .reference_index import KERNELS as INDEX_KERNELS
from .reference_kernels import KERNELS

_KERNELS = KERNELS | INDEX_KERNELS
ACCUMULATE = {"float32": np.float32, "float64": np.float64}


class ReferenceBackend(HostMemory):
    """``accumulate`` is the arithmetic of the pooling: float32 like the kernels', or float64."""

    def __init__(self, accumulate: str = "float32") -> None:
        if accumulate not in ACCUMULATE:
            raise ValueError(f"Invalid accumulate: expected 'float32' or 'float64', got {accumulate!r}")
        self.accumulate = ACCUMULATE[accumulate]

    def launch(self, launch: Launch) -> None:
        _KERNELS[launch.kernel.name](launch, self.accumulate)


_FLOAT32 = ReferenceBackend()
BINDING = host_binding("reference", lambda extras: ReferenceBackend(**extras) if extras else _FLOAT32)
