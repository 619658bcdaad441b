"""Where the package keeps what it builds: a folder per kind under the user's cache folder."""

from __future__ import annotations

import os
from pathlib import Path


def cache_folder(kind: str) -> Path:
    """``$XDG_CACHE_HOME/kpool-cupy/<kind>``; ``~/.cache`` stands in where the variable is unset, empty or a
    relative path (the XDG rule: a relative one is ignored, not read from the current folder)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kpool-cupy" / kind


def make_cache_dir(folder: Path) -> None:
    """``folder`` and its parents, or an OSError that says it is the package's build cache and how to move it
    (the bare error named a path and nothing else)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise type(error)(
            error.errno,
            f"kpool-cupy cannot make its build cache {folder} ({error.strerror}); set XDG_CACHE_HOME to a "
            "writable folder",
            error.filename,  # the folder that failed, maybe one above the cache's own
        ) from error
