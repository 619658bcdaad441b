"""One kernel launch on the GPU: CuPy's call with the geometry's dynamic shared memory, opted in where it must be.

A launch may give each block dynamic shared memory (``shared_mem``, what
``KP_DYNAMIC_SHARED`` names in the kernel). CUDA fails a launch whose bytes
exceed the function's ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``,
which starts at 48 KB (less the function's static shared memory) and is
raised per function, up to the device's opt-in limit (227 KB on Hopper);
CuPy's ``RawKernel`` sets it through ``max_dynamic_shared_size_bytes``, on
the current device's copy of the function. The attribute stays with the
loaded function, so a launch plan's replay (``cupy_plans``), which launches
the function its full call opted in, passes ``shared_mem`` and nothing more.
"""

from __future__ import annotations

import threading
from typing import Any

from ..kernel.geometry import LaunchGeometry

# What a function allows without opting in: 48 KB of shared memory a block, static and dynamic together.
DEFAULT_SHARED_BYTES = 48 * 1024

# Raising the attribute reads it first, and two threads launching one function must not lower each other's.
_opt_in_lock = threading.Lock()


def launch_function(function: Any, geometry: LaunchGeometry, arguments: tuple[Any, ...]) -> None:
    """Launch a loaded kernel (CuPy's ``RawKernel``) over ``geometry`` on the current device and stream.

    A launch with dynamic shared memory first raises the function's
    ``max_dynamic_shared_size_bytes`` to ``geometry.shared_bytes`` where it
    is lower (never lowers it: another launch may need more). Without that,
    CUDA refuses any launch above 48 KB, and one of less when the kernel's
    static shared memory fills the rest of the 48. A launch without dynamic
    shared memory touches no attribute.
    """
    shared = geometry.shared_bytes
    if shared > 0:
        with _opt_in_lock:
            if function.max_dynamic_shared_size_bytes < shared:
                function.max_dynamic_shared_size_bytes = shared
    function((geometry.grid,), (geometry.block,), arguments, shared_mem=shared)
