"""spark-submit entry of the dp_quantiles job: a thin wrapper around ``dpq_spark.pipeline.job.main``.

    spark-submit --properties-file conf/spark-local.conf jobs/dp_quantiles.py --config conf/goodreads.toml
    python jobs/dp_quantiles.py --config conf/goodreads.toml      # starts a local[*] session
    python jobs/dp_quantiles.py --dry-run --config conf/goodreads.toml   # no data, no Spark

All logic (configuration, ledger, release, atomic write) lives in the package; see docs/jobs.md.
"""

import os
import sys

try:
    from dpq_spark.pipeline.job import main
except ImportError:  # run from a source checkout without `pip install -e .`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    from dpq_spark.pipeline.job import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
