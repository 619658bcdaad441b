"""Every op's public function, one ``def`` each: its signature, its contract, one call into the op machinery.

    kpool_cupy.kpool_compress(k, gate, ape, input_row_offsets, cache_lengths)

Each def here is defined once and bound four times: ``kpool_cupy`` (the
GPU), ``kpool_cupy.emulate``, ``kpool_cupy.reference`` and
``kpool_cupy.torch`` each hold a copy of it whose ``call_backend`` runs the
op on their backend (``ops.framework.binding.bind``). A copy keeps this code, so
``inspect.getsource`` and an editor's go-to-definition land here; it gets
its module's name, the docstring of its backend (the one below is the
GPU's), and a ``__signature__`` with its backend's array types and
keywords (``backend_options``: ``stream=`` on the GPU, ``accumulate=`` on
the reference where the op has it). Calling a def here directly raises:
it belongs to no backend.

``@defines(ops.SPEC)`` ties a def to its op's description; binding checks that
the def's parameters are the spec's, in order, with the same defaults, and
``tests/test_public_functions.py`` that each def hands every argument on
under its own name.

One file rather than one per op: the ops' signatures share their shape
(``k: Array,`` line after line), and in one file a reader sees the whole
public surface at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from . import ops
from .arrays import Array, Result
from .ops.framework.binding import BackendOptions
from .ops.framework.spec import OpSpec

if TYPE_CHECKING:
    from typing_extensions import Unpack

Function = TypeVar("Function", bound=Callable[..., Any])

# What ``from kpool_cupy.functions import *`` gives a public module: the ops
# (tests/test_public_functions.py holds the two lists together).
__all__ = [
    "hadamard_quant_fp8",
    "kpool_compress",
    "kpool_compress_backward",
    "kpool_compress_fp8",
    "kpool_expand_topk",
    "kpool_index_logits_fp8",
    "kpool_index_select_fp8",
    "kpool_index_topk",
    "kpool_ring_close",
    "kpool_ring_close_fp8",
    "kpool_seed_tail",
    "kpool_tail_update",
    "kpool_tail_update_fp8",
]

DEFINITIONS: dict[str, Callable[..., Any]] = {}  # spec name -> its def, in the order of this file


def defines(spec: OpSpec) -> Callable[[Function], Function]:
    """Mark a def as the public function of ``spec`` (the def itself is returned unchanged)."""

    def register(function: Function) -> Function:
        if function.__name__ != spec.name:
            raise ValueError(f"Invalid def for {spec.name}: expected a def of that name, got {function.__name__}")
        function.__kpool_spec__ = spec  # type: ignore[attr-defined]
        DEFINITIONS[spec.name] = function
        return function

    return register


def call_backend(arrays: tuple[Any, ...], options: dict[str, Any], backend_options: dict[str, Any]) -> Any:
    """What a def here calls before it is bound: nothing runs, since these defs belong to no backend."""
    raise RuntimeError(
        "kpool_cupy.functions holds the ops' definitions; call them through kpool_cupy, kpool_cupy.emulate, "
        "kpool_cupy.reference or kpool_cupy.torch"
    )


@defines(ops.COMPRESS)
def kpool_compress(
    k: Array,
    gate: Array,
    ape: Array,
    input_row_offsets: Array,
    cache_lengths: Array,
    *,
    pool_row_offsets: Array | None = None,
    out: Array | None = None,
    validate: bool = True,
    out_dtype: Any = None,
    rotate: bool = False,
    total_pools: int | None = None,
    **backend_options: Unpack[BackendOptions],
) -> Result:
    """Pool each complete k-pool of a ragged batch into one key, on the GPU.

        logits[m, c] = gate[member m, c] + ape[m, c]
        w[:, c]      = softmax over m of logits[:, c]
        pooled[p, c] = sum_m w[m, c] * k[member m, c]

    The softmax runs per channel: each channel of a pool has its own member
    weights. Request ``b`` owns token rows ``[input_row_offsets[b],
    input_row_offsets[b+1])`` at absolute positions ``cache_lengths[b] + i``;
    pool ``q`` covers positions ``[q*kpool, (q+1)*kpool)`` and only pools whose
    members all arrive in this call are built, in order, at output rows
    ``[pool_row_offsets[b], pool_row_offsets[b+1])``.

    Parameters
    ----------
    k, gate
        ``[total_tokens, head_dim]``, bfloat16, float16 or float32, last dim
        contiguous, rows at any stride. CuPy arrays or any CUDA array with
        ``__dlpack__`` or ``__cuda_array_interface__`` (zero copy).
    ape
        float32 ``[kpool, head_dim]``; ``kpool`` is ``ape.shape[0]``.
    input_row_offsets, cache_lengths
        ``[batch + 1]`` and ``[batch]``, int32, uint32 or int64.
    pool_row_offsets
        Optional ``[batch + 1]``; must equal :func:`kpool_cupy.pool_row_offsets`.
    out
        Optional ``[>= total_pools, head_dim]``, bfloat16, float16 or float32
        whatever k's dtype; rows past ``total_pools`` are not written.
    validate
        Check offset contents (one device-to-host copy). With ``out``,
        ``pool_row_offsets`` and ``validate=False`` the call neither syncs nor
        allocates, so it can be captured in a CUDA graph (for CuPy and DLPack
        inputs; CuPy syncs on the stream a ``__cuda_array_interface__``
        names). Unvalidated garbage never makes the kernel touch memory
        outside its arrays.
    out_dtype
        bfloat16, float16 or float32 (a name or a dtype): the dtype of the new
        output, or the one ``out`` must have; default out's dtype, else k's.
    rotate
        Write each pool's Walsh-Hadamard rotation ``y = bf16(B(bf16(pooled)) *
        fl32(1/sqrt(head_dim)))`` (rounded to the output dtype) instead of the
        pool: the keys of a bf16 cache that an engine scores with rotated
        queries (:func:`hadamard_quant_fp8`'s rotation). head_dim must be a
        power of two from 8 to 256.
    total_pools
        The rows of the new result, where the caller knows them (an engine
        holds its lengths on the host): no device read sizes it, so with
        ``pool_row_offsets`` and ``validate=False`` the call neither syncs nor
        allocates anything but the result, and a training step through
        ``kpool_cupy.torch`` can be captured in a CUDA graph. At least the
        pools the call builds (a ValueError with ``validate=True``; without it
        the pools past it are dropped); rows past the pools are zero. With
        ``out``, ``out`` holds the result (the count is still checked). At
        most 2^31 - 1.
    stream
        A ``cupy.cuda.Stream``, a raw handle, or anything with
        ``__cuda_stream__`` or ``.cuda_stream``; default CuPy's current stream.

    Returns
    -------
    cupy.ndarray
        ``out`` (as a CuPy view), or a new ``[total_pools, head_dim]`` array in
        ``out_dtype`` (default the dtype of ``k``).
    """
    return call_backend(
        (k, gate, ape, input_row_offsets, cache_lengths, pool_row_offsets, out),
        {"validate": validate, "out_dtype": out_dtype, "rotate": rotate, "total_pools": total_pools},
        backend_options,
    )


@defines(ops.RING_CLOSE)
def kpool_ring_close(
    tail: Array | tuple[Array, Array],
    k: Array,
    gate: Array,
    ape: Array,
    input_row_offsets: Array,
    cache_lengths: Array,
    slot_idx: Array,
    *,
    out: Array | None = None,
    closed: Array | None = None,
    validate: bool = True,
    out_dtype: Any = None,
    rotate: bool = False,
    **backend_options: Unpack[BackendOptions],
) -> tuple[Result, Result]:
    """Close each request's pending pool from its ring and this call's first tokens.

        pooled[b] = kpool_compress's pool c // kpool, members m < c % kpool
                    from ring positions m, the rest from the call's first tokens

    For a request whose cached prefix ends mid-pool (``c % kpool != 0``) and
    whose call brings at least ``kpool - c % kpool`` tokens. ``tail`` is
    ``[max_slots, 2, ring, head_dim]`` in the dtype of k (0 keys, 1 gate
    scores), or a pair ``(key_ring, gate_ring)`` of ``[max_slots, ring,
    head_dim]`` arrays in k's and gate's dtypes; ``ring >= kpool`` rows,
    position ``pos`` at row ``pos % ring``; any slot, half and row strides, last
    dim contiguous. Request b's ring is slot ``slot_idx[b]``; it is read, never
    written. The ring holds raw values, so the pool equals, bit for bit, the
    one kpool_compress builds over the whole sequence. ``rotate=True`` writes its
    Hadamard rotation instead, as :func:`kpool_compress`'s ``rotate``.

    Returns
    -------
    (pooled, closed)
        pooled ``[batch, head_dim]`` (``out_dtype``, else out's or k's dtype), closed
        ``[batch]`` int32: the pool id, or -1 where nothing closed (that
        pooled row is left alone).
    """
    return call_backend(
        (tail, k, gate, ape, input_row_offsets, cache_lengths, slot_idx, out, closed),
        {"validate": validate, "out_dtype": out_dtype, "rotate": rotate},
        backend_options,
    )


@defines(ops.SEED_TAIL)
def kpool_seed_tail(
    tail: Array | tuple[Array, Array],
    k: Array,
    gate: Array,
    input_row_offsets: Array,
    cache_lengths: Array,
    slot_idx: Array,
    *,
    validate: bool = True,
    kpool: int | None = None,
    **backend_options: Unpack[BackendOptions],
) -> None:
    """Stash each request's last tokens into its ring, in place.

    Positions ``[max(c + n - ring, c), c + n)``, the call's last
    ``min(n, ring)`` tokens, go to ring row ``pos % ring`` of slot
    ``slot_idx[b]``. Seed tail needs no kpool: on a ring of any
    ``ring >= kpool`` rows (a longer one for speculative decoding, see
    :func:`kpool_cupy.kpool_tail_update`) every member a later call's pools read
    from the ring is among them, and seeding a prompt in two chunks leaves the
    ring as seeding it in one. A prefill chunk calls ring close, then compress,
    then seed tail. ``tail`` is ``[max_slots, 2, ring, head_dim]`` in the dtype
    of k, or a pair ``(key_ring, gate_ring)`` of ``[max_slots, ring, head_dim]``
    arrays in k's and gate's dtypes, any slot, half and row strides with the
    last dim contiguous. ``kpool=`` is optional; given, the ring must have at
    least that many rows. With ``validate=True`` each request with tokens in
    the call needs a slot of its own (requests without tokens may share one).
    """
    return call_backend(
        (tail, k, gate, input_row_offsets, cache_lengths, slot_idx),
        {"validate": validate, "kpool": kpool},
        backend_options,
    )


@defines(ops.TAIL_UPDATE)
def kpool_tail_update(
    tail: Array | tuple[Array, Array],
    k: Array,
    gate: Array,
    ape: Array,
    positions: Array,
    slot_idx: Array,
    *,
    out: Array | None = None,
    closed: Array | None = None,
    validate: bool = True,
    out_dtype: Any = None,
    rotate: bool = False,
    **backend_options: Unpack[BackendOptions],
) -> tuple[Result, Result]:
    """The decode step: stash each token in its request's ring, close every pool it completes.

    ``k``, ``gate`` ``[R, next_n, head_dim]``, ``positions`` ``[R, next_n]``
    (int32, uint32 or int64) with -1 for padding. Each request's tokens are
    walked in order; every real token is stashed at ring row ``pos % ring``
    (``tail`` ``[max_slots, 2, ring, head_dim]`` in k's dtype, gate in it too,
    or a pair ``(key_ring, gate_ring)`` of ``[max_slots, ring, head_dim]`` in
    k's and gate's dtypes; ``ring >= kpool``, any slot, half and row strides,
    last dim contiguous), and pool ``pos // kpool``
    closes from its members' rows ``(q * kpool + m) % ring`` when
    ``pos % kpool == kpool - 1``. A padded entry leaves the ring byte-identical.

    Speculative decoding: with ``ring >= kpool + next_n - 1``, a schedule of
    steps in which any suffix of a step's tokens may be rejected, and the next
    step restarts at the first rejected position, closes every pool whose
    closing token was accepted with the bits one ``kpool_compress`` over the
    accepted sequence gives (discard the pools closed by rejected tokens). No
    state but the ring is kept. Proof: a pool closed at an accepted position
    ``p`` has members ``p - kpool + 1 .. p``, all accepted. Each was written
    when it was last stashed, and a later write to its row came from a position
    ``d`` with ``d ≡ a (mod ring)``, ``d > a``. Within a step positions only
    grow, so such a ``d`` before ``p`` in the walk is below ``p``, hence within
    ``kpool - 1`` of ``a``: not a multiple of ``ring`` away. A ``d`` from an
    earlier step that was rejected is at least the restart position ``r`` and
    at most ``r + next_n - 1``, while ``a >= r - kpool + 1`` for a member of the
    pool open at the restart (members below ``r`` were accepted) or ``a >= r``
    (stashed again after it): so ``0 < d - a <= kpool + next_n - 2 < ring``, never
    a multiple of ``ring``. Every member row therefore holds the accepted token,
    and the pool is reduced in member order as compress reduces it.

    ``rotate=True`` writes each closed pool's Hadamard rotation instead, as
    :func:`kpool_compress`'s ``rotate``.

    Returns
    -------
    (pooled, closed)
        pooled ``[R, ceil(next_n / kpool), head_dim]`` (``out_dtype``, else
        out's or k's dtype) and closed
        ``[R, ceil(next_n / kpool)]`` int32: the pool ids closed, in order,
        padded with -1 (those pooled rows are left alone).
    """
    return call_backend(
        (tail, k, gate, ape, positions, slot_idx, out, closed),
        {"validate": validate, "out_dtype": out_dtype, "rotate": rotate},
        backend_options,
    )


@defines(ops.EXPAND_TOPK)
def kpool_expand_topk(
    pool_ids: Array,
    input_row_offsets: Array,
    cache_lengths: Array,
    *,
    kpool: int,
    always_select_tail: bool = False,
    validate: bool = True,
    block_table: Array | None = None,
    block_size: int | None = None,
    compact: bool = False,
    out: Array | None = None,
    counts: Array | None = None,
    **backend_options: Unpack[BackendOptions],
) -> Result | tuple[Result, Result]:
    """Selected pool ids ``[total_tokens, pool_topk]`` to token positions, int32.

        positions[t, s*kpool + j] = pool_ids[t, s] * kpool + j, or -1 where pool_ids[t, s] < 0

    A -1 id stays -1 in all its columns, never a clamped valid position (so
    does an id whose positions would not fit int32). With
    ``always_select_tail``, ``kpool - 1`` more columns hold the query's
    trailing positions no complete pool covers yet: with ``visible =
    cache_len + local_index + 1``, column ``i < visible % kpool`` holds
    ``visible - visible % kpool + i``, the rest -1.

    With ``block_table`` (int32 ``[batch, max_blocks]``) and ``block_size``,
    each position ``p`` of a token of request ``b`` becomes its cache slot
    ``block_table[b, p // block_size] * block_size + p % block_size``; -1 stays
    -1, and so does a position whose block is past the table (with
    ``validate=True`` that is a ``ValueError``) or whose entry is negative. With
    ``compact=True`` each row's valid entries are packed to the left in column
    order, -1 after, and the call returns ``(positions, counts)``, ``counts``
    int32 ``[total_tokens]``.

    ``out`` (int32 ``[total_tokens, width]``, C-contiguous, writable) takes
    the positions and ``counts`` (int32 ``[total_tokens]``, with ``compact``
    and ``out`` only) the counts, in place of new arrays; the call returns
    them. Every element of both is written. With both given and
    ``validate=False`` the call reads nothing back and makes nothing, so it
    can be captured in a CUDA graph.
    """
    return call_backend(
        (pool_ids, input_row_offsets, cache_lengths, block_table, out, counts),
        {
            "kpool": kpool,
            "always_select_tail": always_select_tail,
            "validate": validate,
            "block_size": block_size,
            "compact": compact,
        },
        backend_options,
    )


@defines(ops.COMPRESS_FP8)
def kpool_compress_fp8(
    k: Array,
    gate: Array,
    ape: Array,
    input_row_offsets: Array,
    cache_lengths: Array,
    *,
    pool_row_offsets: Array | None = None,
    round_scale: bool = True,
    cache: Array | None = None,
    slots: Array | None = None,
    block_table: Array | None = None,
    out: Array | None = None,
    out_scale: Array | None = None,
    validate: bool = True,
    **backend_options: Unpack[BackendOptions],
) -> tuple[Result, Result] | None:
    """Pool each complete k-pool into an FP8 key: rotated, scaled, e4m3fn, into rows or a paged cache.

    One fused kernel: the pooling of :func:`kpool_compress` (float32), then
    per pool::

        x = bf16(pooled)
        y = bf16(B(x) * fl32(1/sqrt(D)))         B: Walsh-Hadamard butterflies (a+b, a-b), strides 1 .. D/2
        v = fl32(max(max_c |y_c|, 1e-4) * fl32(1/448))
        s = the smallest power of two >= v       (round_scale=True; s = v when False)
        q = e4m3fn(clamp(fl32(y / s), -448, 448))

    Only q's bytes and s are written. head_dim must be a power of two from 8
    to 256. The values are bit for bit the epilogue applied to
    ``kpool_compress``'s own float32 result.

    Parameters
    ----------
    k, gate, ape, input_row_offsets, cache_lengths, pool_row_offsets
        As :func:`kpool_compress`.
    round_scale
        Round each scale up to a power of two (ue8m0), exactly (default).
    cache
        uint8 ``[num_blocks, block_size, head_dim + 4]``: each page holds its
        ``block_size * head_dim`` value bytes (entry t at byte t * head_dim),
        then ``block_size`` float32 scales (entry t at byte
        ``block_size * head_dim + 4 * t``); pages at any stride (a multiple of
        4 bytes), 4-byte aligned. Flat slot s is page s // block_size, entry
        s % block_size. Nothing else in the cache changes.
    slots
        With ``cache``: int64 or int32 ``[>= total_pools]``, output pool p's flat
        slot; -1 skips the pool.
    block_table
        With ``cache``, instead of ``slots``: int32 ``[batch, max_blocks]``;
        request b's pool q (positions ``[q*kpool, (q+1)*kpool)``) goes to slot
        ``block_table[b, q // block_size] * block_size + q % block_size``.
    out, out_scale
        Without ``cache``: uint8 ``[>= total_pools, head_dim]`` (e4m3fn bit
        patterns) and float32 ``[out rows]``, given together; new ones
        otherwise.
    validate
        Check offsets and that every pool lands in the cache in a slot of its
        own (device-to-host copies). With ``validate=False`` garbage slots and
        block tables write nothing outside the cache.
    stream
        As :func:`kpool_compress`.

    Returns
    -------
    tuple of cupy.ndarray, or None
        ``(values, scales)`` without ``cache``; None when writing the cache.
    """
    return call_backend(
        (k, gate, ape, input_row_offsets, cache_lengths, pool_row_offsets, cache, slots, block_table, out, out_scale),
        {"round_scale": round_scale, "validate": validate},
        backend_options,
    )


@defines(ops.RING_CLOSE_FP8)
def kpool_ring_close_fp8(
    tail: Array | tuple[Array, Array],
    k: Array,
    gate: Array,
    ape: Array,
    input_row_offsets: Array,
    cache_lengths: Array,
    slot_idx: Array,
    *,
    round_scale: bool = True,
    cache: Array | None = None,
    slots: Array | None = None,
    block_table: Array | None = None,
    out: Array | None = None,
    out_scale: Array | None = None,
    closed: Array | None = None,
    validate: bool = True,
    **backend_options: Unpack[BackendOptions],
) -> tuple[Result, Result, Result] | Result:
    """Close each request's pending pool into an FP8 key: :func:`kpool_ring_close` with the FP8 epilogue fused.

    The pool is :func:`kpool_ring_close`'s; its bytes and scale are
    :func:`kpool_compress_fp8`'s for the same pool, bit for bit (head_dim a
    power of two from 8 to 256). ``tail``, ``k``, ``gate``, ``ape``,
    offsets, lengths and ``slot_idx`` as :func:`kpool_ring_close`; every ring
    form (longer, split, padded) is taken.

    Parameters
    ----------
    round_scale
        As :func:`kpool_compress_fp8`.
    cache
        As :func:`kpool_compress_fp8`; request b's pool goes to slot
        ``slots[b]`` (int64 or int32 ``[batch]``, -1 skips) or through
        ``block_table`` row b.
    out, out_scale
        Without ``cache``: uint8 ``[>= batch, head_dim]`` and float32 ``[out
        rows]``, given together; new zeroed ones otherwise.
    closed
        Optional int32 ``[>= batch]``: the pool id closed, or -1.
    validate
        As :func:`kpool_ring_close`, and every closed pool lands in the cache in
        a slot of its own.

    Returns
    -------
    (values, scales, closed), or closed when writing the cache
        values uint8 ``[batch, head_dim]``, scales float32 ``[batch]``; rows of
        requests that close nothing are left alone.
    """
    return call_backend(
        (
            tail,
            k,
            gate,
            ape,
            input_row_offsets,
            cache_lengths,
            slot_idx,
            cache,
            slots,
            block_table,
            out,
            out_scale,
            closed,
        ),
        {"round_scale": round_scale, "validate": validate},
        backend_options,
    )


@defines(ops.TAIL_UPDATE_FP8)
def kpool_tail_update_fp8(
    tail: Array | tuple[Array, Array],
    k: Array,
    gate: Array,
    ape: Array,
    positions: Array,
    slot_idx: Array,
    *,
    round_scale: bool = True,
    cache: Array | None = None,
    block_table: Array | None = None,
    out: Array | None = None,
    out_scale: Array | None = None,
    closed: Array | None = None,
    validate: bool = True,
    **backend_options: Unpack[BackendOptions],
) -> tuple[Result, Result, Result] | Result:
    """The decode step into FP8 keys: :func:`kpool_tail_update` with the FP8 epilogue fused.

    The ring, positions and closings are :func:`kpool_tail_update`'s (every
    ring form, speculative steps included); each closed pool's bytes and scale
    are :func:`kpool_compress_fp8`'s for the same pool, bit for bit (head_dim a
    power of two from 8 to 256).

    Speculative steps write every pool their tokens close, drafts included: with
    ``cache`` a pool closed by a draft that is then rejected stays in its slot
    until the pool closes again with accepted tokens, which rewrites it. A
    scorer reads only the pools the accepted length makes visible
    (``q < accepted // kpool``), and the block table must cover the drafts'
    positions too (the README's FP8 example runs such a schedule).

    Parameters
    ----------
    round_scale
        As :func:`kpool_compress_fp8`.
    cache, block_table
        As :func:`kpool_compress_fp8`, given together: request r's pool q goes
        to slot ``block_table[r, q // block_size] * block_size + q % block_size``
        (row r of the call is block table row r).
    out, out_scale
        Without ``cache``: uint8 ``[R, ceil(next_n / kpool), head_dim]`` and
        float32 ``[R, ceil(next_n / kpool)]``, C-contiguous, given together;
        new zeroed ones otherwise.
    closed
        Optional int32 ``[R, ceil(next_n / kpool)]``.
    validate
        As :func:`kpool_tail_update`, and every closed pool lands in the cache in
        a slot of its own.

    Returns
    -------
    (values, scales, closed), or closed when writing the cache
        closed lists the pool ids closed in order, padded with -1 (those rows
        are left alone).
    """
    return call_backend(
        (tail, k, gate, ape, positions, slot_idx, cache, block_table, out, out_scale, closed),
        {"round_scale": round_scale, "validate": validate},
        backend_options,
    )


@defines(ops.HADAMARD_QUANT_FP8)
def hadamard_quant_fp8(
    x: Array,
    *,
    round_scale: bool = True,
    out_dtype: Any = None,
    out: Array | None = None,
    out_scale: Array | None = None,
    validate: bool = True,
    **backend_options: Unpack[BackendOptions],
) -> tuple[Result, Result]:
    """Rotate and quantize query rows to FP8 with the epilogue of :func:`kpool_compress_fp8`.

        y = bf16(B(x) * fl32(1/sqrt(D)))         B: Walsh-Hadamard butterflies, strides 1 .. D/2
        s = the smallest power of two >= fl32(max(max_c |y_c|, 1e-4) * fl32(1/448))   (round_scale=True)
        q = e4m3fn(clamp(fl32(y / s), -448, 448))

    The rotation is orthonormal and the keys of an FP8 cache get the same one,
    so scores keep their values (to the quantization). ``x`` is taken as it is
    (converted to float32 exactly; no bfloat16 rounding first, unlike a pooled
    key).

    Parameters
    ----------
    x
        ``[rows, head_dim]`` bfloat16, float16 or float32 (e.g. queries as
        ``[tokens * heads, head_dim]``), last dim contiguous; head_dim a power of
        two from 8 to 256.
    round_scale
        Round each scale up to a power of two (ue8m0), exactly (default).
    out_dtype
        The values' dtype: uint8 (None, the default) or ``float8_e4m3fn``
        (``ml_dtypes.float8_e4m3fn`` or its name; ``torch.float8_e4m3fn`` in
        ``kpool_cupy.torch``), the same bytes typed as engines take queries.
        An array library without that dtype gives a TypeError naming
        ``out_dtype`` before any launch (whether CuPy 14 holds it has not run
        on a GPU; torch tensors do). With ``out``, ``out`` comes back as
        given, typed as it is.
    out, out_scale
        uint8 (or float8_e4m3fn) ``[rows, head_dim]`` and float32 ``[rows]``,
        given together; new ones otherwise.
    validate
        Accepted for symmetry with the other ops; there are no contents to check.
    stream
        As :func:`kpool_compress`.

    Returns
    -------
    tuple of cupy.ndarray
        ``(values, scales)``: e4m3fn bit patterns (typed ``out_dtype``) and one
        scale per row.
    """
    options = {"round_scale": round_scale, "out_dtype": out_dtype, "validate": validate}
    return call_backend((x, out, out_scale), options, backend_options)


@defines(ops.INDEX_LOGITS_FP8)
def kpool_index_logits_fp8(
    q: Array,
    weights: Array,
    cache: Array,
    cache_block_table: Array,
    input_row_offsets: Array,
    cache_lengths: Array,
    *,
    kpool: int,
    max_pools: int | None = None,
    out: Array | None = None,
    validate: bool = True,
    **backend_options: Unpack[BackendOptions],
) -> Result:
    """Score every query token against the pooled FP8 cache: the indexer's logits.

        logits[t, p] = sum over h of weights[t, h] * relu(s[p] * dot(q[t, h, :], k[p, :]))  for p < visible(t)
                     = -inf                                                          for visible(t) <= p < max_pools
        visible(t)   = (cache_lengths[b] + t - input_row_offsets[b] + 1) // kpool     (b: the request of t)

    One logit per token and pool: the heads are summed inside, each weighted
    after its relu (fold the query's own scale into ``weights``). A token sees
    the complete pools at or before its position. relu keeps NaN: an e4m3 NaN
    byte (0x7f, 0xff) in q or a key makes the logit NaN.

    Parameters
    ----------
    q
        uint8 ``[num_tokens, heads, head_dim]``: e4m3fn bytes (for example
        :func:`hadamard_quant_fp8` of the queries), heads 1 to 128, head_dim
        64, 128 or 256; last dim contiguous.
    weights
        float32 ``[num_tokens, heads]``, last dim contiguous.
    cache
        uint8 ``[num_blocks, block_size, head_dim + 4]``: the pooled FP8 cache
        :func:`kpool_compress_fp8` writes (each page: block_size rows of
        head_dim e4m3fn bytes, then block_size float32 scales).
    cache_block_table
        int32 ``[batch, max_blocks]``: request b's pool p is at page
        ``cache_block_table[b, p // block_size]``, entry ``p % block_size`` (the
        writers' ``block_table=``).
    input_row_offsets, cache_lengths
        The ragged batch, as every op takes it (decode with next_n tokens a
        request: ``[0, n, 2n, ...]``).
    kpool
        Tokens per pool, 1 to 1024 (a run-time value: one compile serves all).
    max_pools
        Columns of the result. None: ``out``'s width when ``out`` is given,
        else the most pools any token sees, read from the device (one host
        read). A smaller value than some token sees is a ValueError with
        ``validate=True``; without validation those pools are left out.
    out
        float32 ``[num_tokens, max_pools]``, last dim contiguous, writable, rows
        that do not overlap: written in place. With ``out``, ``max_pools`` and ``validate=False`` the call reads
        nothing back to the host and can be captured in a CUDA graph.
    validate
        Check offsets, lengths and that the table holds a page in the cache for
        every pool a token sees (one host read). Without it a missing or
        out-of-range page gives -inf logits for its pools, and nothing outside
        the arrays is read.
    stream
        As :func:`kpool_compress`.

    Returns
    -------
    cupy.ndarray
        float32 ``[num_tokens, max_pools]``.

    Runs on tensor cores: e4m3 ``mma.sync`` on sm_89 and newer, f16 ``mma.sync``
    after an exact conversion on sm_80 to sm_88; older GPUs are refused. The
    float32 sums follow a fixed order (``kernels/kpool_index.cuh``); the README
    states how far the result may be from exact.
    """
    return call_backend(
        (q, weights, cache, cache_block_table, input_row_offsets, cache_lengths, out),
        {"kpool": kpool, "max_pools": max_pools, "validate": validate},
        backend_options,
    )


@defines(ops.INDEX_TOPK)
def kpool_index_topk(
    logits: Array,
    input_row_offsets: Array,
    cache_lengths: Array,
    *,
    kpool: int,
    pool_topk: int,
    always_select_tail: bool = False,
    block_table: Array | None = None,
    block_size: int | None = None,
    compact: bool = False,
    out: Array | None = None,
    counts: Array | None = None,
    workspace: Array | None = None,
    validate: bool = True,
    **backend_options: Unpack[BackendOptions],
) -> Result | tuple[Result, Result]:
    """Each token's ``pool_topk`` best pools by their index logits, expanded to token positions (int32).

        candidates(t) = the pools t sees: (cache_lengths[b] + t - input_row_offsets[b] + 1) // kpool
        selected(t)   = all candidates if there are at most pool_topk (no logit read), else the pool_topk best
        positions[t]  = kpool_expand_topk of selected(t), listed in ascending pool id, -1 after

    The order: a larger logit first; equal logits, the lower pool id (-0.0
    equals +0.0); every NaN, whatever its sign, below every number, -inf
    included. A pool the token cannot see is never selected, whatever its
    logit (the columns past its visible pools are not read). The expansion,
    tail columns (``always_select_tail``), block-table mapping (``block_table``,
    ``block_size``: the token KV cache's pages) and ``compact`` are exactly
    :func:`kpool_expand_topk`'s, as if it were given the selected ids.

    One launch: each logit a token reads (when it has more candidates than
    ``pool_topk``) is read once, and the best are kept in shared memory as
    they stream past. Few rows (decode) split their logits over several
    blocks of the same launch, whose best lists the last block of the row
    selects over again; many (prefill) take a block each. Working memory
    does not grow with the row.

    Parameters
    ----------
    logits
        float32 ``[num_tokens, pools]``, last dim contiguous: for example
        :func:`kpool_index_logits_fp8`'s result. With ``validate=True`` it must
        be at least as wide as the most pools a token sees (ValueError); without
        validation a token's candidates stop at its width.
    input_row_offsets, cache_lengths
        The ragged batch, as every op takes it.
    kpool
        Tokens per pool, 1 to 1024 (a run-time value: one compile serves all).
    pool_topk
        Pools a token selects, 1 to 4096.
    always_select_tail, block_table, block_size, compact, out, counts
        As :func:`kpool_expand_topk` (``out``: ``[num_tokens, width]``). With ``validate=True`` the block table
        must reach every position a token could select (every visible pool's
        and its tail's), stricter than :func:`kpool_expand_topk`'s check of
        the positions it was given: the selection is not known on the host.
    workspace
        uint8, 1-D, at least :func:`index_topk_workspace_bytes` ``(num_tokens,
        pools, pool_topk)`` bytes (a ValueError names what the call needs
        otherwise; the sizing covers every batch of at most num_tokens rows
        and at most ``pools`` logits, so size it for the largest), 16-byte
        aligned, its first 512 bytes (the counters) zero before its first
        use: every call leaves them zero again, so one buffer serves every
        call and a CUDA graph; the rest is scratch. None: the call allocates
        a zeroed one when its rows are split. ``validate=True`` checks the
        counters are zero; without it, non-zero counters give rows that may
        be wrong or left unwritten, in this call and later ones, until they
        are zeroed again.
    validate
        Check offsets and lengths, the logits' width, the block table's
        reach and the workspace's counters (one host read). Without it garbage offsets give a token no
        candidate, and nothing outside the arrays is read or written.
    stream
        As :func:`kpool_compress`.

    Returns
    -------
    cupy.ndarray
        int32 ``[num_tokens, pool_topk * kpool (+ kpool - 1 with the tail)]``,
        or ``(positions, counts)`` with ``compact=True``.
    """
    return call_backend(
        (logits, input_row_offsets, cache_lengths, block_table, out, counts, workspace),
        {
            "kpool": kpool,
            "pool_topk": pool_topk,
            "always_select_tail": always_select_tail,
            "block_size": block_size,
            "compact": compact,
            "validate": validate,
        },
        backend_options,
    )


@defines(ops.INDEX_SELECT_FP8)
def kpool_index_select_fp8(
    q: Array,
    weights: Array,
    cache: Array,
    cache_block_table: Array,
    input_row_offsets: Array,
    cache_lengths: Array,
    *,
    kpool: int,
    pool_topk: int,
    always_select_tail: bool = False,
    block_table: Array | None = None,
    block_size: int | None = None,
    compact: bool = False,
    out: Array | None = None,
    counts: Array | None = None,
    workspace: Array | None = None,
    validate: bool = True,
    **backend_options: Unpack[BackendOptions],
) -> Result | tuple[Result, Result]:
    """Score and select in one launch: ``kpool_index_topk(kpool_index_logits_fp8(q, ...), ...)``, bit for bit,
    without writing the ``[num_tokens, pools]`` logits.

    Each token's visible pools are scored by the scorer's own routines (the
    same tensor-core instruction, the same order of sums, so every logit has
    the scorer's bits) a chunk of 1024 at a time into shared memory, and the
    best ``pool_topk`` are kept there as they stream past (the selection rule
    and expansion of :func:`kpool_index_topk`). Few tokens (decode) split
    their pools over several blocks of the same launch, whose best lists the
    last block of the token selects over again; many (prefill) take a block
    each. Working memory does not grow with the context length.

    Parameters
    ----------
    q, weights, cache, cache_block_table, input_row_offsets, cache_lengths, kpool
        As :func:`kpool_index_logits_fp8`.
    pool_topk, always_select_tail, block_table, block_size, compact, out, counts
        As :func:`kpool_index_topk` (``block_table``: the token KV cache's
        pages; ``cache_block_table``: the pooled cache's).
    workspace
        uint8, 1-D, at least :func:`index_select_workspace_bytes` ``(num_tokens,
        pool_topk)`` bytes (a ValueError names what the call needs otherwise;
        the sizing covers every batch of at most num_tokens, so size it for the
        largest), 16-byte aligned,
        its first 512 bytes (the counters) zero before its first use: every call
        leaves them zero again, so one buffer serves every call, every batch
        size and a CUDA graph; the rest is scratch. None: the call allocates a
        zeroed one. ``validate=True`` checks the counters are zero; without it,
        non-zero counters give rows that may be wrong or left unwritten, in this
        call and later ones, until they are zeroed again.
    validate
        As :func:`kpool_index_topk`, and the pooled cache's table as
        :func:`kpool_index_logits_fp8` checks it (one host read). Without
        validation a token's candidates stop at the table's reach
        (``cache_block_table`` columns times the cache's ``block_size``), as the
        logits' width stops them in :func:`kpool_index_topk`: garbage lengths
        cannot make a block walk more pools than the table names.
    stream
        As :func:`kpool_compress`.

    Returns
    -------
    cupy.ndarray
        int32 positions as :func:`kpool_index_topk`, or ``(positions, counts)``
        with ``compact=True``.
    """
    return call_backend(
        (q, weights, cache, cache_block_table, input_row_offsets, cache_lengths, block_table, out, counts, workspace),
        {
            "kpool": kpool,
            "pool_topk": pool_topk,
            "always_select_tail": always_select_tail,
            "block_size": block_size,
            "compact": compact,
            "validate": validate,
        },
        backend_options,
    )


@defines(ops.COMPRESS_BACKWARD)
def kpool_compress_backward(
    grad_pooled: Array,
    k: Array,
    gate: Array,
    ape: Array,
    input_row_offsets: Array,
    cache_lengths: Array,
    *,
    pool_row_offsets: Array | None = None,
    grad_k: Array | None = None,
    grad_gate: Array | None = None,
    grad_ape: Array | None = None,
    workspace: Array | None = None,
    validate: bool = True,
    **backend_options: Unpack[BackendOptions],
) -> tuple[Result, Result, Result]:
    """The gradients of :func:`kpool_cupy.kpool_compress` with respect to k, gate and ape, on the GPU.

    For one pool, with ``g = grad_pooled[p]``, ``l = gate + ape`` and ``w`` the
    softmax of l over the pool's members, per channel::

        d k[m, c]    = w[m, c] * g[c]
        d gate[m, c] = w[m, c] * g[c] * (k[m, c] - pooled[c])
        d ape[m, c]  = sum over every pool of d gate[m, c]

    w and pooled are recomputed from k, gate and ape (nothing from the forward
    is kept); float32 arithmetic, each gradient rounded once to its array's
    dtype. Tokens in no complete pool get zero gradient. ``grad_ape`` is summed
    in a fixed order (per-block partial sums, then their sum in a fixed order, no
    float atomics): two runs give the same bits. Subnormal values flush to
    zero, as in the forward; NaN and inf propagate as float32 arithmetic gives
    them. The forward's ``rotate=True`` has no backward here.

    Parameters
    ----------
    grad_pooled
        ``[>= total_pools, head_dim]``, bfloat16, float16 or float32 (the
        forward's output dtype), any strides (0 too: autograd hands in expanded
        gradients); rows past ``total_pools`` are not read.
    k, gate, ape, input_row_offsets, cache_lengths, pool_row_offsets
        The forward call's arguments, as :func:`kpool_cupy.kpool_compress` takes
        them.
    grad_k, grad_gate
        Optional outputs shaped like k and gate, in their dtypes; written whole
        (zero where a token is in no complete pool).
    grad_ape
        Optional float32 ``[kpool, head_dim]`` output.
    workspace
        uint8, 1-D, at least :func:`compress_backward_workspace_bytes`
        ``(total_tokens, head_dim, kpool)`` bytes, 16-byte aligned: the blocks'
        partial sums of ``grad_ape`` (a ValueError names it otherwise); any
        contents. None: the call allocates them. With it, the outputs,
        ``pool_row_offsets`` and ``validate=False`` the call allocates nothing
        and reads nothing back.
    validate
        Check offset contents and that ``grad_pooled`` has a row for every pool
        (one device-to-host copy). Unvalidated garbage never makes the kernels
        touch memory outside their arrays.
    stream
        A ``cupy.cuda.Stream``, a raw handle, or anything with
        ``__cuda_stream__`` or ``.cuda_stream``; default CuPy's current stream.

    Returns
    -------
    tuple of cupy.ndarray
        ``(grad_k, grad_gate, grad_ape)``.
    """
    return call_backend(
        (
            grad_pooled,
            k,
            gate,
            ape,
            input_row_offsets,
            cache_lengths,
            pool_row_offsets,
            grad_k,
            grad_gate,
            grad_ape,
            workspace,
        ),
        {"validate": validate},
        backend_options,
    )


def definition(spec: OpSpec) -> Callable[..., Any]:
    """The def of ``spec``'s public function (a spec with another op's name, such as a test's variant of one,
    gets that op's def)."""
    try:
        return DEFINITIONS[spec.name]
    except KeyError:
        raise ValueError(f"Invalid spec: expected an op defined in kpool_cupy.functions, got {spec.name}") from None
