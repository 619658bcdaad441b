"""The sm_90a build: which devices take it (KPOOL_CUPY_SM90_BUILD), how it is compiled, cached on disk and loaded
(kernel.nvrtc.cached_cubin, backends.cupy.kernel_function), what the tools make of ``--arch sm_90a``, and how the
GPU run's scripts reach it.

CuPy's RawModule(code=) compiles for the device's plain architecture, so a
kernel that issues wgmma is built by NVRTC for sm_90a into a cubin of our
own cache and loaded with RawModule(path=). Most tests here run without a
GPU and without NVRTC (a stand-in compiler and a stand-in CuPy); the ones
that compile for real say so with the ``nvrtc`` or ``sass_tools`` fixture.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import struct
import subprocess
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from double import run_on_double
from index_cases import index_case

from kpool_cupy.backends import cupy as cupy_backend
from kpool_cupy.backends import cupy_plans
from kpool_cupy.backends.cupy import CupyBackend
from kpool_cupy.backends.reference import ReferenceBackend
from kpool_cupy.kernel import nvrtc
from kpool_cupy.kernel.declarations import (
    INDEX_LOGITS_FP8,
    INDEX_TILE_PAGES,
    MMA_E4M3,
    MMA_E4M3_HMMA,
    MMA_F16,
    MMA_WGMMA,
)
from kpool_cupy.kernel.sources import NVRTC_OPTIONS, kernel_source
from kpool_cupy.ops.framework.binding import execute
from kpool_cupy.ops.index_logits_fp8 import SPEC as INDEX_LOGITS_SPEC
from kpool_cupy.tools.variants import op_variant

ROOT = Path(__file__).resolve().parent.parent
VARIABLE = cupy_backend.SM90_BUILD_VARIABLE


@pytest.fixture
def nvrtc_library() -> None:
    """Skip a test that compiles for real where CuPy's NVRTC bindings are missing."""
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="NVRTC comes with the cuda12 extra")


def _script(name: str):
    """scripts/<name>.py as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeCupy:
    """CuPy as kernel_function and CupyBackend.tensor_core see it: a device of one compute capability, and a
    RawModule that records how it was made and which function was asked for."""

    def __init__(self, capability: str = "90") -> None:
        self.capability = capability
        self.calls: list[tuple[str, object]] = []
        fake = self

        class Device:
            def __init__(self, device_id: int | None = None) -> None:
                self.id = device_id or 0

            @property
            def compute_capability(self) -> str:
                return fake.capability

            def __enter__(self):
                return self

            def __exit__(self, *exc) -> bool:
                return False

        class RawModule:
            def __init__(self, **kwargs) -> None:
                fake.calls.append(("RawModule", kwargs))

            def get_function(self, name: str) -> tuple[str, str]:
                fake.calls.append(("get_function", name))
                return ("function", name)

        self.cuda = SimpleNamespace(Device=Device)
        self.RawModule = RawModule


# ---- which build a device takes


def test_the_variable_defaults_to_sm_90_while_wgmma_is_unproven(monkeypatch):
    # The default is one named constant: sm_90 until an H200 run passes scripts/gpu_index_check.py on the
    # sm_90a build. Unset and empty both mean the default.
    assert cupy_backend.DEFAULT_SM90_BUILD == "sm_90"
    monkeypatch.delenv(VARIABLE, raising=False)
    assert cupy_backend.sm90_build() == "sm_90"
    monkeypatch.setenv(VARIABLE, "")
    assert cupy_backend.sm90_build() == "sm_90"


@pytest.mark.parametrize("value", ["sm_90a", "sm_90"])
def test_the_variable_takes_both_builds(monkeypatch, value):
    monkeypatch.setenv(VARIABLE, value)
    assert cupy_backend.sm90_build() == value


@pytest.mark.parametrize("value", ["sm90a", "SM_90A", "sm_100a", " sm_90a"])
def test_another_value_is_refused_with_the_variable_the_choices_and_the_value(monkeypatch, value):
    # A near miss (no underscore, capitals, a leading space) must not fall back to the default silently.
    monkeypatch.setenv(VARIABLE, value)
    with pytest.raises(ValueError) as error:
        cupy_backend.sm90_build()
    message = str(error.value)
    assert message.startswith(f"Invalid {VARIABLE}: expected 'sm_90a' or 'sm_90'"), message
    assert f"got {value!r}" in message, message


@pytest.mark.parametrize(
    ("capability", "value", "want"),
    [
        ("90", None, MMA_E4M3_HMMA),  # the default build on an H100/H200: sm_90 has no e4m3 mma.sync
        ("90", "sm_90a", MMA_WGMMA),
        ("90", "sm_90", MMA_E4M3_HMMA),
        ("89", "sm_90a", MMA_E4M3),  # sm_90a code cannot run on another architecture: the variable is not read
        ("100", "sm_90a", MMA_E4M3),
        ("120", "sm_90a", MMA_E4M3),
        ("86", "sm_90a", MMA_F16),
        ("80", "sm_90a", MMA_F16),
        ("89", "nonsense", MMA_E4M3),  # not read at all off sm_90
    ],
)
def test_the_device_and_the_variable_pick_the_instruction(monkeypatch, capability, value, want):
    if value is None:
        monkeypatch.delenv(VARIABLE, raising=False)
    else:
        monkeypatch.setenv(VARIABLE, value)
    assert CupyBackend(FakeCupy(capability), 0).tensor_core() == want


def test_a_bad_value_on_sm_90_is_an_error_not_a_guess(monkeypatch):
    monkeypatch.setenv(VARIABLE, "wgmma")
    with pytest.raises(ValueError, match=f"Invalid {VARIABLE}"):
        CupyBackend(FakeCupy("90"), 0).tensor_core()


# ---- the cubin cache, with a stand-in compiler


class Compiler:
    """Stands in for NVRTC (``nvrtc.compile_lowered``): counts the builds, returns bytes naming what was asked."""

    def __init__(self, monkeypatch, version: tuple[int, int] = (12, 9)) -> None:
        self.builds: list[tuple[str, str, list[str]]] = []
        self.fail = False
        monkeypatch.setattr(nvrtc, "compile_lowered", self)
        monkeypatch.setattr(nvrtc, "nvrtc_version", lambda: version)

    def __call__(self, code: str, label: str, name: str, options: list[str], output: str) -> tuple[bytes, str, str]:
        assert not self.fail, "compiled although the cubin is cached"
        assert output == "cubin"
        self.builds.append((code, name, options))
        return f"cubin of {name} for {options}".encode(), "", f"_Z_{name}"


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "kpool-cupy" / "cubin"


def test_the_cache_lives_under_xdg_cache_home_or_the_home_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert nvrtc.cubin_cache_dir() == tmp_path / "kpool-cupy" / "cubin"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert nvrtc.cubin_cache_dir() == tmp_path / "home" / ".cache" / "kpool-cupy" / "cubin"


def test_a_cubin_is_built_once_then_read_from_disk(monkeypatch, cache):
    compiler = Compiler(monkeypatch)
    first = nvrtc.cached_cubin("text", "k.cu", "k<1>", "sm_90a")
    assert len(compiler.builds) == 1
    # NVRTC gets the sm_90a target (the package's own options are added inside compile_lowered).
    assert compiler.builds[0][2] == ["--gpu-architecture=sm_90a"]
    compiler.fail = True  # a second call, as another process would make it, must not compile
    second = nvrtc.cached_cubin("text", "k.cu", "k<1>", "sm_90a")
    assert second == first and first.path.parent == cache
    assert first.path.read_bytes() == b"cubin of k<1> for ['--gpu-architecture=sm_90a']"
    assert second.lowered_name == "_Z_k<1>"  # read back from <key>.name: a hit has no program to ask
    assert sorted(p.name for p in cache.iterdir()) == sorted([first.path.name, first.path.stem + ".name"])


@pytest.mark.parametrize(
    "change",
    ["text", "label", "name", "arch", "nvrtc", "options"],
)
def test_the_key_changes_with_the_text_the_name_the_options_and_nvrtc(monkeypatch, cache, change):
    # An edited header changes the text (kernel_source inlines it); another NVRTC or option set builds other code.
    compiler = Compiler(monkeypatch)
    before = nvrtc.cached_cubin("text", "k.cu", "k<1>", "sm_90a")
    call = {"code": "text", "label": "k.cu", "name": "k<1>", "arch": "sm_90a"}
    if change == "text":
        call["code"] = "text\n"
    elif change == "label":
        call["label"] = "other.cu"
    elif change == "name":
        call["name"] = "k<2>"
    elif change == "arch":
        call["arch"] = "sm_100a"
    elif change == "nvrtc":
        monkeypatch.setattr(nvrtc, "nvrtc_version", lambda: (13, 0))
    else:
        monkeypatch.setattr(nvrtc, "NVRTC_OPTIONS", (*NVRTC_OPTIONS, "-lineinfo"))
    after = nvrtc.cached_cubin(**call)
    assert len(compiler.builds) == 2 and after.path != before.path


def test_each_file_is_renamed_into_place_the_name_first(monkeypatch, cache):
    # Another process sees nothing or whole files: each is written beside its target and renamed, and the name
    # goes first, so a cubin found always has its name.
    Compiler(monkeypatch)
    renames = []
    rename = os.replace

    def recording(source, target):
        renames.append((Path(source), Path(target)))
        rename(source, target)

    monkeypatch.setattr(os, "replace", recording)
    built = nvrtc.cached_cubin("text", "k.cu", "k<1>", "sm_90a")
    assert [target for _, target in renames] == [built.path.with_suffix(".name"), built.path]
    assert all(source.parent == cache and source != target and not source.exists() for source, target in renames)


def test_a_cubin_without_its_name_is_built_again(monkeypatch, cache):
    compiler = Compiler(monkeypatch)
    built = nvrtc.cached_cubin("text", "k.cu", "k<1>", "sm_90a")
    built.path.with_suffix(".name").unlink()
    assert nvrtc.cached_cubin("text", "k.cu", "k<1>", "sm_90a") == built
    assert len(compiler.builds) == 2


def test_builders_racing_on_one_key_all_get_whole_files(monkeypatch, cache):
    # Eight builders of one key at once (processes in the GPU run's precompile; threads here): each writes its
    # own private file, so none fails and the folder ends with the two files and no leftovers.
    compiler = Compiler(monkeypatch)
    ready = threading.Barrier(8)
    build = compiler.__call__

    def together(*args):
        ready.wait(timeout=60)  # a guard against a hang; all eight arrive at once
        return build(*args)

    monkeypatch.setattr(nvrtc, "compile_lowered", together)
    results, errors = [], []

    def run():
        try:
            results.append(nvrtc.cached_cubin("text", "k.cu", "k<1>", "sm_90a"))
        except Exception as error:  # collected: the assertion below names it
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)  # a guard against a hang, like the barrier's
    assert not errors and len(results) == 8 and len(set(results)) == 1, errors
    assert len(list(cache.iterdir())) == 2, list(cache.iterdir())


# ---- loading: RawModule(path=) for sm_90a, RawModule(code=) otherwise


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """A stand-in CuPy on compute capability 9.0, kernel_function's in-process cache empty, and kernel_cubin
    recording what it was asked for."""
    cupy = FakeCupy("90")
    monkeypatch.setattr(cupy_backend, "import_cupy", lambda: cupy)
    monkeypatch.setattr(cupy_backend, "_kernels", {})
    asked = []

    def kernel_cubin(source, name, arch):
        asked.append((source, name, arch))
        return nvrtc.CachedCubin(tmp_path / "k.cubin", "_Z_lowered")

    monkeypatch.setattr(cupy_backend, "kernel_cubin", kernel_cubin)
    return SimpleNamespace(cupy=cupy, asked=asked, path=tmp_path / "k.cubin")


def test_an_sm_90a_kernel_is_loaded_from_the_cached_cubin_by_its_lowered_name(fake_gpu):
    name = INDEX_LOGITS_FP8.instance(HEAD_DIM=128, MMA=MMA_WGMMA)
    function = cupy_backend.kernel_function(INDEX_LOGITS_FP8.source, name, 0, sm90a=True)
    assert fake_gpu.asked == [(INDEX_LOGITS_FP8.source, name, "sm_90a")]
    # path= alone: no code, no options, no name expressions for CuPy to compile with the device's plain -arch.
    assert fake_gpu.cupy.calls == [("RawModule", {"path": str(fake_gpu.path)}), ("get_function", "_Z_lowered")]
    assert function == ("function", "_Z_lowered")
    # Once per process: the second call finds it in memory.
    assert cupy_backend.kernel_function(INDEX_LOGITS_FP8.source, name, 0, sm90a=True) is function
    assert len(fake_gpu.cupy.calls) == 2 and len(fake_gpu.asked) == 1


def test_a_loaded_kernel_is_found_while_another_thread_compiles(fake_gpu):
    # helper-59's finding: every lookup took the lock that a compile holds (NVRTC, seconds), so a thread whose
    # kernel was loaded waited for another thread's compile. Here the lock is held as a compile holds it.
    import threading

    name = INDEX_LOGITS_FP8.instance(HEAD_DIM=128, MMA=MMA_E4M3)
    loaded = cupy_backend.kernel_function(INDEX_LOGITS_FP8.source, name, 0)
    found: list = []
    with cupy_backend._kernel_lock:  # another thread's compile
        worker = threading.Thread(
            target=lambda: found.append(cupy_backend.kernel_function(INDEX_LOGITS_FP8.source, name, 0))
        )
        worker.start()
        worker.join(timeout=10)  # a guard: the lookup takes microseconds
        assert found == [loaded], "a loaded kernel waited for another thread's compile"


def test_a_plain_kernel_is_still_cupys_rawmodule_of_the_source(fake_gpu):
    name = INDEX_LOGITS_FP8.instance(HEAD_DIM=128, MMA=MMA_E4M3)
    cupy_backend.kernel_function(INDEX_LOGITS_FP8.source, name, 0)
    expected = {"code": kernel_source(INDEX_LOGITS_FP8.source), "options": NVRTC_OPTIONS, "name_expressions": (name,)}
    assert fake_gpu.cupy.calls == [("RawModule", expected), ("get_function", name)]
    assert fake_gpu.asked == []


def test_the_two_builds_of_one_name_are_two_functions(fake_gpu):
    # In-process, the build is part of the key: a name loaded plain is not handed out as its sm_90a build.
    name = INDEX_LOGITS_FP8.instance(HEAD_DIM=128, MMA=MMA_WGMMA)
    plain = cupy_backend.kernel_function(INDEX_LOGITS_FP8.source, name, 0)
    sm90a = cupy_backend.kernel_function(INDEX_LOGITS_FP8.source, name, 0, sm90a=True)
    assert plain == ("function", name) and sm90a == ("function", "_Z_lowered")


def test_an_sm_90a_kernel_on_another_device_is_refused_before_compiling(fake_gpu):
    # An sm_90a cubin runs on compute capability 9.0 only; a forced path on another GPU gets a ValueError, not a
    # CUDA error at load time.
    fake_gpu.cupy.capability = "100"
    name = INDEX_LOGITS_FP8.instance(HEAD_DIM=128, MMA=MMA_WGMMA)
    with pytest.raises(ValueError, match=r"expected compute capability 9\.0 for the sm_90a build .* got sm_100"):
        cupy_backend.kernel_function(INDEX_LOGITS_FP8.source, name, 0, sm90a=True)
    assert fake_gpu.asked == [] and fake_gpu.cupy.calls == []


@pytest.mark.parametrize(
    ("mma", "sm90a"), [(MMA_WGMMA, True), (MMA_E4M3, False), (MMA_E4M3_HMMA, False), (MMA_F16, False)]
)
def test_the_backend_builds_for_sm_90a_exactly_the_wgmma_launches(monkeypatch, mma, sm90a):
    # The scorer's own launch (made by the op on a backend whose tensor core is ``mma``), handed to the GPU
    # backend: its template's MMA decides the build.
    class Recording(ReferenceBackend):
        def tensor_core(self) -> int:
            return mma

        def launch(self, launch) -> None:
            launches.append(launch)

    launches = []
    case = index_case(np.random.default_rng(0), heads=4, kpool=2, counts=(2, 1), cache_lengths=(5, 3))
    execute(INDEX_LOGITS_SPEC, Recording(), (*case.args, None), {"kpool": 2, "max_pools": None, "validate": True})
    (launch,) = launches
    asked = []

    class Loaded:
        """CuPy's RawKernel as the launch uses it: a call taking shared_mem, and its opt-in limit (48 KB at
        first)."""

        max_dynamic_shared_size_bytes = 49152

        def __call__(self, grid, block, arguments, shared_mem=0):
            shared.append(shared_mem)

    shared = []

    def kernel_function(source, name, device_id, sm90a=False):
        asked.append((source, name, device_id, sm90a))
        return Loaded()

    monkeypatch.setattr(cupy_backend, "kernel_function", kernel_function)
    CupyBackend(FakeCupy("90"), 0).launch(launch)
    assert asked == [(INDEX_LOGITS_FP8.source, launch.instance, 0, sm90a)]
    assert launch.instance.startswith(f"kpool_index_logits_fp8<{case.q.shape[2]}, {mma}, ")
    # The wgmma path's ring and stage are dynamic shared memory, and the GPU launch passes them.
    assert shared == [launch.geometry.shared_bytes] and (launch.geometry.shared_bytes > 0) == sm90a


# ---- real NVRTC: the lowered name, and wgmma only on sm_90a

_TEMPLATED = "template <int N> __global__ void scale(float* x) { x[threadIdx.x] *= N; }\n"


def test_the_lowered_name_is_nvrtcs_symbol_and_survives_the_cache(nvrtc_library, monkeypatch, cache):
    built = nvrtc.cached_cubin(_TEMPLATED, "scale.cu", "scale<3>", "sm_90a")
    assert built.lowered_name == "_Z5scaleILi3EEvPf"  # the Itanium mangling of scale<3>(float*)
    assert built.lowered_name.encode() + b"\0" in built.path.read_bytes()  # a symbol of the cubin
    monkeypatch.setattr(nvrtc, "compile_lowered", lambda *args: pytest.fail("compiled although cached"))
    assert nvrtc.cached_cubin(_TEMPLATED, "scale.cu", "scale<3>", "sm_90a") == built


def _wgmma_code() -> str:
    from test_emulator_wgmma import _code

    return _code()


PROBE, PROBE_SYMBOL = "wgmma_probe<64>", "_Z11wgmma_probeILi64EEvPKhS1_Pf"


def _elf_section(cubin: bytes, wanted: str) -> bytes:
    """The bytes of the section named ``wanted`` of a 64-bit little-endian ELF file (a cubin)."""
    (section_headers,) = struct.unpack_from("<Q", cubin, 0x28)  # e_shoff
    entry_size, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)  # e_shentsize, e_shnum, e_shstrndx
    # Elf64_Shdr: name, type, flags, address, offset, size, link, info, alignment, entry size
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, section_headers + i * entry_size) for i in range(count)]
    names = headers[names_index][4]
    for name, _, _, _, offset, size, *_ in headers:
        if cubin[names + name : cubin.index(b"\0", names + name)].decode() == wanted:
            return cubin[offset : offset + size]
    raise AssertionError(f"no section {wanted} in the cubin")


def _opcode_fields(code: bytes) -> list[int]:
    """The low 12 bits of each 16-byte instruction's first word: the opcode, for the instructions here."""
    return [struct.unpack_from("<Q", code, at)[0] & 0xFFF for at in range(0, len(code), 16)]


def test_the_route_builds_wgmma_into_qgmma(sass_tools, cache, tmp_path):
    # The GPU path's cubin of tests/kernels/wgmma.cu's probe: four QGMMA.64x64x32 (four k-steps). CUDA 13's
    # nvdisasm refuses NVRTC 12's cubins, so the cubin's code is read by opcode, and the opcode is learnt
    # from nvdisasm's listing of the same PTX assembled by ptxas for sm_90a, where it must name QGMMA alone.
    from kpool_cupy.tools import sass

    built = nvrtc.cached_cubin(_wgmma_code(), "tests/kernels/wgmma.cu", PROBE, "sm_90a")
    assert built.lowered_name == PROBE_SYMBOL
    ptx = nvrtc.code_ptx(_wgmma_code(), PROBE, "compute_90a")
    ptx_file, reference = tmp_path / "probe.ptx", tmp_path / "probe.cubin"
    ptx_file.write_text(ptx)
    subprocess.run([sass.find_tool("ptxas"), "-arch=sm_90a", str(ptx_file), "-o", str(reference)], check=True)
    listing = subprocess.run(
        [sass.find_tool("nvdisasm"), "-hex", "-c", str(reference)], capture_output=True, text=True, check=True
    ).stdout
    by_field = collections.defaultdict(set)  # opcode field -> the opcodes nvdisasm printed for it
    for line in listing.splitlines():
        instruction = sass._INSTRUCTION.match(line)
        encoding = line.rsplit("/* 0x", 1)
        if instruction and len(encoding) == 2:
            by_field[int(encoding[1].split()[0], 16) & 0xFFF].add(instruction.group(3).split(".")[0])
    (qgmma,) = [field for field, opcodes in by_field.items() if "QGMMA" in opcodes]
    assert by_field[qgmma] == {"QGMMA"}, by_field[qgmma]
    fields = _opcode_fields(_elf_section(built.path.read_bytes(), f".text.{PROBE_SYMBOL}"))
    assert fields.count(qgmma) == 4, collections.Counter(fields)
    # The ELF header says sm_90a: SM 90 in the low byte of e_flags, and the arch-specific bit (0x800 in the
    # ELF ABI NVRTC 12 writes for sm_90).
    (flags,) = struct.unpack_from("<I", built.path.read_bytes(), 48)
    assert flags & 0xFF == 90 and flags & 0x800, hex(flags)


def test_a_plain_sm_90_build_of_wgmma_is_refused(sass_tools, cache):
    # wgmma exists on sm_90a only: NVRTC's sm_90 cubin fails in its ptxas, and so does ptxas -arch=sm_90 on the
    # compute_90 PTX (the tools' route), each naming the instruction. Nothing is cached.
    from kpool_cupy.tools import sass

    with pytest.raises(RuntimeError, match=r"Instruction 'wgmma\.fence' not supported on \.target 'sm_90'"):
        nvrtc.cached_cubin(_wgmma_code(), "tests/kernels/wgmma.cu", PROBE, "sm_90")
    assert not cache.exists() or not list(cache.iterdir())
    with pytest.raises(RuntimeError, match=r"(?s)ptxas failed .*not supported on \.target 'sm_90'"):
        sass.summarize_code_sass(_wgmma_code(), PROBE, "sm_90")


# ---- the tools


@pytest.mark.parametrize(
    ("arch", "mma"),
    [
        ("sm_90a", MMA_WGMMA),
        ("compute_90a", MMA_WGMMA),
        ("sm_90", MMA_E4M3_HMMA),
        ("sm_100a", MMA_E4M3),
        ("sm_80", MMA_F16),
    ],
)
def test_the_tools_scorer_variant_follows_the_arch(arch, mma):
    _, name = op_variant("index_logits_fp8", 128, 4, "bfloat16", arch)
    assert name == INDEX_LOGITS_FP8.instance(HEAD_DIM=128, MMA=mma)


def test_an_op_without_a_tensor_core_is_the_same_variant_on_sm_90a():
    assert op_variant("compress", 128, 4, "bfloat16", "sm_90a") == op_variant("compress", 128, 4, "bfloat16", "sm_90")


def test_ptx_sass_for_sm_90a_compiles_for_compute_90a_and_assembles_for_sm_90a(sass_tools, monkeypatch):
    # `kpool-cupy ptx --sass --op index_logits_fp8 --arch sm_90a`: NVRTC's PTX for compute_90a, ptxas for
    # sm_90a, of the wgmma variant. No tensor-core count here: the wgmma kernel body is not written yet.
    from click.testing import CliRunner

    from kpool_cupy.cli import main
    from kpool_cupy.tools import sass

    compiled, assembled = [], []
    kernel_ptx, run = sass.kernel_ptx, sass._run

    def recording_ptx(source, name, arch):
        compiled.append((name, arch))
        return kernel_ptx(source, name, arch)

    def recording_run(command, name):
        assembled.append(command)
        return run(command, name)

    monkeypatch.setattr(sass, "kernel_ptx", recording_ptx)
    monkeypatch.setattr(sass, "_run", recording_run)
    result = CliRunner().invoke(main, ["ptx", "--sass", "--op", "index_logits_fp8", "--arch", "sm_90a"])
    assert result.exit_code == 0, result.output
    assert "sm_90a SASS" in result.output.splitlines()[0], result.output
    assert compiled == [(INDEX_LOGITS_FP8.instance(HEAD_DIM=128, MMA=MMA_WGMMA), "sm_90a")]
    ptxas = [command for command in assembled if Path(command[0]).name == "ptxas"]
    assert len(ptxas) == 1 and "-arch=sm_90a" in ptxas[0], assembled


# ---- the GPU run's scripts


def test_the_precompile_adds_the_sm_90a_twin_of_each_engine_shape_scorer_and_select():
    # The twin of a head_dim-128 scorer or fused select on e4m3 mma.sync is its wgmma build, everything else the
    # same (a fused select on an aligned cache has a second, with INDEX_TILE_PAGES, and each select twin one more
    # with INDEX_PAIRED_TOKENS); other head_dims, other kernels, f16 variants and twins already listed add nothing.
    from kpool_cupy.kernel.declarations import COMPRESS, INDEX_PAIRED_TOKENS, INDEX_SELECT_FP8, INDEX_TOPK

    precompile = _script("gpu_precompile")

    def listed(kernel, **template):
        return {"source": kernel.source, "instance": kernel.instance(**template), "nvrtc_s": 0.5}

    select = {"HEAD_DIM": 128, "VECTOR": 3, "CAP": 512, "IO": np.int64, "IC": np.uint32, "PAGED": True}
    variants = [
        listed(INDEX_LOGITS_FP8, HEAD_DIM=128, MMA=MMA_E4M3_HMMA, IO=np.int64),
        listed(INDEX_LOGITS_FP8, HEAD_DIM=64, MMA=MMA_E4M3_HMMA),
        listed(INDEX_LOGITS_FP8, HEAD_DIM=128, MMA=MMA_F16),
        listed(INDEX_SELECT_FP8, MMA=MMA_E4M3_HMMA, **select),
        listed(INDEX_SELECT_FP8, MMA=MMA_E4M3_HMMA, **(select | {"COMPACT": True})),
        listed(INDEX_SELECT_FP8, MMA=MMA_WGMMA, **(select | {"COMPACT": True})),  # its twin, already listed
        listed(INDEX_TOPK, CAP=512, VECTOR=1),
        listed(COMPRESS, KT=np.float32, GT=np.float32, OT=np.float32, HEAD_DIM=128, KPOOL=4),
    ]
    targets = precompile.sm90a_targets(variants)
    pages, paired = INDEX_TILE_PAGES, INDEX_PAIRED_TOKENS
    assert [t["instance"] for t in targets] == [
        INDEX_LOGITS_FP8.instance(HEAD_DIM=128, MMA=MMA_WGMMA, IO=np.int64),
        INDEX_SELECT_FP8.instance(MMA=MMA_WGMMA, **select),
        INDEX_SELECT_FP8.instance(MMA=MMA_WGMMA, **(select | {"VECTOR": 3 | pages})),
        INDEX_SELECT_FP8.instance(MMA=MMA_WGMMA, **(select | {"VECTOR": 3 | paired})),
        INDEX_SELECT_FP8.instance(MMA=MMA_WGMMA, **(select | {"VECTOR": 3 | pages | paired})),
        INDEX_SELECT_FP8.instance(MMA=MMA_WGMMA, **(select | {"COMPACT": True, "VECTOR": 3 | pages})),
        INDEX_SELECT_FP8.instance(MMA=MMA_WGMMA, **(select | {"COMPACT": True, "VECTOR": 3 | paired})),
        INDEX_SELECT_FP8.instance(MMA=MMA_WGMMA, **(select | {"COMPACT": True, "VECTOR": 3 | pages | paired})),
    ]
    assert all(t["nvrtc_s"] == 0.5 for t in targets)  # scheduled like their twins
    assert [precompile.builds_sm90a(v["source"], v["instance"]) for v in variants] == [0, 0, 0, 0, 0, 1, 0, 0]
    assert not precompile.builds_sm90a(precompile.INLINE, "kpool_bench_empty")
    # The real manifest: every target a head_dim-128 wgmma scorer or fused select.
    for target in precompile.sm90a_targets(precompile.load_manifest(precompile.MANIFEST)):
        template = precompile.declared_template(target["source"], target["instance"])
        assert template["HEAD_DIM"] == "128" and precompile.builds_sm90a(target["source"], target["instance"])


def test_the_precompile_builds_an_sm_90a_variant_into_the_cubin_cache_and_loads_the_others(monkeypatch):
    precompile = _script("gpu_precompile")
    built, loaded = [], []
    monkeypatch.setattr(nvrtc, "kernel_cubin", lambda *args: built.append(args))
    monkeypatch.setattr(cupy_backend, "kernel_function", lambda *args: loaded.append(args))
    wgmma = INDEX_LOGITS_FP8.instance(HEAD_DIM=128, MMA=MMA_WGMMA)
    e4m3 = INDEX_LOGITS_FP8.instance(HEAD_DIM=128, MMA=MMA_E4M3)
    assert precompile.compile_variant(INDEX_LOGITS_FP8.source, wgmma)[2] is None
    assert precompile.compile_variant(INDEX_LOGITS_FP8.source, e4m3)[2] is None
    assert built == [(INDEX_LOGITS_FP8.source, wgmma, "sm_90a")]  # nothing loaded: any machine with NVRTC
    assert loaded == [(INDEX_LOGITS_FP8.source, e4m3, 0)]


def test_the_index_check_picks_sm_90a_through_the_variable(monkeypatch):
    # scripts/gpu_index_check.py's paths on an H200: sm_90a and sm_90 as a user chooses them (the variable),
    # f16 forced; each path without the launch plans of another, and everything restored after.
    check = _script("gpu_index_check")
    assert check.device_paths(90) == ["sm_90a", "sm_90", "f16"]
    assert check.device_paths(89) == ["default", "f16"] and check.device_paths(120) == ["default", "f16"]
    assert check.device_paths(80) == ["default"]
    monkeypatch.setenv(VARIABLE, "sm_90")
    backend, original = CupyBackend(FakeCupy("90"), 0), CupyBackend.tensor_core
    # default right after sm_90a: it must see the variable as it was before, not sm_90a's.
    for path, want in (("sm_90", MMA_E4M3_HMMA), ("sm_90a", MMA_WGMMA), ("default", MMA_E4M3_HMMA), ("f16", MMA_F16)):
        cupy_plans._plans["a plan of another path"] = None
        with check.on_path(path):
            assert backend.tensor_core() == want, path
            assert "a plan of another path" not in cupy_plans._plans
    assert os.environ[VARIABLE] == "sm_90" and CupyBackend.tensor_core is original
    assert backend.tensor_core() == MMA_E4M3_HMMA


def _run_gpu_check(tmp_path: Path, *args: str) -> str:
    """scripts/gpu_check.sh with a stand-in python that records its arguments and succeeds: what each step ran."""
    record = tmp_path / "calls.txt"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {record}\nexit 0\n')
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "OUT": str(tmp_path / "out")}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,  # a guard against a hang: every step is the stand-in's, well under a second each
    )
    assert "usage" not in done.stderr, done.stderr
    return record.read_text()


def test_the_gpu_run_precompiles_the_sm_90a_builds_and_runs_the_index_check(tmp_path):
    calls = _run_gpu_check(tmp_path).splitlines()
    assert "scripts/gpu_precompile.py --sm90a" in calls, calls
    assert "scripts/gpu_index_check.py --no-timing" in calls, calls
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "index check exit 0" in summary, summary


def test_the_smoke_run_on_the_double_leaves_the_sm_90a_work_out(tmp_path):
    # The double cannot load a cubin, and the index check's long contexts would take the emulator many minutes.
    calls = _run_gpu_check(tmp_path, "--smoke").splitlines()
    assert "scripts/gpu_precompile.py" in calls and not any("gpu_index_check" in call for call in calls), calls
    assert "index check not run on the double" in (tmp_path / "out" / "summary.txt").read_text()


DOUBLE_TIMEOUT_S = 120  # one small scorer's emulator build and three calls: seconds


def test_a_plan_is_not_replayed_for_another_build():
    # On the double (compute capability 9.0) a scoring call with its sizes given leaves a plan. Under
    # KPOOL_CUPY_SM90_BUILD=sm_90a the same signature must take the full path, which asks for the sm_90a cubin
    # (the double cannot build one: the call fails), not replay the plain build's plan; unset again, it replays.
    body = """
    import os, sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    import cupy
    assert cupy.__version__.endswith("numpy-double"), cupy.__file__
    import kpool_cupy
    from kpool_cupy.backends import cupy_plans
    from index_cases import index_case

    case = index_case(np.random.default_rng(1), heads=4, head_dim=64, kpool=2, block_size=4, counts=(2,),
                      cache_lengths=(9,))
    args = [cupy.asarray(a) for a in case.args]
    out = cupy.empty((2, 5), cupy.float32)  # a call that allocates is never planned
    call = lambda: kpool_cupy.kpool_index_logits_fp8(*args, kpool=2, max_pools=5, out=out, validate=False)
    call()
    assert len(cupy_plans._plans) == 1, cupy_plans._plans
    os.environ["KPOOL_CUPY_SM90_BUILD"] = "sm_90a"
    try:
        call()
        print("replayed")
    except Exception as error:
        print("full path:", type(error).__name__)
    del os.environ["KPOOL_CUPY_SM90_BUILD"]
    call()
    assert len(cupy_plans._plans) == 1, cupy_plans._plans
    """
    done = run_on_double(textwrap.dedent(body).format(tests=str(Path(__file__).parent)), timeout=DOUBLE_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "full path:" in done.stdout and "replayed" not in done.stdout, done.stdout


def test_a_call_reads_the_build_once_so_its_plan_holds_the_kernel_its_key_names():
    # helper-59's finding: the plan key read KPOOL_CUPY_SM90_BUILD, and the backend read it again to pick the
    # kernel; a write by another thread between the two left a plan keyed "sm_90" holding the wgmma kernel,
    # replayed by every later sm_90 call. Here the "other thread" writes inside the backend's choice (the double
    # cannot load an sm_90a cubin: the wgmma instance is built from source).
    body = """
    import os, sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    import cupy
    assert cupy.__version__.endswith("numpy-double"), cupy.__file__
    import kpool_cupy
    from kpool_cupy.backends import cupy_plans, cupy as backend
    from index_cases import index_case

    built = backend.kernel_function
    backend.kernel_function = lambda source, name, device_id, sm90a=False: built(source, name, device_id, False)
    choose = backend.CupyBackend.tensor_core

    def tensor_core(self):
        os.environ["KPOOL_CUPY_SM90_BUILD"] = "sm_90a"  # another thread's write, between the key and the choice
        return choose(self)

    backend.CupyBackend.tensor_core = tensor_core
    os.environ["KPOOL_CUPY_SM90_BUILD"] = "sm_90"
    case = index_case(np.random.default_rng(1), heads=4, head_dim=64, kpool=2, block_size=4, counts=(2,),
                      cache_lengths=(9,))
    args = [cupy.asarray(a) for a in case.args]
    out = cupy.empty((2, 5), cupy.float32)
    kpool_cupy.kpool_index_logits_fp8(*args, kpool=2, max_pools=5, out=out, validate=False)
    (key, plan), = cupy_plans._plans.items()
    mma = int(plan.function.name.split("<")[1].split(", ")[1])  # the MMA template argument: 3 is sm_90's HMMA path
    assert key[-1] == "sm_90" and mma == 3, (key[-1], plan.function.name)
    print("ok")
    """
    done = run_on_double(textwrap.dedent(body).format(tests=str(Path(__file__).parent)), timeout=DOUBLE_TIMEOUT_S)
    assert done.returncode == 0 and "ok" in done.stdout.split(), done.stdout[-2000:] + done.stderr[-3000:]
