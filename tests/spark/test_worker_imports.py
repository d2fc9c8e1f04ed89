"""What a Spark Python worker imports to run a release: the release module, numpy and pyarrow;
never scipy, pandas or the driver-side modules (each costs a new worker tenths of a second before
its first release: about 1.3 s in all before they were made lazy)."""

import subprocess
import sys
import textwrap


def test_the_release_module_imports_no_scipy_pandas_or_driver_modules():
    code = textwrap.dedent(
        """
        import sys
        import pyspark.worker  # what every Python worker has imported already
        before = set(sys.modules)
        import dpq_spark.spark._release
        new = sorted(set(sys.modules) - before)
        heavy = [m for m in new if m.split(".")[0] in {"scipy", "pandas"}
                 or m in {"dpq_spark.spark.quantiles", "dpq_spark.spark.median_session",
                          "dpq_spark.core.interactive.median_mechanism", "dpq_spark.core.interactive.planner"}]
        print(heavy)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_lazy_names_still_resolve():
    import dpq_spark
    import dpq_spark.core
    import dpq_spark.spark
    from dpq_spark.core import MedianMechanism, Plan, plan_median_session  # noqa: F401
    from dpq_spark.spark import MedianMechanismSession, dp_quantiles  # noqa: F401

    assert dpq_spark.dp_quantiles is dp_quantiles
    assert dpq_spark.MedianMechanism is MedianMechanism
    assert set(dpq_spark.core.__all__) <= set(dir(dpq_spark.core))
    assert set(dpq_spark.spark.__all__) <= set(dir(dpq_spark.spark))
    assert callable(dpq_spark.joint_exp) and callable(dpq_spark.core.joint_exp)


def test_a_release_body_in_a_worker_never_imports_pandas():
    """``pyarrow.array`` and ``pyarrow.scalar`` import pandas on their first call (about 0.26 s
    in a new worker): the worker-side code builds its Arrow arrays from numpy buffers instead
    (``dpq_spark.spark._arrow``), so packing and releasing a partition, on the public-key path
    (codes, or integral keys looked up while packing) and on the path of keys from partition
    selection (float keys normalised), leave pandas out."""
    code = textwrap.dedent(
        """
        import dataclasses, sys
        import numpy as np, pyarrow as pa
        import pyspark.worker
        from dpq_spark.spark import _packing, _release
        from dpq_spark.spark._arrow import numeric, strings
        from dpq_spark.spark._columns import CELL, CODE
        gen = np.random.default_rng(1)
        codes = (gen.integers(0, 50, 20000) << 33) + gen.integers(0, 2**32 + 1, 20000)
        raw = [pa.RecordBatch.from_arrays([numeric(codes, pa.int64())], names=[CODE])]
        packed = list(_packing.pack_partition(iter(raw), 1 << 33))
        params = _release.ReleaseParams(
            keys=("g",), quantiles=(0.1, 0.5, 0.9), epsilon=1.0, lower=-100.0, upper=100.0,
            resolution=1 << 20, neighboring="add_remove", mechanism="auto")
        public = sum(b.num_rows for b in _release.release_partition(iter(packed), params))
        # integral public keys looked up on the map side, a null key and an unlisted one dropped
        keys = numeric(np.arange(50) * 3, pa.int64())
        data_keys = pa.concat_arrays([numeric(gen.integers(0, 50, 5000) * 3, pa.int32()),
                                      pa.nulls(1, pa.int32()), numeric([1], pa.int32())])
        rows = pa.RecordBatch.from_arrays(
            [data_keys, numeric(gen.integers(0, 2**32 + 1, 5002), pa.int64())], names=["k", CELL])
        packed = list(_packing.pack_partition(iter([rows]), 1 << 33, keys=keys))
        looked_up = sum(b.num_rows for b in _release.release_partition(iter(packed), params))
        rows = 3000
        keyed = pa.RecordBatch.from_arrays(
            [strings([f"k{i % 3}" for i in range(rows)]),
             numeric(gen.integers(0, 4, rows) - 0.0, pa.float64()),
             numeric(gen.integers(0, 1 << 20, rows), pa.int64())], names=["s", "f", CELL])
        keyed_params = dataclasses.replace(params, keys=("s", "f"))
        selected = sum(b.num_rows for b in _release.release_keyed_partition(iter([keyed]),
                                                                            keyed_params))
        print(public, looked_up, selected, "pandas" in sys.modules)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["50", "50", str(12 * 3), "False"]
