"""Which backend runs ``torch.ops.kpool`` on CPU tensors: the NumPy reference (the default) or the emulator.

The emulator runs the CUDA source itself, built for the CPU: on CPU tensors
a developer then gets what the GPU's kernels compute (their float32 sums,
what they leave in a workspace's counters, what they do with garbage
under ``validate=False``), where the reference gives the exact model.

``KPOOL_CUPY_TORCH_CPU=emulate`` (or ``reference``) chooses for a process;
``set_cpu_backend`` chooses in code, over the variable, until it is given
None. Each call reads the choice when it runs, so a compiled graph follows
it too.
"""

from __future__ import annotations

import os
from types import ModuleType

CPU_BACKEND_VARIABLE = "KPOOL_CUPY_TORCH_CPU"
CPU_BACKENDS = ("reference", "emulate")

_chosen: str | None = None


def _checked(name: object, where: str) -> str:
    if name not in CPU_BACKENDS:
        raise ValueError(f"Invalid {where}: expected one of {', '.join(CPU_BACKENDS)}, got {name!r}")
    return str(name)


def set_cpu_backend(name: str | None) -> None:
    """Run ``torch.ops.kpool`` on CPU tensors through ``name`` ("reference" or "emulate"); None: as
    ``KPOOL_CUPY_TORCH_CPU`` says (the reference when it is unset or empty)."""
    global _chosen
    _chosen = None if name is None else _checked(name, "name")


def cpu_backend() -> str:
    """The backend CPU tensors run on now: ``set_cpu_backend``'s choice, else the variable's, else "reference"."""
    if _chosen is not None:
        return _chosen
    return _checked(os.environ.get(CPU_BACKEND_VARIABLE, "") or "reference", CPU_BACKEND_VARIABLE)


def cpu_module() -> ModuleType:
    """The module of the backend CPU tensors run on now (``kpool_cupy.reference`` or ``kpool_cupy.emulate``)."""
    from .. import emulate, reference

    return emulate if cpu_backend() == "emulate" else reference
