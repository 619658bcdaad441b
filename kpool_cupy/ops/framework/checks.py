"""The checks every op's validation is built from, so a bad call gets the same error on every backend.

Metadata (rank, dtype, shape, strides) is checked on any array object with
``shape``, ``dtype`` and ``strides`` (NumPy and CuPy alike). Contents are
checked on host copies, which the GPU path fetches in one transfer.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

from ...dtypes import (
    ELEMENT_CTYPES,
    FLOAT32,
    INDEX_DTYPES,
    INT32,
    MAX_KPOOL,
    UINT8,
    dtype_name,
    element_dtype,
    given_dtype,
)
from ...kernel.codes import data_pointer
from ...kernel.geometry import HEAD_DIM_RULE, takes_head_dim
from .spec import Operand, spread

# Cache lengths at or above this would overflow 64-bit position arithmetic
# once the call's tokens are added; no real cache comes near it.
MAX_CACHE_LENGTH = 2**62


def fail(name: str, expected: str, got: object) -> ValueError:
    return ValueError(f"Invalid {name}: expected {expected}, got {got}")


def dtype_fail(name: str, expected: str, got: object) -> TypeError:
    return TypeError(f"Invalid {name}: expected {expected}, got {got}")


def check_nowhere(bad: np.ndarray, name: str, expected: str, got: Callable[..., str]) -> None:
    """A ValueError naming ``name`` at the first index (row-major) where ``bad`` holds, if any: ``expected``
    and ``got(*index)``, what stands there (host arrays)."""
    if bad.any():
        index = (int(i) for i in np.argwhere(bad)[0])
        raise fail(name, expected, got(*index))


def check_integer(name: str, value: Any, low: int, high: int | None = None, *, or_none: bool = False) -> None:
    """An integer (a TypeError naming ``name`` otherwise; "or None" where None is taken, and checked by the
    caller) in ``[low, high]``, or ``>= low`` with no ``high`` (a ValueError otherwise). A torch.SymInt (a
    "size" option in a torch fake kernel) is checked where its range is known, with no guard on its value."""
    expected = f"an integer in [{low}, {high}]" if high is not None else "a non-negative integer" if low == 0 else (
        f"an integer >= {low}")  # fmt: skip
    if type(value).__name__ == "SymInt":  # only torch makes one
        if definitely(value < low) or (high is not None and definitely(value > high)):
            hint = getattr(value.node, "hint", None)  # the value the trace was made with, where it has one
            raise fail(name, expected, value if hint is None else hint)
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise dtype_fail(name, "an integer or None" if or_none else "an integer", type(value).__name__)
    if int(value) < low or (high is not None and int(value) > high):
        raise fail(name, expected, int(value))


def check_bool(name: str, value: Any) -> None:
    """True or False (a NumPy bool too), nothing else: a string such as "False" would read as true, an array
    fail inside NumPy without naming the argument."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"Invalid {name}: expected True or False, got {type(value).__name__} {value!r}")


def given_without(name: str, partner: str) -> ValueError:
    """An input given without the operand it goes with (``Operand.with_operand``: slots without a cache)."""
    return fail(name, f"None without {partner} (it places pools in a {partner})", "an array")


def missing_with(name: str, partner: str) -> ValueError:
    """An input missing beside the operand that needs it (``Operand.required_with``)."""
    return fail(name, f"an array with {partner} (it places each pool)", "None")


def as_size(value: Any) -> Any:
    """A size or stride as the checks keep it: a Python int; under torch.compile's tracing, torch's symbolic
    size as it is (``int()`` on it would fix the compiled graph to this one size; a comparison only
    records the relation it relied on)."""
    if isinstance(value, int) or hasattr(value, "node"):  # torch.SymInt carries its expression in .node
        return value
    return int(value)


def definitely(condition: Any) -> bool:
    """``condition`` where it is known. A plain bool is itself. Under torch.compile's tracing, a condition on a
    size the data decides (an unbacked size: the scorer's width without max_pools) that the trace cannot settle
    reads as false, with no guard (torch's ``guard_or_false``): a check that raises on it is left to the real call,
    which sees the size. (``bool()`` on it fails the trace: "Could not guard on data-dependent expression".)"""
    if hasattr(condition, "node"):  # a torch.SymBool; only torch makes one, so torch is loaded
        from torch.fx.experimental.symbolic_shapes import guard_or_false

        return bool(guard_or_false(condition))
    return bool(condition)


def require_array(name: str, array: Any) -> None:
    if not all(hasattr(array, attr) for attr in ("shape", "dtype", "strides")):
        raise dtype_fail(name, "an array", type(array).__name__)


def check_rows(name: str, array: Any, dtypes: tuple[np.dtype, ...]) -> None:
    """A 2-D array of one of ``dtypes`` whose last dim is contiguous, rows at any stride."""
    require_array(name, array)
    if array.dtype not in dtypes:
        allowed = " or ".join(dtype_name(d) for d in dtypes)
        raise dtype_fail(name, f"dtype {allowed}", dtype_name(np.dtype(array.dtype)))
    if array.ndim != 2:
        raise fail(name, "a 2-D array [rows, head_dim]", f"shape {tuple(array.shape)}")
    itemsize = array.dtype.itemsize
    if array.size == 0:  # nothing is read or written, and NumPy may report any strides
        return
    if array.shape[1] > 1 and array.strides[1] != itemsize:
        raise fail(name, f"a contiguous last dim (stride {itemsize} bytes)", f"stride {array.strides[1]} bytes")
    if array.strides[0] % itemsize != 0:
        raise fail(name, f"a row stride that is a multiple of {itemsize} bytes", f"{array.strides[0]} bytes")


def check_writable(name: str, array: Any) -> None:
    flags = getattr(array, "flags", None)
    if flags is not None and not getattr(flags, "writeable", True):
        raise fail(name, "a writable array", "a read-only one")


def check_contiguous(name: str, array: Any) -> None:
    """C-contiguous (dimensions of length 1 may have any stride)."""
    if array.size == 0:
        return
    expected = array.dtype.itemsize
    for size, stride in zip(reversed(array.shape), reversed(array.strides), strict=True):
        if size > 1 and stride != expected:
            raise fail(name, "a C-contiguous array", f"byte strides {tuple(array.strides)}")
        expected *= size


def check_writable_rows(name: str, array: Any) -> None:
    """Rows that do not overlap (a write to one cannot land in another), in writable memory."""
    check_writable(name, array)
    row_bytes = array.shape[1] * array.dtype.itemsize
    if array.shape[0] > 1 and abs(array.strides[0]) < row_bytes:
        raise fail(name, f"rows that do not overlap (|row stride| >= {row_bytes} bytes)", f"{array.strides[0]} bytes")


def check_block_table(block_table: Any, batch: int, name: str = "block_table") -> None:
    """A block table as every op reads it: int32 ``[batch, max_blocks]``, the last dim contiguous, rows at any
    stride in whole entries (a column slice of a wider table works as it is). ``name``: the argument's."""
    require_array(name, block_table)
    if np.dtype(block_table.dtype) != INT32:
        raise dtype_fail(name, "dtype int32", dtype_name(np.dtype(block_table.dtype)))
    if block_table.ndim != 2 or block_table.shape[0] != batch:
        raise fail(name, f"shape [{batch}, max_blocks] (one row per request)", tuple(block_table.shape))
    if block_table.size and block_table.shape[1] > 1 and block_table.strides[1] != 4:
        raise fail(name, "a contiguous last dim", f"byte strides {block_table.strides}")
    if block_table.size and block_table.strides[0] % 4:
        raise fail(name, "a row stride in whole entries", f"byte strides {block_table.strides}")


def check_index(name: str, array: Any, length: int | None) -> None:
    require_array(name, array)
    if array.dtype not in INDEX_DTYPES:
        raise dtype_fail(name, "dtype int32, uint32 or int64", array.dtype)
    if array.ndim != 1:
        raise fail(name, "a 1-D array", f"shape {tuple(array.shape)}")
    if length is not None and array.shape[0] != length:
        raise fail(name, f"length {length}", f"length {array.shape[0]}")
    if array.shape[0] > 1 and array.strides[0] != array.dtype.itemsize:
        # The kernels read offsets at unit stride.
        raise fail(name, "a contiguous 1-D array", f"stride {array.strides[0]} bytes")


def check_keys(k: Any, gate: Any, *, same_dtype: bool = False) -> int:
    """k and gate as token rows ``[total_tokens, head_dim]``; returns head_dim."""
    elements = tuple(ELEMENT_CTYPES)
    check_rows("k", k, elements)
    head_dim = as_size(k.shape[1])
    if not takes_head_dim(head_dim):
        raise fail("k", f"head_dim (k.shape[1]) {HEAD_DIM_RULE}", head_dim)
    check_rows("gate", gate, (np.dtype(k.dtype),) if same_dtype else elements)
    if tuple(gate.shape) != tuple(k.shape):
        raise fail("gate", f"shape {tuple(k.shape)} like k", f"shape {tuple(gate.shape)}")
    return head_dim


def check_ape(ape: Any, head_dim: int) -> int:
    """ape as float32 ``[kpool, head_dim]``; returns kpool."""
    check_rows("ape", ape, (FLOAT32,))
    kpool = as_size(ape.shape[0])
    if not 1 <= kpool <= MAX_KPOOL:
        raise fail("ape", f"kpool (ape.shape[0]) in [1, {MAX_KPOOL}]", kpool)
    if ape.shape[1] != head_dim:
        raise fail("ape", f"shape [kpool, {head_dim}]", f"shape {tuple(ape.shape)}")
    return kpool


# Requests a call takes: the kernels' request searches walk them in 32 bits (kpool_expand.cuh).
MAX_BATCH = (1 << 31) - 1


def check_batch_index(input_row_offsets: Any, cache_lengths: Any) -> int:
    """Offsets ``[batch + 1]`` and cache lengths ``[batch]``, batch at most ``MAX_BATCH``; returns batch."""
    check_index("input_row_offsets", input_row_offsets, None)
    if input_row_offsets.shape[0] < 1:
        raise fail("input_row_offsets", "length batch + 1 >= 1", "length 0")
    batch = as_size(input_row_offsets.shape[0]) - 1
    if batch > MAX_BATCH:
        raise fail("input_row_offsets", f"length batch + 1 <= {MAX_BATCH + 1} (at most {MAX_BATCH} requests)",
                   f"length {batch + 1}")  # fmt: skip
    check_index("cache_lengths", cache_lengths, batch)
    return batch


# The dtypes a pooled output may have, whatever k's: one rounding from the
# float32 result either way.
OUTPUT_DTYPES = tuple(ELEMENT_CTYPES)


def check_out_dtype(out_dtype: Any, out: Any, k_dtype: np.dtype) -> np.dtype:
    """The dtype an op writes: ``out_dtype`` when given (``out`` must then have it), else out's, else k's."""
    if out_dtype is None:
        return np.dtype(out.dtype) if out is not None else np.dtype(k_dtype)
    if not isinstance(out_dtype, (str, np.dtype, type)):  # a value such as np.float16(1.0) is not a dtype
        raise dtype_fail("out_dtype", "one of bfloat16, float16, float32", given_dtype(out_dtype))
    try:
        wanted = element_dtype(out_dtype)
    except TypeError:
        raise dtype_fail("out_dtype", "one of bfloat16, float16, float32", given_dtype(out_dtype)) from None
    if out is not None and np.dtype(out.dtype) != wanted:
        raise dtype_fail("out", f"dtype {dtype_name(wanted)} (out_dtype)", dtype_name(np.dtype(out.dtype)))
    return wanted


def check_out(out: Any, head_dim: int, rows: str) -> None:
    """An output of token-row shape ``[rows, head_dim]`` in any of OUTPUT_DTYPES."""
    if out is None:
        return
    check_rows("out", out, OUTPUT_DTYPES)
    if out.shape[1] != head_dim:
        raise fail("out", f"shape [{rows}, {head_dim}]", f"shape {tuple(out.shape)}")
    check_writable_rows("out", out)


def check_rows_and_cache(total_tokens: int, input_row_offsets: np.ndarray, cache_lengths: np.ndarray) -> None:
    """Offsets start at 0, never decrease, end at total_tokens; cache lengths in [0, 2^62) (host arrays)."""
    offsets = input_row_offsets.astype(np.int64, copy=False)
    if offsets[0] != 0:
        raise fail("input_row_offsets", "a first entry of 0", int(offsets[0]))
    down = offsets[1:] < offsets[:-1]
    if down.any():
        b = int(np.argmax(down))
        raise fail(
            "input_row_offsets", "non-decreasing values", f"{int(offsets[b])} then {int(offsets[b + 1])} at index {b}"
        )
    if offsets[-1] != total_tokens:
        raise fail("input_row_offsets", f"a last entry equal to total_tokens {total_tokens}", int(offsets[-1]))
    lengths = cache_lengths.astype(np.int64, copy=False)
    bad = lengths.view(np.uint64) >= MAX_CACHE_LENGTH  # a negative length reads as 2**63 or more
    if bad.any():
        b = int(np.argmax(bad))
        raise fail("cache_lengths", "values in [0, 2**62)", f"{int(lengths[b])} at index {b}")


def _extent(array: Any) -> tuple[int, int]:
    """The bytes [first, end) an array's elements span, whatever its strides' signs."""
    first = end = data_pointer(array)
    for size, stride in zip(array.shape, array.strides, strict=True):
        first += min(0, stride * (size - 1))
        end += max(0, stride * (size - 1))
    return first, end + array.dtype.itemsize


# The most work NumPy's exact overlap solver may do for one pair: a constant,
# so the check costs the same for any array size. Every layout the ops take
# (rows at any strides, a ring's interleaved halves) needs a few dozen steps.
MAX_OVERLAP_WORK = 4096


def _address_view(array: Any) -> np.ndarray:
    """A NumPy array over ``array``'s addresses, shape and byte strides, never read (elements as opaque
    bytes): what NumPy's exact overlap solver takes, for device arrays too."""

    interface = {
        "data": (data_pointer(array), True),
        "shape": tuple(int(n) for n in array.shape),
        "strides": tuple(int(s) for s in array.strides),
        "typestr": f"|V{array.dtype.itemsize}",
        "version": 3,
    }
    return np.asarray(SimpleNamespace(__array_interface__=interface))


def shares_memory(a: Any, b: Any) -> bool:
    """Whether two arrays share a byte, exactly: their extents meet and some element of one overlaps one of
    the other (``np.shares_memory`` on their addresses alone, bounded work). Column slices of one fused
    buffer, or a split ring's two interleaved halves, share none. A pair the solver cannot settle within
    ``MAX_OVERLAP_WORK`` counts as sharing: an overlap is never missed."""
    if a.size == 0 or b.size == 0:
        return False
    a_first, a_end = _extent(a)
    b_first, b_end = _extent(b)
    if a_end <= b_first or b_end <= a_first:
        return False
    try:
        return bool(np.shares_memory(_address_view(a), _address_view(b), max_work=MAX_OVERLAP_WORK))
    except np.exceptions.TooHardError:
        return True


def check_no_overlap(operands: tuple[Operand, ...], arrays: dict[str, Any]) -> None:
    """Refuse an output that shares memory with an input or another output (metadata only: no device sync).

    A kernel that writes memory it also reads gives results that depend on
    thread order, and the backends would disagree. ``operands`` say which
    arrays are written; ``arrays`` are the call's by name.
    """
    flat = spread(operands, tuple(arrays[o.name] for o in operands))  # a split ring is two arrays
    present = [(n, w, a) for n, w, a in zip(flat.names, flat.written, flat.arrays, strict=True) if a is not None]
    for i, (name, writes, w) in enumerate(present):
        if not writes:
            continue
        for j, (other, other_writes, o) in enumerate(present):
            if i == j or (other_writes and j < i):
                continue  # two outputs are compared once
            if shares_memory(w, o):
                raise fail(name, f"memory that {other} does not use", f"an array sharing bytes with {other}")


def check_aligned(operands: tuple[Operand, ...], arrays: dict[str, Any]) -> None:
    """Refuse an array whose first element is not aligned to its element size (metadata only).

    Every kernel loads an element at its natural alignment at least; a view
    that starts between elements (a byte offset into a buffer) would make a
    misaligned access, which a GPU faults on (and which is undefined in the
    emulator's C++). Strides are whole elements already, so the first
    element decides. A byte array (FP8 bytes) is always aligned; a paged
    cache's float32 scales have their own check.
    """
    flat = spread(operands, tuple(arrays[o.name] for o in operands))  # a split ring is two arrays
    for name, array in zip(flat.names, flat.arrays, strict=True):
        if array is None or not array.size:
            continue
        size = np.dtype(array.dtype).itemsize
        address = data_pointer(array)
        if address % size:
            raise fail(
                name, f"a first element at a multiple of {size} bytes (its element size)", f"address {address:#x}"
            )


def check_workspace(workspace: Any) -> None:
    """A caller's workspace (an op's scratch), when given: a writable, contiguous, 16-byte aligned uint8 vector
    (its size is checked when the call runs: it depends on sizes torch.compile keeps symbolic)."""
    if workspace is None:
        return
    require_array("workspace", workspace)
    if np.dtype(workspace.dtype) != UINT8:
        raise dtype_fail("workspace", "dtype uint8", str(np.dtype(workspace.dtype)))
    if workspace.ndim != 1:
        raise fail("workspace", "a contiguous 1-D array", f"shape {tuple(workspace.shape)}")
    if workspace.size > 1 and workspace.strides[0] != 1:
        raise fail("workspace", "a contiguous 1-D array", f"byte strides {tuple(workspace.strides)}")
    address = data_pointer(workspace)
    if address % 16:  # kernels keep 4-byte words (counters, float32 sums) there: a GPU faults on a misaligned one
        raise fail("workspace", "a 16-byte aligned buffer", f"an address {address % 16} bytes past a multiple of 16")
    check_writable("workspace", workspace)  # the kernel writes its counters and lists


def check_workspace_size(workspace: Any, needed: int, sizing: str) -> None:
    """At least ``needed`` bytes; ``sizing``: the call that says so, for the message."""
    if workspace is not None and workspace.shape[0] < needed:
        raise fail("workspace", f"at least {needed} bytes ({sizing})", f"{workspace.shape[0]} bytes")
