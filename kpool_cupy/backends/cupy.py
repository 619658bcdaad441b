"""The GPU backend: CuPy arrays on one device, each launch a CuPy RawModule function.

CuPy is imported on first use, so ``import kpool_cupy`` works without it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from ..arrays import CupyArray, DeviceArray
from ..kernel.declarations import builds_for_sm90a, tensor_core_for
from ..kernel.nvrtc import kernel_cubin
from ..kernel.sources import NVRTC_OPTIONS, kernel_source
from ..ops.framework.binding import Binding, check_call, checked_before, run_checked
from ..ops.framework.spec import Launch, OpSpec, Option, Spread, gather, spread
from . import cupy_plans as plans
from .cupy_arrays import import_cupy, on_device
from .cupy_launch import launch_function

# Which build of the scorer and the fused select a GPU of compute capability 9.0 runs: "sm_90a" (Hopper's wgmma,
# MMA_WGMMA) or "sm_90" (f16 mma.sync on converted e4m3, MMA_E4M3_HMMA). Other devices do not read it.
SM90_BUILD_VARIABLE = "KPOOL_CUPY_SM90_BUILD"
SM90_BUILDS = ("sm_90a", "sm_90")
# sm_90 while the wgmma kernel has run on the emulator only: the sm_90a build stays opt-in until an H200 run
# passes scripts/gpu_index_check.py on it; then this line becomes "sm_90a".
DEFAULT_SM90_BUILD = "sm_90"

_kernel_lock = threading.Lock()
_kernels: dict[tuple[str, str, int, bool], Any] = {}


def sm90_build(read: tuple[str | None] | None = None) -> str:
    """``KPOOL_CUPY_SM90_BUILD``: "sm_90a" or "sm_90"; ``DEFAULT_SM90_BUILD`` when unset or empty. ``read``: the
    variable as a call read it once (a 1-tuple, its value or None), so that its key and its kernel agree
    whatever another thread sets meanwhile; None reads it now."""
    value = (os.environ.get(SM90_BUILD_VARIABLE) if read is None else read[0]) or ""
    if not value:
        return DEFAULT_SM90_BUILD
    if value not in SM90_BUILDS:
        expected = " or ".join(repr(build) for build in SM90_BUILDS)
        raise ValueError(
            f"Invalid {SM90_BUILD_VARIABLE}: expected {expected} (unset: {DEFAULT_SM90_BUILD!r}), got {value!r}"
        )
    return value


def kernel_function(source: str, name: str, device_id: int, sm90a: bool = False) -> Any:
    """The loaded kernel ``name`` of kernels/``source`` on ``device_id``, compiled once per process.

    The lock makes concurrent first calls compile and load once. A plain
    build is CuPy's RawModule of the source text; across processes CuPy's disk
    cache (keyed by the full text) does the rest. With ``sm90a`` (the kernel
    issues wgmma) NVRTC builds an sm_90a cubin, which RawModule(code=) cannot
    ask for (it appends the device's own -arch): ``kernel.nvrtc.kernel_cubin``
    caches it on disk under ``$XDG_CACHE_HOME/kpool-cupy/cubin`` (``~/.cache``
    without XDG_CACHE_HOME), and RawModule(path=) loads it, the kernel found by
    NVRTC's lowered name. Only a GPU of compute capability 9.0 runs it: another
    device is a ValueError before anything is compiled.
    """
    key = (source, name, device_id, sm90a)
    function = _kernels.get(key)  # a kernel is entered loaded, last: a hit waits for no other thread's compile
    if function is not None:
        return function
    cupy = import_cupy()
    with _kernel_lock:
        function = _kernels.get(key)
        if function is None:
            with cupy.cuda.Device(device_id):
                if sm90a:
                    capability = str(cupy.cuda.Device(device_id).compute_capability)
                    if capability != "90":
                        raise ValueError(
                            f"Invalid device: expected compute capability 9.0 for the sm_90a build of {name}, got "
                            f"sm_{capability} (device {device_id})"
                        )
                    cubin = kernel_cubin(source, name, "sm_90a")
                    function = cupy.RawModule(path=str(cubin.path)).get_function(cubin.lowered_name)
                else:
                    module = cupy.RawModule(code=kernel_source(source), options=NVRTC_OPTIONS, name_expressions=(name,))
                    function = module.get_function(name)
            _kernels[key] = function
        return function


class CupyBackend:
    """Where the GPU path keeps arrays: CuPy, on one device; launches go to the current stream.

    It notes what a call did on the host (copies, allocations) and the
    launches it made, so that a call that only launched can become a plan.
    """

    def __init__(self, cupy: Any, device_id: int, build: tuple[str | None] | None = None) -> None:
        self.cupy = cupy
        self.device_id = device_id
        self.build = build  # KPOOL_CUPY_SM90_BUILD as the call read it for its key (sm90_build's read)
        self.host_work = False
        self.launched: list[tuple[Launch, Any]] = []

    def host_copies(self, arrays: list[Any]) -> list[np.ndarray]:
        # Each 1-D array's bytes into one pinned buffer, copied on the current stream without waiting, then one
        # wait: no kernel on the device (widening to int64 is the host's, as the checks' sums need), one sync.
        self.host_work = True
        cuda = self.cupy.cuda
        stream = cuda.get_current_stream()
        starts, end = [], 0
        for array in arrays:
            starts.append(end)
            end += -(-array.nbytes // 16) * 16  # each copy 16-byte aligned in the buffer
        memory = cuda.alloc_pinned_memory(max(end, 16))
        copies = []
        for array, start in zip(arrays, starts, strict=True):
            copy = np.frombuffer(memory, array.dtype, array.size, start)
            array.get(stream=stream, out=copy, blocking=False)
            copies.append(copy)
        stream.synchronize()
        return [copy.astype(np.int64) for copy in copies]

    def from_host(self, array: np.ndarray) -> Any:
        self.host_work = True
        return self.cupy.asarray(array)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        self.host_work = True
        return self.cupy.zeros(shape, dtype=dtype)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        self.host_work = True
        return self.cupy.empty(shape, dtype=dtype)

    def tensor_core(self) -> int:
        """The scorer's tensor-core instruction for this device: on compute capability 9.0 wgmma (the sm_90a
        build) or f16 mma.sync on converted e4m3 as ``KPOOL_CUPY_SM90_BUILD`` says (``sm90_build``), e4m3 on
        sm_89 and from sm_100, f16 on sm_80 to sm_88."""
        capability = int(self.cupy.cuda.Device(self.device_id).compute_capability)
        kind = tensor_core_for(capability, sm90a=capability == 90 and sm90_build(self.build) == "sm_90a")
        if kind is not None:
            return kind
        raise ValueError(
            f"Invalid device: expected a GPU of compute capability 8.0 or newer (the FP8 scorer runs on tensor "
            f"cores), got sm_{capability} (device {self.device_id})"
        )

    def launch(self, launch: Launch) -> None:
        sm90a = builds_for_sm90a(launch.template)
        kernel = kernel_function(launch.kernel.source, launch.instance, self.device_id, sm90a=sm90a)
        launch_function(kernel, launch.geometry, launch.arguments)
        self.launched.append((launch, kernel))


_BUILD_TAKERS: dict[str, bool] = {}


def _takes_a_build(spec: OpSpec) -> bool:
    """Whether ``spec``'s kernel takes the ``MMA`` template argument, which KPOOL_CUPY_SM90_BUILD can change (the
    scorer and the fused select), so its plans are keyed by the variable too."""
    takes = _BUILD_TAKERS.get(spec.name)
    if takes is None:
        takes = spec.kernel is not None and any(t.name == "MMA" for t in spec.kernel.template)
        _BUILD_TAKERS[spec.name] = takes
    return takes


def build_read(spec: OpSpec) -> tuple[str | None] | None:
    """``KPOOL_CUPY_SM90_BUILD`` read once for a call of ``spec`` (``sm90_build``'s ``read``): its value in a
    1-tuple for the ops that take a build, None for the others."""
    return (os.environ.get(SM90_BUILD_VARIABLE),) if _takes_a_build(spec) else None


def plan_key(
    spec: OpSpec, arrays: tuple[Any, ...], options: dict[str, Any], ndarray: type, build: tuple[str | None] | None
) -> tuple[Any, ...] | None:
    """The key of a call's launch plan (``cupy_plans.signature``, and ``build``, the call's ``build_read``: a
    plan replays the build its first call chose), or None when it can have none."""
    key = plans.signature(spec, arrays, options, ndarray)
    return key + build if key is not None and build is not None else key


def _call(spec: OpSpec, arrays: tuple[Any, ...], options: dict[str, Any], extras: dict[str, Any]) -> Any:
    """A GPU call: its signature's plan when there is one, its checked signature when there is one, the full
    path otherwise (cupy_plans)."""
    cupy = import_cupy()
    stream = extras["stream"]
    # Plans and placement see one array per entry: a split ring's two arrays
    # are two entries.
    flat = spread(spec.operands, arrays)
    # The sm_90 build read once, so the plan's key and the kernel the call picks agree: build_read, inline (the
    # hot path's; _takes_a_build's cache looked up here).
    takes = _BUILD_TAKERS.get(spec.name)
    build = (os.environ.get(SM90_BUILD_VARIABLE),) if takes or (takes is None and _takes_a_build(spec)) else None
    key = plan_key(spec, flat.arrays, options, cupy.ndarray, build)
    # A foreign stream is wrapped inside the arrays' device (on_device): the
    # full path. The current stream or a CuPy stream can take the plan.
    if key is not None and (stream is None or isinstance(stream, cupy.cuda.Stream)):
        result = plans.replay(key, flat.arrays, cupy, stream)  # the stream entered inside its device
        if result is not plans.MISS:
            return result
        known = plans.checked_call(key, flat.arrays, stream)
        if known is not None:
            # The arrays are CuPy's on the signature's device (the key says so); the stream is entered inside it.
            with cupy.cuda.Device(known.device_id):
                if stream is None:
                    return _run(spec, CupyBackend(cupy, known.device_id, build), key, flat, arrays, options, known.call)
                with stream:
                    return _run(spec, CupyBackend(cupy, known.device_id, build), key, flat, arrays, options, known.call)
    with on_device(flat.names, flat.arrays, stream, spec.name) as (cupy, device_id, placed):
        placed_flat = Spread(flat.names, placed, flat.written)
        return _run(
            spec, CupyBackend(cupy, device_id, build), key, placed_flat, gather(spec.operands, arrays, placed), options
        )


def _run(
    spec: OpSpec,
    backend: CupyBackend,
    key: tuple[Any, ...] | None,
    flat: Spread,
    arrays: tuple[Any, ...],
    options: dict[str, Any],
    known: Any = None,
) -> Any:
    """Check (unless ``known``, the call record of the signature's checked call), run, and keep what a later
    call of ``key`` may skip: the checks, or the whole call but its launch (a plan)."""
    if known is None:
        checked = check_call(spec, arrays, options)
        if key is not None:
            extents = tuple(plans.extent(array) for array in flat.arrays)
            written = tuple(i for i, writes in enumerate(flat.written) if writes and flat.arrays[i] is not None)
            plans.remember_checked(key, plans.CheckedCall(checked[0], backend.device_id, extents, written))
    else:
        checked = checked_before(spec, known, arrays)
    result = run_checked(spec, backend, checked, options)
    if key is not None and not backend.host_work and len(backend.launched) == 1:
        ((launch, kernel),) = backend.launched
        plan = plans.make_plan(flat.arrays, flat.written, launch, kernel, backend.device_id, result)
        if plan is not None:
            plans.remember(key, plan)
    return result


BINDING = Binding(
    name="cupy",
    module="kpool_cupy",
    array="DeviceArray",
    result="CupyArray",
    options=(Option("stream", "Any", None),),
    call=_call,
    names=(("DeviceArray", DeviceArray), ("CupyArray", CupyArray)),
)


def _driver_loadable() -> bool:
    """Whether the NVIDIA driver's CUDA library is on this machine at all."""
    import ctypes

    for name in ("libcuda.so.1", "nvcuda.dll"):
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return True
    return False


def gpu_status() -> tuple[bool, str]:
    """Whether CuPy has a usable CUDA device, and if not, why, in plain words: no GPU or driver at all, a
    driver older than CuPy's CUDA, or CUDA's own error."""
    try:
        import cupy
    except ImportError as error:
        return False, f"CuPy is not installed ({error})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # CuPy raises its own CUDA error types here
        if not _driver_loadable():
            return False, "no CUDA GPU or driver found (no NVIDIA driver is installed)"
        if "InsufficientDriver" in str(error):
            version = cupy.cuda.runtime.runtimeGetVersion()
            runtime = f"{version // 1000}.{version % 1000 // 10}"
            return False, f"the NVIDIA driver is older than CuPy's CUDA {runtime} needs ({error})"
        if "NoDevice" in str(error):
            return False, "no CUDA GPU found (the driver sees none)"
        return False, f"no usable CUDA device ({type(error).__name__}: {error})"
    return (count > 0), ("ok" if count > 0 else "no CUDA GPU found (the driver sees none)")
