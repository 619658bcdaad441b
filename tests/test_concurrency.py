"""First calls from many threads build once; processes building the same cache do not corrupt it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from model import BF16, assert_close_to_model, make_batch

from kpool_cupy import emulate
from kpool_cupy.emulator import toolchain

ROOT = Path(__file__).resolve().parent.parent


def _in_threads(count: int, work) -> list:
    results: list = [None] * count
    barrier = threading.Barrier(count)

    def run(i: int) -> None:
        barrier.wait()  # all first calls start together
        results[i] = work(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_emulator_first_calls_from_threads_build_once(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(emulate.FLAGS_VARIABLE, "-DKPOOL_THREAD_TEST=1")  # a key no earlier test loaded
    builds = []
    real_build = toolchain._build

    def counting_build(*args, **kwargs):
        builds.append(threading.get_ident())
        return real_build(*args, **kwargs)

    monkeypatch.setattr(toolchain, "_build", counting_build)
    batch = make_batch([9, 13, 5], [0, 3, 6], head_dim=24, kpool=3, seed=4)
    want = batch.model()
    results = _in_threads(8, lambda i: emulate.kpool_compress(*batch.args()))
    assert len(builds) == 1, f"built {len(builds)} times"
    for result in results:
        assert_close_to_model(result, want, BF16)
        np.testing.assert_array_equal(result.view(np.uint16), results[0].view(np.uint16))


_BUILD_AND_RUN = """
import os, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, {tests!r})
from model import make_batch
from kpool_cupy import emulate
from kpool_cupy.emulator import toolchain

# Hold each process at the start of its build until all have reached it, so
# the builds overlap for certain instead of by luck.
real_build, gate = toolchain._build, Path({gate!r})
def build_together(*args, **kwargs):
    (gate / str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(list(gate.iterdir())) < {count} and time.monotonic() < deadline:
        time.sleep(0.01)
    return real_build(*args, **kwargs)
toolchain._build = build_together

batch = make_batch([9, 13, 5], [0, 3, 6], head_dim=32, kpool=5, seed=4)
print(emulate.kpool_compress(*batch.args()).view(np.uint16).tobytes().hex())
print("built together:", len(list(gate.iterdir())) == {count}, file=sys.stderr)
"""


@pytest.mark.slow
def test_two_processes_building_the_same_variant(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    gate = tmp_path / "gate"
    gate.mkdir()
    script = _BUILD_AND_RUN.format(tests=str(ROOT / "tests"), gate=str(gate), count=3)
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outputs = [process.communicate(timeout=300) for process in processes]
    for process, (_out, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err
        assert "built together: True" in err  # all three were inside a build at once
    assert len({out for out, _ in outputs}) == 1
    cache = tmp_path / "cache" / "kpool-cupy" / "emulate"
    assert len(list(cache.glob("*.so"))) == 1
    assert not list(cache.glob(".*.tmp")), "a private build file was left behind"


@pytest.mark.gpu
def test_gpu_first_calls_from_threads_compile_once(monkeypatch):
    import cupy

    import kpool_cupy
    from kpool_cupy.backends import cupy as cupy_backend

    modules = []
    real_module = cupy.RawModule

    def counting_module(*args, **kwargs):
        modules.append(kwargs.get("name_expressions"))
        return real_module(*args, **kwargs)

    monkeypatch.setattr(cupy, "RawModule", counting_module)
    monkeypatch.setattr(cupy_backend, "_kernels", {})
    batch = make_batch([9, 13, 5], [0, 3, 6], head_dim=40, kpool=3, seed=4)
    device = [cupy.asarray(a) for a in batch.args()]
    results = _in_threads(8, lambda i: cupy.asnumpy(kpool_cupy.kpool_compress(*device)))
    assert len(modules) == 1, modules
    for result in results:
        assert_close_to_model(result, batch.model(), BF16)
