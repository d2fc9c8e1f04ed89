"""Group keys exactly as Spark holds them: Arrow arrays in, Arrow arrays out, never pandas.

Used in the Python workers (keys from partition selection, streamed through ``mapInArrow``) and
on the driver (public keys, the final ordering). It imports numpy and pyarrow only.

Keys follow Spark's grouping semantics: a null is a key of its own, every NaN is one key
(distinct from null), ``-0.0`` and ``0.0`` are one key (``0.0``), and an int64 key keeps all its
64 bits (pandas would turn a column holding a null into float64 and merge keys above 2**53).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpq_spark.spark._arrow import numeric, scalar, to_numpy

__all__ = ["normalise", "factorise", "KeyIndex", "key_seed", "spark_order"]


def normalise(array: pa.Array) -> pa.Array:
    """A key column as Spark groups it: for floating types ``-0.0`` becomes ``0.0`` and every
    NaN the one canonical NaN (Arrow's hashing would split NaN payloads and signed zeros).
    Other types are returned unchanged."""
    if not pa.types.is_floating(array.type):
        return array
    array = pc.add(array, scalar(0.0, array.type))  # -0.0 + 0.0 == +0.0; null stays null
    return pc.if_else(pc.is_nan(array), scalar(math.nan, array.type), array)


def _hashable(value):
    """A hashable, NaN-safe stand-in for one Python key value (NaN != NaN would split keys)."""
    if isinstance(value, float) and value != value:
        return ("nan",)
    if isinstance(value, list):
        return ("list", tuple(_hashable(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, tuple):
        return ("tuple", tuple(_hashable(v) for v in value))
    return value


def _codes(column: pa.Array) -> tuple[np.ndarray, int]:
    """Dense codes of one (normalised) column, null a code of its own, and how many there are."""
    try:
        encoded = pc.dictionary_encode(column, null_encoding="encode")
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # nested types: hash in Python
        seen: dict = {}
        codes = np.fromiter((seen.setdefault(_hashable(v), len(seen)) for v in column.to_pylist()),
                            dtype=np.int64, count=len(column))
        return codes, len(seen)
    indices = to_numpy(encoded.indices).astype(np.int64, copy=False)
    return indices, len(encoded.dictionary)


def factorise(columns: list[pa.Array]) -> tuple[np.ndarray, np.ndarray]:
    """Local group index of every row over the key ``columns`` (already normalised) and the
    first row of each local group. Two rows share an index iff all their keys are equal, with
    null == null and NaN == NaN."""
    codes, _ = _codes(columns[0])
    for column in columns[1:]:
        more, size = _codes(column)
        # stays below rows**2 < 2**63, then is made dense again before the next column
        _, codes = np.unique(codes * size + more, return_inverse=True)
    _, first, local = np.unique(codes, return_index=True, return_inverse=True)
    return local.astype(np.int64, copy=False).reshape(-1), first


def key_seed(values: tuple) -> int:
    """A stable signed 64-bit number from one key's Python values (the same in every process):
    the per-group seed offset of a seeded release. Used only when a test passes a Generator."""
    digest = hashlib.blake2b(repr(_hashable(tuple(values))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


class KeyIndex:
    """Numbers the distinct keys seen across a stream of Arrow batches: 0, 1, 2, ...

    :meth:`gids` maps every row of a batch to its key's number; :meth:`table` returns the keys
    in that numbering as Arrow columns of the input types.
    """

    def __init__(self, names: tuple[str, ...]):
        self.names = tuple(names)
        self._gid: dict = {}
        self.values: list[tuple] = []  # Python values of each key, by number
        self._pieces: list[list[pa.Array]] = []

    @property
    def size(self) -> int:
        return len(self.values)

    def gids(self, columns: list[pa.Array]) -> np.ndarray:
        columns = [normalise(c) for c in columns]
        local, first = factorise(columns)
        take = numeric(first, pa.int64())
        firsts = [c.take(take) for c in columns]
        to_gid = np.empty(len(first), dtype=np.int64)
        new = []
        for j, values in enumerate(zip(*[c.to_pylist() for c in firsts])):
            key = _hashable(values)
            gid = self._gid.get(key)
            if gid is None:
                gid = self._gid[key] = len(self.values)
                self.values.append(values)
                new.append(j)
            to_gid[j] = gid
        if new:
            pick = numeric(new, pa.int64())
            self._pieces.append([c.take(pick) for c in firsts])
        return to_gid[local]

    def table(self) -> pa.Table:
        if not self._pieces:
            raise ValueError("no keys seen")
        columns = [pa.concat_arrays([piece[i] for piece in self._pieces])
                   for i in range(len(self.names))]
        return pa.table(dict(zip(self.names, columns)))


_SORTABLE = (pa.types.is_integer, pa.types.is_floating, pa.types.is_string,
             pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary,
             pa.types.is_boolean, pa.types.is_date, pa.types.is_timestamp, pa.types.is_decimal)


def spark_order(table: pa.Table, keys: tuple[str, ...], then: tuple[str, ...] = ("quantile",)):
    """``table`` sorted as Spark's ``orderBy(*[asc_nulls_first(k) for k in keys], *then)``,
    or ``None`` when a key type is one this function does not order (nested types).

    Per key: null first, then the values ascending with ``-0.0 == 0.0``, then NaN after every
    number (Spark's order for doubles); strings and binaries by their bytes (UTF-8 byte order
    is code point order, Spark's default ``UTF8_BINARY`` collation). Stable, so rows equal on
    every sort column keep their order.
    """
    sort_keys, extra = [], {}
    for i, name in enumerate(keys):
        column = table.column(name)
        if not any(test(column.type) for test in _SORTABLE):
            return None
        valid = f"__dpq_sort{i}_valid"
        extra[valid] = pc.is_valid(column)  # False (null) sorts first
        sort_keys.append((valid, "ascending"))
        if pa.types.is_floating(column.type):
            nan = f"__dpq_sort{i}_nan"
            extra[nan] = pc.fill_null(pc.is_nan(column), False)  # NaN after every number
            sort_keys.append((nan, "ascending"))
        sort_keys.append((name, "ascending"))
    sort_keys += [(name, "ascending") for name in then]
    helper = table
    for name, column in extra.items():
        helper = helper.append_column(name, column)
    order = pc.sort_indices(helper, sort_keys=sort_keys)
    return table.take(order)
