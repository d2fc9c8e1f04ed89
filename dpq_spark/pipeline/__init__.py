"""The pipeline over the two layers: the privacy ledger, the job's configuration, the job and
the ``dpq-spark`` command line.

- :mod:`~dpq_spark.pipeline.ledger`: the budget record of every dataset (SQLite or PostgreSQL).
- :mod:`~dpq_spark.pipeline.config`: the job's TOML configuration, loaded and validated.
- :mod:`~dpq_spark.pipeline.inputs` and :mod:`~dpq_spark.pipeline.outputs`: what the job reads
  and writes.
- :mod:`~dpq_spark.pipeline.job`: one committed release and one ledger record per run.
- :mod:`~dpq_spark.pipeline.cli`: ``dpq-spark run`` and ``dpq-spark ledger``.
"""
