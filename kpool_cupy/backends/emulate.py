"""The emulate backend: host arrays, each launch run by the CPU emulator on the kernel's own CUDA source."""

from __future__ import annotations

from ..emulator import launch as emulator
from ..ops.framework.spec import Launch
from .host import HostMemory, host_binding


class EmulateBackend(HostMemory):
    def launch(self, launch: Launch) -> None:
        geometry = launch.geometry
        shared = geometry.shared_bytes  # dynamic shared memory a block
        emulator.launch(launch.kernel.source, launch.instance, geometry.grid, geometry.block, launch.arguments, shared)


_BACKEND = EmulateBackend()
BINDING = host_binding("emulate", lambda extras: _BACKEND)
