"""kpool_index_logits_fp8's GPU path: the device's tensor-core instruction, its refusal before sm_80, a
capture-safe call with no host read, and (on a GPU) scores within the GPU bound."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
from double import run_on_double
from index_cases import index_case

from kpool_cupy import reference
from kpool_cupy.backends.reference import ReferenceBackend
from kpool_cupy.ops.framework.binding import execute
from kpool_cupy.ops.index_logits_fp8 import SPEC
from kpool_cupy.tools.index_accuracy import gpu_accumulation_bits, index_logits_agree, index_logits_bound

_BY_CAPABILITY = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, "tests")
    import numpy as np, cupy, kpool_cupy
    from kpool_cupy.backends.cupy import CupyBackend
    from index_cases import index_case
    case = index_case(np.random.default_rng(0), heads=4, kpool=2, block_size=4, counts=(2, 2), cache_lengths=(5, 9))
    args = [cupy.asarray(a) for a in case.args]
    seen = {}
    for capability in ("90", "89", "86", "80", "75"):
        cupy.cuda.COMPUTE_CAPABILITY = capability
        try:
            kpool_cupy.kpool_index_logits_fp8(*args, kpool=2)
            seen[capability] = CupyBackend(cupy, 0).tensor_core()
        except ValueError as error:
            seen[capability] = str(error)
    print(json.dumps(seen))
    """
)


def test_the_device_picks_the_instruction_and_gpus_before_sm_80_are_refused():
    # sm_89 and newer: e4m3 mma.sync (1), but sm_90, which has none: f16 mma.sync on converted e4m3 (3); sm_80 to
    # sm_88: the f16 path (0); sm_75: a ValueError naming the device's architecture, before anything is compiled.
    done = run_on_double(_BY_CAPABILITY, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["90"] == 3 and seen["89"] == 1 and seen["86"] == 0 and seen["80"] == 0, seen
    assert seen["75"].startswith("Invalid device: expected a GPU of compute capability 8.0 or newer"), seen
    assert "got sm_75" in seen["75"], seen


def test_a_call_with_out_max_pools_and_no_validation_reads_nothing_back():
    # What a CUDA graph can capture: no host copy, no allocation, one launch.
    case = index_case(np.random.default_rng(1), heads=4, kpool=2, counts=(3, 2), cache_lengths=(6, 1))
    width = int(case.visible().max())
    events = []

    class Watching(ReferenceBackend):
        def host_copies(self, arrays):
            events.append("host copy")
            return super().host_copies(arrays)

        def empty(self, shape, dtype):
            events.append("allocation")
            return super().empty(shape, dtype)

        def launch(self, launch):
            events.append("launch")
            super().launch(launch)

    out = np.empty((case.q.shape[0], width), np.float32)
    options = {"kpool": 2, "max_pools": width, "validate": False}
    execute(SPEC, Watching(), (*case.args, out), options)
    assert events == ["launch"], events
    execute(SPEC, Watching(), (*case.args, None), {"kpool": 2, "max_pools": None, "validate": True})
    assert events[1:] == ["host copy", "allocation", "launch"], events


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [1, 4, 20, 64, 128])  # 4: where the 13-bit bound still sees one bad lane
def test_gpu_scores_meet_the_gpu_bound(heads):
    # The tensor cores add a step's products in their own order and width: the bound's D-sum has the bits
    # gpu_accumulation_bits gives this device's instruction (tools/index_accuracy.py); -inf, +inf and NaN
    # where the reference has them.
    import cupy

    import kpool_cupy
    from kpool_cupy.backends.cupy import CupyBackend

    case = index_case(np.random.default_rng(heads), heads=heads, kpool=4, block_size=16, counts=(5, 1, 9),
                      cache_lengths=(300, 7, 64))  # fmt: skip
    want = reference.kpool_index_logits_fp8(*case.args, kpool=4)
    got = cupy.asnumpy(kpool_cupy.kpool_index_logits_fp8(*(cupy.asarray(a) for a in case.args), kpool=4))
    device = cupy.cuda.Device()
    bits = gpu_accumulation_bits(int(device.compute_capability), CupyBackend(cupy, device.id).tensor_core())
    bound = index_logits_bound(*case.args, kpool=4, max_pools=want.shape[1], accumulation_bits=bits)
    verdict = index_logits_agree(got, want, bound)
    assert verdict["ok"], verdict
