"""Packed rows as the public-key shuffle hands one partition to a Python worker.

``partitioned_codes`` hash partitions the packed rows by bucket and sorts each partition by it,
so ``release_partition`` reads a partition's buckets in order; tests that call it directly on
the output of ``pack_partition`` (several chunks, each sorted on its own) sort the rows the same
way first.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from dpq_spark.spark._columns import BUCKET


def sorted_by_bucket(batches, rows: int | None = None) -> list[pa.RecordBatch]:
    """``batches`` of packed rows, sorted by ``BUCKET`` and cut into batches of at most ``rows``
    packed rows (default: one batch)."""
    table = pa.Table.from_batches(list(batches))
    table = table.take(pc.sort_indices(table, [(BUCKET, "ascending")]))
    return table.combine_chunks().to_batches(max_chunksize=rows)
