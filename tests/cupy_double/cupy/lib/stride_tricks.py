"""cupy.lib.stride_tricks.as_strided for the double: a view of the same memory, like CuPy's."""

from __future__ import annotations

import numpy as np


def as_strided(x, shape=None, strides=None):
    return np.lib.stride_tricks.as_strided(x, shape=shape, strides=strides, subok=True)
