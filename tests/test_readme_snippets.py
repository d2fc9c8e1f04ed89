"""The README's Python quickstart snippets run as written, in order, in one namespace.

``QUICKSTART`` holds the quickstart text proposed for README.md (issue 10: the old DataFrame
snippet read the bundled CSV with ``inferSchema=True``, which leaves ``average_rating`` a string,
and the ``counts=`` snippet used undefined names). Once README.md carries it, ``QUICKSTART``
becomes ``README.read_text()``: the test then checks the README itself.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

QUICKSTART = '''
The core, on a numpy array:

```python
import numpy as np
import dpq_spark

x = np.random.default_rng().normal(0, 5, 100_000)
dpq_spark.joint_exp(x, [0.1, 0.5, 0.9], epsilon=1.0, lower=-100, upper=100)
# array([-6.41..., 0.01..., 6.39...])   (m sorted estimates in [lower, upper])
```

With multiplicities (binned or pre-aggregated data), at a cost that grows with the number of
distinct values, not the number of rows:

```python
values = np.arange(50, 10_000, 100)                             # bin midpoints of [0, 10_000]
counts = np.random.default_rng().poisson(10_000, values.size)   # rows per bin (~1e6 in all)
dpq_spark.joint_exp(values, [0.1, 0.5, 0.9], epsilon=1.0, lower=0, upper=1e4, counts=counts)
```

On a DataFrame, per public group (from the repository root, on the bundled data):

```python
from pyspark.sql import SparkSession, functions as F
from dpq_spark import dp_quantiles

spark = SparkSession.builder.getOrCreate()
# Read every column as a string and convert the value with try_cast: a few rows of this CSV have
# an unquoted comma, so inferSchema would make `average_rating` a string; their ratings become
# null here, and dp_quantiles drops null values.
df = spark.read.csv("data/goodreads_books.csv", header=True).withColumn(
    "average_rating", F.expr("try_cast(average_rating AS double)"))

release = dp_quantiles(
    df, "average_rating",
    quantiles=[0.1, 0.5, 0.9], epsilon=1.0, lower=0.0, upper=5.0,
    group_by="language_code", groups=["eng", "spa", "fre"],
)
release.show()        # language_code | quantile | value; computed once, every action sees the same numbers
```
'''


def python_blocks(markdown: str) -> list[str]:
    """The bodies of the ```python fenced blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```$", markdown, flags=re.S | re.M)


def test_python_blocks_finds_every_block():
    blocks = python_blocks(QUICKSTART)
    assert len(blocks) == 3
    assert blocks[0].startswith("import numpy as np") and "counts=counts" in blocks[1]
    assert python_blocks("```bash\nmake test\n```\n") == []


def test_core_snippets_run():
    namespace: dict = {}
    for block in python_blocks(QUICKSTART)[:2]:
        exec(compile(block, "README.md", "exec"), namespace)
    np = namespace["np"]
    out = namespace["dpq_spark"].joint_exp(
        namespace["values"], [0.1, 0.5, 0.9], epsilon=1.0, lower=0, upper=1e4,
        counts=namespace["counts"], rng=np.random.default_rng(3))
    assert out.shape == (3,) and np.all(np.diff(out) >= 0) and np.all((out >= 0) & (out <= 1e4))


def test_dataframe_snippet_runs_on_the_bundled_csv(spark, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the snippet's path is relative to the repository root
    ansi = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", "true")  # a plain cast would fail on the bad rows
    try:
        namespace: dict = {}
        for block in python_blocks(QUICKSTART):
            exec(compile(block, "README.md", "exec"), namespace)
    finally:
        spark.conf.set("spark.sql.ansi.enabled", ansi)
    assert "language_code" in capsys.readouterr().out  # release.show() printed the table
    rows = namespace["release"].collect()
    assert sorted({r["language_code"] for r in rows}) == ["eng", "fre", "spa"]
    assert len(rows) == 9 and all(0.0 <= r["value"] <= 5.0 for r in rows)
    assert dict(namespace["df"].dtypes)["average_rating"] == "double"
