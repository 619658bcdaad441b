"""The build caches' folder: XDG's rules, and an error that says what the folder is when it cannot be made."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kpool_cupy.cache_dirs import cache_folder, make_cache_dir
from kpool_cupy.emulator import toolchain
from kpool_cupy.kernel import nvrtc


@pytest.mark.parametrize("value", [None, "", "relative/cache", "./cache"], ids=["unset", "empty", "relative", "dot"])
def test_the_home_cache_stands_in_where_xdg_cache_home_is_not_an_absolute_path(monkeypatch, tmp_path, value):
    # The XDG rule: a relative XDG_CACHE_HOME is ignored (it was read from the current folder: a hostile round).
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    if value is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", value)
    home_cache = tmp_path / "home" / ".cache" / "kpool-cupy"
    assert cache_folder("emulate") == toolchain.cache_dir() == home_cache / "emulate"
    assert nvrtc.cubin_cache_dir() == home_cache / "cubin"


def test_an_absolute_xdg_cache_home_holds_every_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert toolchain.cache_dir() == tmp_path / "kpool-cupy" / "emulate"
    assert nvrtc.cubin_cache_dir() == tmp_path / "kpool-cupy" / "cubin"


def test_a_cache_that_cannot_be_made_says_what_it_is_and_how_to_move_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    folder = blocker / "kpool-cupy" / "emulate"  # under a file: no mkdir makes it, whoever runs the test
    with pytest.raises(OSError, match=r"^\[Errno \d+\] kpool-cupy cannot make its build cache .*a-file/kpool-cupy/"
                                      r"emulate \(.*\); set XDG_CACHE_HOME to a writable folder"):  # fmt: skip
        make_cache_dir(folder)
    with pytest.raises(OSError) as raised:
        make_cache_dir(folder)
    assert raised.value.filename is not None and str(blocker) in raised.value.filename  # where it failed


def test_the_cli_names_the_cache_it_cannot_make(tmp_path):
    # A fresh process, so no variant is loaded yet: the emulator's first build makes the folder.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "kpool_cupy", "check", "--backend", "emulate", "--op", "seed_tail"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CACHE_HOME": str(blocker)},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "kpool-cupy cannot make its build cache" in done.stderr and "set XDG_CACHE_HOME" in done.stderr
