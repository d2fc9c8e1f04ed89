"""Internal column names of the Spark path's frames (the ``__dpq_`` prefix is reserved)."""

from __future__ import annotations

__all__ = ["CELL", "CODE", "GID", "BUCKET", "CODES", "COUNTS", "COUNT", "UNITS", "KEY_HASH", "MECHANISM"]

CELL = "__dpq_cell"
CODE = "__dpq_code"  # public-key path: key index * resolution + cell, packed in the JVM
GID = "__dpq_gid"  # public-key path: index of the key in the driver's key list
BUCKET = "__dpq_bucket"  # public-key path after packing: GID >> shift, what the shuffle partitions by
CODES = "__dpq_codes"  # public-key path after packing: sorted codes of one bucket, as bytes
COUNTS = "__dpq_counts"  # ... and their counts as bytes (empty: one row each)
COUNT = "__dpq_count"
UNITS = "__dpq_units"
KEY_HASH = "__dpq_key_hash"
MECHANISM = "mechanism"  # output column: the mechanism that ran for the group
