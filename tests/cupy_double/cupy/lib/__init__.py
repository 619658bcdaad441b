"""cupy.lib for the double."""

from . import stride_tricks  # noqa: F401
