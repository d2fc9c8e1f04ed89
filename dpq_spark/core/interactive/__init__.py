"""Interactive mechanisms: counting queries answered as they arrive.

- :mod:`~dpq_spark.core.interactive.median_mechanism`: the median mechanism (Roth and
  Roughgarden, STOC 2010).
- :mod:`~dpq_spark.core.interactive.sparse_vector`: the sparse vector technique, the only part of
  a session that reads the private histogram.
- :mod:`~dpq_spark.core.interactive.planner`: the accuracy and hard-query cap chosen from public
  quantities before a session starts.
"""
