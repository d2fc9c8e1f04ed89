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
