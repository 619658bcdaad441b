"""The scorer and the fused select built with UndefinedBehaviorSanitizer, on a query whose one head's stride is
huge: a size-1 dimension's stride is whatever NumPy or torch gave it, and kp::score_token forms the addresses of
rows g and g + 8 of each tile of 16 heads before it knows they exist, so the host passes a single head's stride
as a whole row's (ops.families.scoring.query_values). A child process with the sanitizer's runtime preloaded,
its builds in a cache of their own (tests/sanitized.py's way, with these flags)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import sanitized

from kpool_cupy import emulate
from kpool_cupy.emulator import toolchain

# Any report aborts the child (no recovery), so a report is a failed run.
UNDEFINED_FLAGS = "-O1 -fsanitize=undefined -fsanitize=pointer-overflow -fno-sanitize-recover=all -g"
TIMEOUT_S = 1800  # a guard against a hang: four instrumented builds, each a minute or two cold

_HUGE_STRIDES = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    from numpy.lib.stride_tricks import as_strided
    from index_cases import index_case
    from kpool_cupy import emulate

    for path in ("e4m3", "hmma"):
        os.environ["KPOOL_CUPY_EMULATE_MMA"] = path
        case = index_case(np.random.default_rng(5), head_dim=128, heads=1, kpool=1, counts=(2, 1),
                          cache_lengths=(30, 4))
        logits = emulate.kpool_index_logits_fp8(*case.args, kpool=1)
        rows = emulate.kpool_index_select_fp8(*case.args, kpool=1, pool_topk=5)
        for stride in (2 ** 59, 2 ** 61):
            q = as_strided(case.q, shape=case.q.shape, strides=(case.q.strides[0], stride, 1))
            args = (q, *case.args[1:])
            same = np.array_equal(emulate.kpool_index_logits_fp8(*args, kpool=1).view(np.uint32),
                                  logits.view(np.uint32))
            same &= np.array_equal(emulate.kpool_index_select_fp8(*args, kpool=1, pool_topk=5), rows)
            print(path, stride, "same" if same else "different")
    """
)


@pytest.mark.slow
def test_a_single_heads_huge_stride_forms_no_overflowing_address():
    libubsan = sanitized.runtime("libubsan.so")
    if libubsan is None:
        pytest.skip("the host compiler has no UndefinedBehaviorSanitizer runtime")
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=libubsan,
        XDG_CACHE_HOME=str(toolchain.cache_dir().parent / "undefined"),
        PYTHONPATH=str(sanitized.ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env[emulate.FLAGS_VARIABLE] = UNDEFINED_FLAGS
    script = sanitized.REPORT_LOADED + _HUGE_STRIDES.format(tests=str(sanitized.ROOT / "tests"))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=sanitized.ROOT)  # fmt: skip
    assert "runtime error" not in done.stderr and done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count(" same") == 4 and "different" not in done.stdout, done.stdout
    libraries = sanitized.loaded(done.stdout)
    assert len(libraries) >= 4 and all(b"__ubsan_handle" in path.read_bytes() for path in libraries), libraries
