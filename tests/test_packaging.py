"""The kernel sources ship with the package and are found wherever it runs; CuPy stays optional."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kpool_cupy.kernel.sources import kernel_source, kernels_dir

ROOT = Path(__file__).resolve().parent.parent


def test_source_is_self_contained_with_line_markers():
    # CuPy's disk cache hashes this text, so the headers must be inside it.
    text = kernel_source("kpool_compress.cu")
    assert '#line 1 "kernels/kpool_compress.cu"' in text
    assert '#line 1 "kernels/kpool_common.cuh"' in text and "struct PoolChannel" in text
    assert '#include "' not in text


def test_a_source_in_a_subfolder_includes_relative_to_itself():
    # The benchmark's baseline sits in kernels/bench/ and includes "../kpool_common.cuh".
    text = kernel_source("bench/kpool_compress_baseline.cu")
    assert '#line 1 "kernels/bench/kpool_compress_baseline.cu"' in text
    assert '#line 1 "kernels/kpool_common.cuh"' in text and '#include "' not in text


def test_checkout_finds_kernels():
    assert (kernels_dir() / "kpool_compress.cu").is_file()


@pytest.mark.slow
def test_wheel_carries_the_kernels(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = tmp_path.glob("kpool_cupy-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    kernels = ROOT / "kernels"
    sources = sorted(p.relative_to(kernels).as_posix() for p in kernels.rglob("*") if p.suffix in (".cu", ".cuh", ".h"))
    assert len(sources) >= 6  # compress, ring, expand, common, portability, and the benchmark's baseline
    assert "bench/kpool_compress_baseline.cu" in sources
    for required in [f"kpool_cupy/kernels/{name}" for name in sources] + ["kpool_cupy/py.typed"]:
        assert required in names, sorted(names)
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names), sorted(names)  # Apache-2.0
    # Each GPU extra brings CuPy, NVRTC and the CUDA runtime headers CuPy 14
    # compiles its own kernels against, for one CUDA major version.
    (metadata,) = [name for name in names if name.endswith(".dist-info/METADATA")]
    requires = [
        line.removeprefix("Requires-Dist: ")
        for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist: ")
    ]
    for extra, major in (("cuda12", 12), ("cuda13", 13)):
        wanted = [r for r in requires if r.endswith(f"extra == '{extra}'") or r.endswith(f'extra == "{extra}"')]
        assert any(r.startswith(f"cupy-cuda{major}x") for r in wanted), wanted
        (toolkit,) = [r for r in wanted if r.startswith("cuda-toolkit[")]
        assert "cudart" in toolkit and "nvrtc" in toolkit and f"<{major + 1}" in toolkit, toolkit
    # torch is an extra, never a base requirement, and its module ships.
    torch_requires = [r for r in requires if r.startswith("torch")]
    assert torch_requires and all("extra ==" in r and "torch" in r.split("extra ==")[1] for r in torch_requires)
    assert "kpool_cupy/torch/__init__.py" in names and "kpool_cupy/torch/schema.py" in names
    # Installed from the wheel (unpacked away from the checkout), the package
    # finds its kernels inside itself.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    script = "from kpool_cupy.kernel.sources import kernels_dir; print(kernels_dir())"
    env = {**os.environ, "PYTHONPATH": str(site)}
    found = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert found.stdout.strip() == str(site / "kpool_cupy" / "kernels"), found.stderr


def test_the_cuda12_extra_puts_the_runtime_headers_where_cupy_looks():
    """scripts/_venv.sh installs the cuda12 extra; CuPy 14 asks cuda-pathfinder for the headers."""
    pathfinder = pytest.importorskip("cuda.pathfinder", reason="the cuda12 extra is not installed here")
    include = pathfinder.find_nvidia_header_directory("cudart")
    assert include is not None and (Path(include) / "cuda_fp16.h").is_file(), include


def test_import_and_cpu_backends_work_without_cupy(tmp_path):
    # A meta-path finder that refuses cupy stands in for a machine without it.
    script = (
        "import sys\n"
        "class NoCupy:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('cupy', 'cupy_backends', 'cupyx'):\n"
        "            raise ImportError('no cupy here')\n"
        "sys.meta_path.insert(0, NoCupy())\n"
        "import numpy as np, kpool_cupy\n"
        "from kpool_cupy import reference\n"
        "k = np.ones((8, 8), np.float32)\n"
        "out = reference.kpool_compress(k, k, np.zeros((4, 8), np.float32), np.array([0, 8]), np.array([0]))\n"
        "assert out.shape == (2, 8)\n"
        "try:\n"
        "    kpool_cupy.kpool_compress(k, k, k[:4], np.array([0, 8]), np.array([0]))\n"
        "except RuntimeError as error:\n"
        "    print('clear:', 'CuPy' in str(error))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "clear: True" in done.stdout


def test_importing_the_package_imports_no_torch():
    # kpool_cupy.torch is imported only when asked: the base package never pays for torch.
    script = "import sys, kpool_cupy, kpool_cupy.emulate, kpool_cupy.reference; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip() == "False", done.stderr


@pytest.mark.slow
def test_the_main_job_installs_the_package_alone_and_passes(tmp_path):
    # scripts/check.sh, the README's main job, on a copy of the tracked tree
    # in a new .venv: on a machine without an NVIDIA driver it installs the
    # package alone (about 100 MB; it installed the test stack and torch,
    # 1.7 GB) and checks the kernels on the emulator.
    if subprocess.run(["sh", "-c", "command -v nvidia-smi"], capture_output=True).returncode == 0:
        pytest.skip("this machine has an NVIDIA driver: the main job installs CuPy there too")
    if not (ROOT / ".git").exists():  # an unpacked sdist: no list of the tracked tree to copy (a hostile round)
        pytest.skip("needs a git checkout: the copy is of the files git tracks")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    copy = tmp_path / "clone"
    for name in filter(None, tracked.decode().split("\0")):
        target = copy / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_file():
            target.write_bytes((ROOT / name).read_bytes())
    (copy / "scripts").joinpath("check.sh").chmod(0o755)
    environment = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    environment |= {"XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin:" + environment.get("PATH", "")}
    done = subprocess.run(
        ["bash", "scripts/check.sh", "--kpool", "2", "--head-dim", "16"],
        cwd=copy,
        env=environment,
        capture_output=True,
        text=True,
        timeout=1800,  # a hang guard: the install and check take about 30 s here
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all" in done.stdout and "pass" in done.stdout
    installed = subprocess.run(
        [str(copy / ".venv/bin/python"), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
    ).stdout.lower()
    for heavy in ("torch", "pytest", "cupy", "hypothesis"):
        assert f"\n{heavy}" not in "\n" + installed, installed
    size = sum(f.stat().st_size for f in (copy / ".venv").rglob("*") if f.is_file() and not f.is_symlink())
    assert size < 400 * 2**20, f"{size / 2**20:.0f} MB"  # the bound for the main job
