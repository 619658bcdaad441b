"""Another framework's arrays at the wrong door: each error names a door that takes them, never one that sends
them back (a torch CPU tensor went from the GPU path to kpool_cupy.reference and back, a JAX CPU array too)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import kpool_cupy
from kpool_cupy import emulate, reference
from kpool_cupy.ops import OPS
from kpool_cupy.ops.framework.examples import example_batch

CPU_BACKENDS = {"emulate": emulate, "reference": reference}


class DLPackOnly:
    """A host array that exports DLPack and nothing else: numpy.asarray would make a 0-d object array of it."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return (1, 0)


class HostDLPack(DLPackOnly):
    """A host array of some other framework (JAX's CPU arrays look like this): DLPack on kDLCPU, ``__array__``."""

    def __array__(self, dtype=None, copy=None):
        return self.array


class CudaDLPack(HostDLPack):
    """The same on a CUDA device (kDLCUDA): only the GPU path may read it."""

    def __dlpack_device__(self):
        return (2, 0)


def _first(spec):
    args, kwargs = spec.example(example_batch())
    return spec.operand_names[0], args, kwargs


def _with_first(args, first):
    return (first, *args[1:])


@pytest.mark.parametrize("backend", sorted(CPU_BACKENDS))
@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
def test_cpu_backends_send_each_foreign_array_where_it_goes(backend, spec):
    module = CPU_BACKENDS[backend]
    name, args, kwargs = _first(spec)
    call = getattr(module, spec.name)
    prefix = rf"^Invalid {name}: expected a NumPy array for kpool_cupy\.{backend}, got "
    with pytest.raises(TypeError, match=prefix + rf".*CudaDLPack \(device arrays go to kpool_cupy\.{spec.name}\)$"):
        call(*_with_first(args, CudaDLPack(args[0])), **kwargs)
    # A host array of another framework is one numpy.asarray away: the hint works as written. (A list is
    # test_hostile_inputs' case; a ring op reads a list as a split ring's pair.)
    kind = re.escape(f"{__name__}.HostDLPack")
    with pytest.raises(TypeError, match=prefix + kind + r" \(numpy\.asarray\(x\) makes one\)$"):
        call(*_with_first(args, HostDLPack(args[0])), **kwargs)
    _, fresh, fresh_kwargs = _first(spec)  # the example anew: some ops write their first operand (a ring)
    converted = np.asarray(HostDLPack(fresh[0]))
    assert _bytes(call(*_with_first(fresh, converted), **fresh_kwargs)) == _bytes(call(*args, **kwargs))


@pytest.mark.parametrize("backend", sorted(CPU_BACKENDS))
@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
def test_cpu_backends_send_torch_tensors_to_the_torch_op(backend, spec):
    torch = pytest.importorskip("torch")
    import kpool_cupy.torch as kt

    name, args, kwargs = _first(spec)
    tensor = torch.zeros(3)
    match = rf"^Invalid {name}: .*got torch\.Tensor \(torch tensors go to kpool_cupy\.torch\.{spec.name}\)$"
    with pytest.raises(TypeError, match=match):
        getattr(CPU_BACKENDS[backend], spec.name)(*_with_first(args, tensor), **kwargs)
    assert callable(getattr(kt, spec.name))  # the door named exists


@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
def test_gpu_path_sends_host_arrays_of_other_frameworks_where_they_go(spec):
    # These errors come before the GPU path touches a device: they hold wherever CuPy imports.
    pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    name, args, kwargs = _first(spec)
    call = getattr(kpool_cupy, spec.name)
    prefix = rf"^Invalid {name}: expected a CUDA array .*got host array "
    for tensor, device in ((torch.zeros(3), "cpu"), (torch.zeros(3, device="meta"), "meta")):
        match = rf"^Invalid {name}: expected a CUDA array .*got a torch\.Tensor on {device}; such tensors go to "
        with pytest.raises(TypeError, match=match + rf"kpool_cupy\.torch\.{spec.name}$"):
            call(*_with_first(args, tensor), **kwargs)
    where = rf"kpool_cupy\.reference\.{spec.name} or kpool_cupy\.emulate\.{spec.name}"
    with pytest.raises(TypeError, match=prefix + rf".*HostDLPack; host arrays go to {where} as a NumPy array "
                                        r"\(numpy\.asarray\(x\)\)$"):  # fmt: skip
        call(*_with_first(args, HostDLPack(args[0])), **kwargs)


def _bytes(result) -> bytes:
    results = result if isinstance(result, tuple) else (result,)
    return b"".join(np.asarray(r).tobytes() for r in results)


def test_pool_row_offsets_sends_torch_tensors_to_its_torch_op():
    torch = pytest.importorskip("torch")
    import kpool_cupy.torch  # registers torch.ops.kpool

    offsets, lengths = torch.tensor([0, 5], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    with pytest.raises(TypeError, match=r"^Invalid input_row_offsets: .*got torch\.Tensor "
                                        r"\(torch tensors go to torch\.ops\.kpool\.pool_row_offsets, once "
                                        r"kpool_cupy\.torch is imported\)$"):  # fmt: skip
        kpool_cupy.pool_row_offsets(offsets, lengths, 4)
    assert torch.ops.kpool.pool_row_offsets(offsets, lengths, 4).tolist() == [0, 1]  # the door named takes them


class OnAnotherDevice(DLPackOnly):
    """An array on a device no backend reads (kDLROCM)."""

    def __dlpack_device__(self):
        return (10, 0)


class Deleted(DLPackOnly):
    """An array that raises when asked where it lives (a deleted JAX array does)."""

    def __dlpack_device__(self):
        raise RuntimeError("Array has been deleted")

    @property
    def __cuda_array_interface__(self):
        raise ValueError("sharded")


def _compress_args():
    spec = next(s for s in OPS if s.name == "kpool_compress")
    return _first(spec)


@pytest.mark.parametrize("backend", sorted(CPU_BACKENDS))
def test_cpu_backends_hint_what_works_for_each_kind_of_foreign_array(backend):
    # A review's findings: asking where an array lives may raise (a deleted or sharded array), numpy.asarray
    # makes an object array of a DLPack-only host array, and no backend reads another device's memory.
    _, args, kwargs = _compress_args()
    call = CPU_BACKENDS[backend].kpool_compress
    with pytest.raises(TypeError, match=r"DLPackOnly \(numpy\.from_dlpack\(x\) makes one\)$"):
        call(*_with_first(args, DLPackOnly(args[0])), **kwargs)
    ape = args[2]  # float32: NumPy's own DLPack export takes no bfloat16, so k cannot show it
    assert np.from_dlpack(DLPackOnly(ape)).dtype == ape.dtype  # the hint works as written
    with pytest.raises(TypeError, match=r"OnAnotherDevice \(an array on DLPack device type 10, which no backend"):
        call(*_with_first(args, OnAnotherDevice(args[0])), **kwargs)
    with pytest.raises(TypeError, match=r"^Invalid k: expected a NumPy array for .*Deleted "):
        call(*_with_first(args, Deleted(args[0])), **kwargs)


def test_the_gpu_path_refuses_arrays_it_cannot_place_with_a_type_error():
    pytest.importorskip("cupy")
    _, args, kwargs = _compress_args()
    with pytest.raises(TypeError, match=r"^Invalid k: expected a CUDA array .*OnAnotherDevice on DLPack device "
                                        r"type 10$"):  # fmt: skip
        kpool_cupy.kpool_compress(*_with_first(args, OnAnotherDevice(args[0])), **kwargs)
    with pytest.raises(TypeError, match=r"^Invalid k: expected a CUDA array .*got .*Deleted$"):
        kpool_cupy.kpool_compress(*_with_first(args, Deleted(args[0])), **kwargs)
    with pytest.raises(TypeError, match=r"DLPackOnly; host arrays go to .* as a NumPy array "
                                        r"\(numpy\.from_dlpack\(x\)\)$"):  # fmt: skip
        kpool_cupy.kpool_compress(*_with_first(args, DLPackOnly(args[0])), **kwargs)


def test_a_torch_subclass_from_outside_torch_goes_to_the_torch_ops():
    torch = pytest.importorskip("torch")

    class Wrapped(torch.Tensor):
        """A user's (or another library's) tensor subclass: its module is not torch's."""

    _, args, kwargs = _compress_args()
    tensor = torch.zeros(3).as_subclass(Wrapped)
    with pytest.raises(TypeError, match=r"Wrapped \(torch tensors go to kpool_cupy\.torch\.kpool_compress\)$"):
        reference.kpool_compress(*_with_first(args, tensor), **kwargs)
