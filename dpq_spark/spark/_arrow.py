"""Arrow arrays to and from numpy buffers, for the code that runs in Spark's Python workers.

``pyarrow.array``, ``pyarrow.scalar`` and ``Array.to_numpy`` (also ``numpy.asarray`` of an
Arrow array) import pandas on their first call (0.26 s on the benchmark machine), even for a
numpy array, a list of strings or an int64 column. A Python worker that runs a release has no
other use for pandas, so the worker-side modules convert here: numeric arrays both ways as
zero-copy views of their buffers, strings from their UTF-8 bytes and offsets.
``tests/spark/test_worker_imports.py`` runs the release bodies and checks that pandas stays out.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["binary_value", "numeric", "scalar", "strings", "to_numpy"]


def _dtype(kind: pa.DataType) -> np.dtype:
    """The numpy dtype of an integral or floating Arrow type (``to_pandas_dtype`` imports
    pandas in some pyarrow versions)."""
    if pa.types.is_floating(kind):
        letter = "f"
    elif pa.types.is_integer(kind):
        letter = "i" if pa.types.is_signed_integer(kind) else "u"
    else:
        raise TypeError(f"not an integral or floating Arrow type: {kind}")
    return np.dtype(f"<{letter}{kind.bit_width // 8}")


def numeric(values, type: pa.DataType) -> pa.Array:
    """``values`` (array_like) as an Arrow array of the fixed-width numeric ``type``, no nulls;
    a contiguous numpy array of the matching dtype is not copied."""
    data = np.ascontiguousarray(values, dtype=_dtype(type)).reshape(-1)
    return pa.Array.from_buffers(type, data.size, [None, pa.py_buffer(data)])


def scalar(value, type: pa.DataType) -> pa.Scalar:
    """One value of the fixed-width numeric ``type`` as an Arrow scalar."""
    return numeric([value], type)[0]


def strings(values: list) -> pa.Array:
    """A list of Python strings as an Arrow ``string`` array (no nulls). A list of one repeated
    string, the usual case (one mechanism for a block of groups), is built without a step per
    entry."""
    n = len(values)
    if n and values.count(values[0]) == n:
        one = values[0].encode()
        offsets = np.arange(n + 1, dtype=np.int64) * len(one)
        data = one * n
    else:
        encoded = [v.encode() for v in values]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=n), out=offsets[1:])
        data = b"".join(encoded)
    if offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError("strings: more than 2 GiB of text in one array")
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                  pa.py_buffer(data)])


def binary_value(data: pa.Buffer) -> pa.Array:
    """One ``binary`` value holding ``data`` (less than 2 GiB), without a copy."""
    if data.size > np.iinfo(np.int32).max:
        raise ValueError("binary_value: 2 GiB or more in one value")
    offsets = pa.py_buffer(np.array([0, data.size], dtype=np.int32))
    return pa.Array.from_buffers(pa.binary(), 1, [None, offsets, data])


def to_numpy(array: pa.Array) -> np.ndarray:
    """An integral or floating Arrow array without nulls as a read-only numpy view of its data
    buffer (no copy), a boolean one without nulls as a numpy ``bool`` array; any other array
    through ``to_numpy`` (which may import pandas)."""
    kind = array.type
    if not array.null_count and pa.types.is_boolean(kind):
        bits = np.frombuffer(array.buffers()[1], dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[array.offset:array.offset + len(array)] \
            .astype(bool)
    if array.null_count or not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        return array.to_numpy(zero_copy_only=False)
    dtype = _dtype(kind)
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array),
                         offset=array.offset * dtype.itemsize)
