"""Arrow columns as NumPy without pyarrow's ``to_numpy``, which imports pandas on first use (a quarter second of
every command that reads a table or a trace)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_NUMERIC = {
    pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
    pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.uint64(): np.uint64,
    pa.float32(): np.float32, pa.float64(): np.float64,
}


def numpy_values(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A column's values as NumPy (a copy). Null-free primitive columns are read from the Arrow buffer; anything else
    goes through ``to_numpy``."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    dtype = _NUMERIC.get(arr.type)
    if dtype is not None and arr.null_count == 0:
        return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * np.dtype(dtype).itemsize).copy()
    if pa.types.is_boolean(arr.type) and arr.null_count == 0:
        return np.array(arr.to_pylist(), dtype=bool)
    return arr.to_numpy(zero_copy_only=False)
