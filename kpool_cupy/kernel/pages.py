"""The paged key cache as the kernels lay it out, in one place: ``kp::Fp8Sink`` (kernels/kpool_fp8.cuh) writes
it, the scorer and the fused select read it, and every check, reference kernel and tool that touches its bytes
asks a ``PageLayout`` where they are.

The FP8 layout (``FP8_PAGES``) is the one vLLM and SGLang share: uint8
``[num_blocks, block_size, head_dim + 4]``, each page its ``block_size *
head_dim`` value bytes (entry t at byte ``t * head_dim``), then ``block_size``
float32 scales (entry t at byte ``block_size * head_dim + 4 * t``). Flat slot
s is page ``s // block_size``, entry ``s % block_size``. Another key format
(bf16 keys, say) is another ``PageLayout``, not another set of checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PageLayout:
    """A page of ``block_size`` entries: every entry's values first (``value_bytes`` a channel), then every
    entry's scale (``scale_bytes`` each); the cache's last dim is an entry's bytes."""

    name: str
    value_bytes: int
    scale_bytes: int

    def entry_bytes(self, head_dim: int) -> int:
        """The cache's last dim: one entry's values and its scale."""
        return head_dim * self.value_bytes + self.scale_bytes

    def head_dim(self, entry_bytes: int) -> int:
        """The head_dim of a cache whose last dim is ``entry_bytes``."""
        return (entry_bytes - self.scale_bytes) // self.value_bytes

    def value_offset(self, head_dim: int, entry: Any) -> Any:
        """Byte of entry ``entry``'s first value in its page (ints or NumPy arrays)."""
        return entry * head_dim * self.value_bytes

    def scale_offset(self, block_size: int, head_dim: int, entry: Any) -> Any:
        """Byte of entry ``entry``'s scale in its page (ints or NumPy arrays)."""
        return block_size * head_dim * self.value_bytes + entry * self.scale_bytes


FP8_PAGES = PageLayout("e4m3fn values, float32 scales", value_bytes=1, scale_bytes=4)
