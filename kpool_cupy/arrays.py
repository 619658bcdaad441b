"""What kind of array object an argument is, before anything reads its dtype or shape."""

from __future__ import annotations

from typing import Any

import numpy as np


def is_cupy_array(array: Any) -> bool:
    """Whether ``array`` is a CuPy array, told without importing CuPy."""
    return type(array).__module__.split(".")[0] == "cupy"


def check_array_kind(name: str, array: Any) -> None:
    """A NumPy or CuPy array, or a TypeError naming ``name``.

    NumPy subclasses that change what the elements mean are refused: a masked
    array's mask and a matrix's 2-D-only rules would be ignored by a kernel
    reading the bare buffer. Memory maps and other plain views are arrays.
    """
    if isinstance(array, (np.ma.MaskedArray, np.matrix)):
        raise TypeError(
            f"Invalid {name}: expected a plain array, got {type(array).__module__}.{type(array).__name__} "
            "(pass .data of a masked array after handling its mask, or np.asarray of a matrix)"
        )
    if isinstance(array, np.ndarray) or is_cupy_array(array):
        return
    raise TypeError(
        f"Invalid {name}: expected a NumPy or CuPy array, got {type(array).__module__}.{type(array).__name__} "
        "(other frameworks' arrays convert without a copy through numpy.from_dlpack or cupy.from_dlpack)"
    )
