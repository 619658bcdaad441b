"""PyTorch custom ops: every op as ``torch.ops.kpool.<name>``, on CPU and CUDA tensors, under torch.compile.

``import kpool_cupy.torch`` registers, once per process:

- every op of ``kpool_cupy.ops.OPS`` as ``torch.ops.kpool.<name without
  kpool_>`` (``compress``, ``ring_close``, ..., ``compress_fp8``,
  ``hadamard_quant_fp8``): schemas written from the op specs (the
  function's positional arguments, then its keyword-only ones; a ring as a
  list ``[tail]`` or ``[key_ring, gate_ring]``), with an ``.out`` overload
  that takes the outputs and writes them, and for an op that can write a
  paged cache ``.cache`` (and ``.cache_out``), the only overloads that
  take ``slots`` or ``block_table``;
- ``torch.ops.kpool.pool_row_offsets``.

``torch.ops.kpool.expand_topk`` and ``torch.ops.kpool.index_topk`` return
``(positions, counts)`` always (a schema has one return type; ``counts`` is
empty without ``compact=True``); ``kpool_expand_topk`` and
``kpool_index_topk`` below return ``positions`` alone without ``compact``,
as the package's functions do.

CPU tensors run the NumPy reference on their own memory (bfloat16
included), or the emulator (the CUDA source built for the CPU) after
``set_cpu_backend("emulate")`` or with ``KPOOL_CUPY_TORCH_CPU=emulate``;
CUDA tensors run the kernels on torch's current stream of their
device, zero copy. Fake (meta) tensors get the output shapes from the op's
own argument checks, compress's pool count as an unbacked size, so
``torch.compile(fullgraph=True)`` traces a plain call.

An op whose spec declares a gradient (``OpSpec.gradient``: compress, with
respect to k, gate and ape) is differentiable in its default overload: the
backward calls the declared backward op (``compress_backward``) on the
saved inputs and the gradient as it comes, eager and under
``torch.compile``. An option the declaration refuses (compress's
``rotate=True``) and every other overload and op have no gradient: the
forward runs, and asking for the gradient raises, naming the op.

The functions below take what the package's functions take, as tensors,
and give the same errors for the same bad call.
"""

try:
    import torch as _torch  # noqa: F401  (the package's own module is kpool_cupy.torch)
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("kpool_cupy.torch needs PyTorch: pip install 'kpool-cupy[torch]'") from error

from ..functions import *  # noqa: F403  (the defs, for readers and type checkers; bound below)
from ..functions import DEFINITIONS as _DEFINITIONS
from ..ops.framework.binding import bind_into as _bind_into
from .cpu_backend import cpu_backend, set_cpu_backend
from .registry import register as _register
from .wrappers import BINDING as _BINDING

_register()

# Every op's def as a function on tensors; the names come from the defs.
_OP_NAMES = _bind_into(globals(), _DEFINITIONS.values(), _BINDING)

__all__ = [*_OP_NAMES, "cpu_backend", "set_cpu_backend"]
