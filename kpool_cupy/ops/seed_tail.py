"""kpool_seed_tail, described once: stash each request's trailing tokens into its ring."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import signed_index
from ..kernel.declarations import SEED_TAIL
from ..kernel.geometry import group_geometry
from ..pool_offsets import check_kpool
from .families.rings import check_slot_values, check_slots, check_tail
from .framework.checks import as_size, check_batch_index, check_keys, check_rows_and_cache
from .framework.examples import Example, ExampleBatch
from .framework.operands import (
    CACHE_LENGTHS,
    INPUT_ROW_OFFSETS,
    RING,
    RING_GATE,
    SLOT_IDX,
    TOKEN_K,
    TokenRingCall,
    token_ring_template,
    token_ring_values,
)
from .framework.spec import VALIDATE, Backend, CallArgs, Launch, OpSpec, Option

# What the checks learn about a seed tail call: the ring and the call's tokens, nothing written beside.
SeedTailCall = TokenRingCall


def check_seed_tail_args(a: CallArgs) -> SeedTailCall:
    """Check everything about a call that needs no array contents."""
    head_dim = check_keys(a.k, a.gate)
    batch = check_batch_index(a.input_row_offsets, a.cache_lengths)
    if a.kpool is not None:
        check_kpool(a.kpool)
    dtypes = np.dtype(a.k.dtype), np.dtype(a.gate.dtype)
    max_slots, _, _ = check_tail(a.tail, *dtypes, a.kpool, head_dim, writes=True)
    check_slots(a.slot_idx, batch)
    return SeedTailCall(head_dim, batch, as_size(a.k.shape[0]), max_slots, *dtypes)


def seed_tail_launch(call: SeedTailCall, operands: dict[str, Any]) -> Launch:
    """The launch of ``kpool_seed_tail``."""
    o = operands
    values = token_ring_values(o, call)
    template = token_ring_template(o, call)
    return Launch(SEED_TAIL, template, values, group_geometry(call.head_dim, call.batch), operands)


def run(backend: Backend, call: SeedTailCall, a: dict[str, Any], *, validate: bool, **options: Any) -> None:
    """Check that every request that writes the ring has a slot of its own when asked, launch."""
    if validate:
        offsets, lengths, slots = backend.host_copies([a["input_row_offsets"], a["cache_lengths"], a["slot_idx"]])
        slots = signed_index(slots, a["slot_idx"].dtype)
        check_rows_and_cache(call.total_tokens, offsets, lengths)
        check_slot_values(slots, call.max_slots, writers=np.diff(offsets) > 0)
    if call.batch:
        backend.launch(seed_tail_launch(call, a))


# Seed tail stashes whatever kpool is; a kpool given is checked against the ring (at least that many rows).
SEED_KPOOL = Option("kpool", "int | None", None, check=check_kpool)
PARAMETERS = (RING, TOKEN_K, RING_GATE, INPUT_ROW_OFFSETS, CACHE_LENGTHS, SLOT_IDX, VALIDATE, SEED_KPOOL)
EMULATE_DOC = """Stash each request's trailing tokens into its ring, running the CUDA kernel on the CPU.

Same contract as :func:`kpool_cupy.kpool_seed_tail`."""
REFERENCE_DOC = """Stash each request's trailing tokens into its ring (NumPy).

Same contract as :func:`kpool_cupy.kpool_seed_tail`."""
DOCS = {"emulate": EMULATE_DOC, "reference": REFERENCE_DOC}  # the GPU's is the def's (functions.py)


def example(b: ExampleBatch) -> Example:
    """The two requests' tokens into their rings."""
    return (b.ring, b.k, b.gate, b.offsets, b.lengths, b.slots), {"kpool": b.kpool}


# No results and no outputs: it writes only the ring.
SPEC = OpSpec(
    "kpool_seed_tail",
    PARAMETERS,
    (),
    check_seed_tail_args,
    run,
    DOCS,
    lambda call: {},
    kernel=SEED_TAIL,
    example=example,
)
