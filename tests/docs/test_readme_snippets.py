"""The README's Python quickstart snippets run as written, in order, in one namespace.

A snippet that reads the bundled CSV with ``inferSchema=True`` (which leaves ``average_rating``
a string) or uses an undefined name fails here: these tests run the README itself.
"""

from __future__ import annotations

import re
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

QUICKSTART = README.read_text()


def python_blocks(markdown: str) -> list[str]:
    """The bodies of the ```python fenced blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```$", markdown, flags=re.S | re.M)


def test_python_blocks_finds_every_block():
    blocks = python_blocks(QUICKSTART)
    assert len(blocks) == 4
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
    # the budget session's block: one charge, in words
    assert "epsilon spent 1 of 5, 4 left" in repr(namespace["session"])
    assert sorted(r["language_code"] for r in namespace["medians"].collect()) == ["eng", "spa"]
