"""What the AddressSanitizer runs share: the runtime, the flags, the environment, the cache and the control.

An instrumented library cannot load into a Python started without the
sanitizer runtime, so each run is a child process with libasan preloaded.
Its builds go to a cache of their own beside the user's
(``<cache>/kpool-cupy/sanitized``, as the child's ``XDG_CACHE_HOME``), each
built with ``SANITIZER_FLAGS`` among its flags (which are part of its
name's key): the runs share builds, and a warm cache spares their compiles
(the cooperation run: 58 s cold, 23 s warm). The control of a run is the
libraries its process loaded, printed as it exits: each must carry the
sanitizer (a run built without ``-fsanitize=address`` fails it).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from kpool_cupy import emulate
from kpool_cupy.emulator import toolchain

ROOT = Path(__file__).resolve().parent.parent

# -O1, which the sanitizer's documentation suggests for reasonable speed. The
# first garbage sweep took 2m46s at the builds' -O2 and 2m17s at -O1
# (2026-12-06, one core each), most of it compiling.
SANITIZER_FLAGS = "-O1 -fsanitize=address -fno-omit-frame-pointer -g"

# A guard against a hang, not a budget: the longest run (300 garbage calls of
# every family, about 200 instrumented builds) took 263 s on a quiet machine
# and 437 s on a busy one, cold.
TIMEOUT_S = 3600

LOADED = "sanitized libraries loaded: "

# Opens every child's script: at exit, the libraries the process loaded.
REPORT_LOADED = textwrap.dedent(
    f"""
    import atexit as _atexit
    from kpool_cupy.emulator import toolchain as _toolchain

    _atexit.register(lambda: print({LOADED!r} + repr(sorted(lib._name for lib in _toolchain._loaded.values()))))
    """
)


def runtime(library: str) -> str | None:
    """The host compiler's copy of a sanitizer's runtime ``library`` (``libasan.so``, ``libubsan.so``), or None."""
    try:
        cxx = toolchain.compiler()
    except toolchain.CompilerNotFoundError:
        return None
    path = subprocess.run([cxx, f"-print-file-name={library}"], capture_output=True, text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


def libasan() -> str | None:
    """The host compiler's AddressSanitizer runtime, or None."""
    return runtime("libasan.so")


def cache_home() -> Path:
    """The children's ``XDG_CACHE_HOME``: beside this process's emulator cache, never inside it."""
    return toolchain.cache_dir().parent / "sanitized"


def environment(runtime: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=runtime,
        ASAN_OPTIONS="detect_leaks=0",  # CPython keeps its arenas to exit; leaks are not the question
        XDG_CACHE_HOME=str(cache_home()),
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env[emulate.FLAGS_VARIABLE] = SANITIZER_FLAGS
    return env


def run(script: str, runtime: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``script`` in a sanitized child, which reports the libraries it loaded as it exits."""
    return subprocess.run(
        [sys.executable, "-c", REPORT_LOADED + script],
        env=environment(runtime),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def loaded(stdout: str) -> list[Path]:
    """The libraries a child reported loading (its last report)."""
    lines = [line for line in stdout.splitlines() if line.startswith(LOADED)]
    assert lines, f"the child reported no libraries: {stdout[-2000:]}"
    return [Path(name) for name in ast.literal_eval(lines[-1][len(LOADED) :])]


def assert_instrumented(stdout: str, at_least: int = 1) -> None:
    """Control: the child loaded ``at_least`` libraries, each built with the sanitizer."""
    libraries = loaded(stdout)
    assert len(libraries) >= at_least, libraries
    plain = [path for path in libraries if b"__asan_report" not in path.read_bytes()]
    assert not plain, plain
