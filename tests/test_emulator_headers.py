"""Where the emulator's code lives: its own headers, put before every host build and never in NVRTC's text.

kernels/kpool_portability.h holds only what both compilers need (the device
definitions, and for the host a check that the emulator came first);
kernels/emulator/ holds the host's CUDA built-ins, fibers and grid launch,
which kpool_cupy/emulator/toolchain.py puts before every host build.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kpool_cupy import emulate
from kpool_cupy.emulator import toolchain
from kpool_cupy.kernel import sources
from kpool_cupy.kernel.sources import kernel_source, kernels_dir

# Every kernel family NVRTC compiles, the benchmark's baseline included.
FAMILIES = sorted(
    p.relative_to(kernels_dir()).as_posix()
    for p in kernels_dir().rglob("*.cu")
    if p.relative_to(kernels_dir()).parts[0] != "emulator"
)
# Names only the emulator defines: the fiber switch, the fiber record, the
# plain grid loop, and the emulator's files themselves.
EMULATOR_MARKERS = ("kp_fiber_switch", "KpFiber", "kp_emulate_grid", '"kernels/emulator/')


def test_the_portability_header_stays_small():
    # It holds the device definitions and a guard; the emulator grew to 700
    # lines inside it once, and every NVRTC compile paid for them.
    lines = (kernels_dir() / "kpool_portability.h").read_text().splitlines()
    assert len(lines) <= 150, f"kernels/kpool_portability.h has {len(lines)} lines, at most 150 wanted"


def test_every_family_is_checked():
    # The glob must find the four families, or the test below checks nothing.
    for family in ("kpool_compress.cu", "kpool_ring.cu", "kpool_expand.cu", "kpool_hadamard_quant_fp8.cu"):
        assert family in FAMILIES, FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
def test_nvrtc_text_holds_no_emulator_code(family):
    # NVRTC's text is what CuPy hashes and compiles: the host's fibers and
    # launch would only cost it time, and a change to them would recompile
    # every GPU kernel.
    text = kernel_source(family)
    found = [marker for marker in EMULATOR_MARKERS if marker in text]
    assert not found, f"NVRTC text of kernels/{family} contains emulator code: {found}"


@pytest.mark.parametrize("family", FAMILIES)
def test_every_host_build_opens_with_the_emulator(family):
    # The kernel's own text follows the emulator's, whole and once.
    emulator = kernel_source(toolchain.EMULATOR_HEADER)
    text = toolchain._shim(kernel_source(family), "kernel")
    assert text.startswith(emulator + kernel_source(family)), family
    assert text.count('#line 1 "kernels/emulator/kpool_emulator.h"') == 1
    for marker in EMULATOR_MARKERS:
        assert marker in emulator, marker  # the markers above can fail


def test_a_host_build_without_the_emulator_is_refused_by_name(tmp_path):
    # A host compile of NVRTC's text alone stops at the portability header's
    # guard, with a message naming the header it lacks.
    try:
        cxx = emulate.compiler()
    except emulate.CompilerNotFoundError:
        pytest.skip("no host C++ compiler")
    source = tmp_path / "alone.cpp"
    source.write_text(kernel_source("kpool_expand.cu"))
    done = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", str(source)], capture_output=True, text=True)
    assert done.returncode != 0
    assert "kernels/emulator/kpool_emulator.h" in done.stderr, done.stderr[-2000:]


@pytest.fixture
def kernels_copy(tmp_path, monkeypatch):
    """A copy of kernels/ that kernel_source reads instead, its memo cleared on both sides."""
    copy = tmp_path / "kernels"
    shutil.copytree(kernels_dir(), copy)
    sources.kernel_source.cache_clear()
    monkeypatch.setattr(sources, "kernels_dir", lambda: copy)
    yield copy
    monkeypatch.undo()
    sources.kernel_source.cache_clear()


def test_an_edited_emulator_header_is_a_new_build(kernels_copy, tmp_path, monkeypatch):
    # The cache key hashes the emulator's text with the kernel's: a stale
    # library built against an older emulator must never load.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(emulate.FLAGS_VARIABLE, raising=False)
    code = kernel_source("kpool_portability.h") + "__global__ void kp_probe(int* out) { out[threadIdx.x] = 1; }\n"
    toolchain.load_code(code, "kp_probe")
    fibers = kernels_copy / "emulator" / "kpool_fibers.h"
    fibers.write_text(fibers.read_text() + "// edited\n")
    sources.kernel_source.cache_clear()
    toolchain.load_code(code, "kp_probe")
    built = sorted(Path(tmp_path / "cache" / "kpool-cupy" / "emulate").glob("*.so"))
    assert len(built) == 2, built
