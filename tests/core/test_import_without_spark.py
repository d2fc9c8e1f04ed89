"""The core (and the top-level package) must import and run without pyspark, pandas or pyarrow."""

import subprocess
import sys
import textwrap


def test_core_imports_without_spark_pandas_or_arrow():
    code = textwrap.dedent(
        """
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {"pyspark", "pandas", "pyarrow"}:
                    raise ImportError(f"blocked: {name}")
                return None

        sys.meta_path.insert(0, Block())
        import numpy as np
        import dpq_spark
        from dpq_spark.core import joint_exp
        out = dpq_spark.joint_exp([1.0, 2.0, 3.0], [0.5], epsilon=1.0, lower=0.0, upper=4.0)
        assert out.shape == (1,)
        try:
            dpq_spark.dp_quantiles
        except ImportError as exc:
            assert "dpq_spark[spark]" in str(exc)
        else:
            raise AssertionError("dp_quantiles resolved without pyspark")
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
