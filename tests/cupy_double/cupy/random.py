"""cupy.random.default_rng for the double."""

from __future__ import annotations

import numpy as np


class Generator:
    def __init__(self, seed=None) -> None:
        self._rng = np.random.default_rng(seed)

    def standard_normal(self, size=None, dtype=np.float64):
        from . import _wrap

        return _wrap(self._rng.standard_normal(size, dtype=dtype))

    def integers(self, low, high=None, size=None, dtype=np.int64, endpoint=False):
        from . import _wrap

        return _wrap(self._rng.integers(low, high, size, dtype=dtype, endpoint=endpoint))


def default_rng(seed=None) -> Generator:
    return Generator(seed)


_module_rng = Generator()


def standard_normal(size=None, dtype=np.float64):
    """cupy.random.standard_normal: draws of the module's own generator (CuPy's legacy RandomState API)."""
    return _module_rng.standard_normal(size, dtype=dtype)
