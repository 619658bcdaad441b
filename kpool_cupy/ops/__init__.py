"""The ops, each described once (see ``spec``); ``OPS`` lists them in the order the public modules bind them."""

from __future__ import annotations

from .compress import FP8_SPEC as COMPRESS_FP8
from .compress import SPEC as COMPRESS
from .compress_backward import SPEC as COMPRESS_BACKWARD
from .expand_topk import SPEC as EXPAND_TOPK
from .framework.spec import OpSpec
from .hadamard_quant_fp8 import SPEC as HADAMARD_QUANT_FP8
from .index_logits_fp8 import SPEC as INDEX_LOGITS_FP8
from .index_select_fp8 import SPEC as INDEX_SELECT_FP8
from .index_topk import SPEC as INDEX_TOPK
from .ring_close import FP8_SPEC as RING_CLOSE_FP8
from .ring_close import SPEC as RING_CLOSE
from .seed_tail import SPEC as SEED_TAIL
from .tail_update import FP8_SPEC as TAIL_UPDATE_FP8
from .tail_update import SPEC as TAIL_UPDATE

OPS: tuple[OpSpec, ...] = (
    COMPRESS,
    RING_CLOSE,
    SEED_TAIL,
    TAIL_UPDATE,
    EXPAND_TOPK,
    COMPRESS_FP8,
    RING_CLOSE_FP8,
    TAIL_UPDATE_FP8,
    HADAMARD_QUANT_FP8,
    INDEX_LOGITS_FP8,
    INDEX_TOPK,
    INDEX_SELECT_FP8,
    COMPRESS_BACKWARD,
)

__all__ = [
    "COMPRESS",
    "COMPRESS_BACKWARD",
    "COMPRESS_FP8",
    "EXPAND_TOPK",
    "HADAMARD_QUANT_FP8",
    "INDEX_LOGITS_FP8",
    "INDEX_SELECT_FP8",
    "INDEX_TOPK",
    "OPS",
    "RING_CLOSE",
    "RING_CLOSE_FP8",
    "SEED_TAIL",
    "TAIL_UPDATE",
    "TAIL_UPDATE_FP8",
]
