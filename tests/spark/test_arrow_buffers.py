"""dpq_spark.spark._arrow: numpy <-> Arrow through buffers gives what pyarrow's own conversions
give, for the arrays the worker-side code meets (sliced ones included)."""

import numpy as np
import pyarrow as pa
import pytest

from dpq_spark.spark import _arrow


@pytest.mark.parametrize("kind", [pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.float32(),
                                  pa.float64()])
def test_numeric_and_to_numpy_round_trip_also_on_slices(kind):
    values = np.arange(-5, 20) if pa.types.is_signed_integer(kind) or pa.types.is_floating(kind) \
        else np.arange(25)
    array = _arrow.numeric(values, kind)
    assert array.type == kind and array.equals(pa.array(values, type=kind))
    for start, length in [(0, 25), (3, 10), (24, 1), (7, 0)]:
        piece = array.slice(start, length)
        got = _arrow.to_numpy(piece)
        assert got.dtype == piece.to_numpy().dtype
        assert np.array_equal(got, piece.to_numpy()), (start, length)


def test_to_numpy_reads_booleans_at_any_offset_and_falls_back_with_nulls():
    bits = pa.array([True, False, None, True, True, False, True, False, True, True] * 3)
    for start in range(9):
        valid = bits.is_valid().slice(start, 17)
        assert np.array_equal(_arrow.to_numpy(valid), np.array(valid.to_pylist())), start
        filled = bits.fill_null(False).slice(start, 11)
        assert np.array_equal(_arrow.to_numpy(filled), np.array(filled.to_pylist())), start
    with_nulls = pa.array([1.0, None, 3.0])
    assert np.array_equal(_arrow.to_numpy(with_nulls), [1.0, np.nan, 3.0], equal_nan=True)


@pytest.mark.parametrize("values", [[], ["joint_exp"] * 5, ["agg_tree_8x3", "histogram", "",
                                                              "histogram", "naïve ε"]])
def test_strings_are_pyarrows_strings(values):
    got = _arrow.strings(values)
    assert got.type == pa.string() and got.to_pylist() == values
    assert got.equals(pa.array(values, type=pa.string()))


def test_scalar_and_binary_value():
    assert _arrow.scalar(0.0, pa.float32()).equals(pa.scalar(0.0, pa.float32()))
    assert _arrow.scalar(-7, pa.int16()).as_py() == -7
    data = pa.py_buffer(b"\x00\x01arrow ipc bytes")
    value = _arrow.binary_value(data)
    assert value.type == pa.binary() and value.to_pylist() == [data.to_pybytes()]
