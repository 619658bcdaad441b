"""The element and index dtypes the kernels accept, and their C++ spellings."""

from __future__ import annotations

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT16 = np.dtype(np.float16)
FLOAT32 = np.dtype(np.float32)
# e4m3fn values as engines type them (torch.float8_e4m3fn's NumPy twin); the kernels read their bytes (uint8).
FLOAT8_E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
UINT8 = np.dtype(np.uint8)

# Storage type of each element dtype in kernels/kpool_common.cuh.
ELEMENT_CTYPES: dict[np.dtype, str] = {
    BFLOAT16: "kp::bf16",
    FLOAT16: "kp::fp16",
    FLOAT32: "float",
}

# The offsets, lengths and ids dtypes the kernels read, and the C++ type each
# is a kernel template argument as.
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.uint32), np.dtype(np.int64))
INDEX_CTYPES: dict[np.dtype, str] = dict(zip(INDEX_DTYPES, ("int", "unsigned int", "long long"), strict=True))
INT32 = np.dtype(np.int32)
INT32_MAX = 2**31 - 1
UINT32 = np.dtype(np.uint32)


def signed_index(values: np.ndarray, dtype: object) -> np.ndarray:
    """int64 values of an index array in which a negative value means something (positions' -1 padding, a
    slot, a pool id): in a uint32 array the all-ones value is -1, as every kernel reads it
    (``kp::load_signed_index``). Offsets and lengths keep their full uint32 range and do not come here."""
    wide = np.asarray(values).astype(np.int64)
    if np.dtype(dtype) == UINT32:
        wide[wide == 0xFFFFFFFF] = -1
    return wide


# The largest kpool any op accepts: far above the 4 to 128 indexers use, and
# small enough that every instantiation compiles in seconds and every
# position and width computed from it stays far from 64-bit limits.
MAX_KPOOL = 1024

_NAMES = {"bfloat16": BFLOAT16, "bf16": BFLOAT16, "float16": FLOAT16, "fp16": FLOAT16, "float32": FLOAT32}


def element_dtype(dtype: object) -> np.dtype:
    """Return the NumPy dtype for an element dtype given by name or dtype-like.

    CuPy reports bfloat16 arrays with the ml_dtypes dtype, so one mapping
    serves NumPy and CuPy arrays alike.
    """
    if isinstance(dtype, str) and dtype in _NAMES:
        return _NAMES[dtype]
    try:
        resolved = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError as error:
        raise TypeError(f"Invalid dtype: expected one of bfloat16, float16, float32, got {dtype!r}") from error
    if resolved not in ELEMENT_CTYPES:
        raise TypeError(f"Invalid dtype: expected one of bfloat16, float16, float32, got {resolved}")
    return resolved


def dtype_name(dtype: np.dtype) -> str:
    """Short name used in messages and variant keys."""
    return "bfloat16" if dtype == BFLOAT16 else str(dtype)


def given_dtype(value: object) -> str:
    """A dtype argument as a refusal shows it: a NumPy dtype or scalar type by its name (``np.int8`` and
    ``np.dtype("int8")`` both read ``int8``), a torch dtype as torch spells it (``torch.int8``), anything else
    (a string, an array) as ``repr`` shows it."""
    if isinstance(value, np.dtype):
        return dtype_name(value)
    if isinstance(value, type) and issubclass(value, np.generic):
        return dtype_name(np.dtype(value))
    return str(value) if type(value).__module__ == "torch" else repr(value)
