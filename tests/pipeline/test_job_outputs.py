"""Where a job's release goes: one named file in a local directory (a CSV release is one
``pandas.read_csv``), and a table appended to once per run with the release's name, time,
epsilon and unit (a retried run appends nothing)."""

from __future__ import annotations

import os

import pandas as pd
import pytest

pytest.importorskip("pyspark")

from jobconfig import write_job_config  # noqa: E402

from dpq_spark.pipeline.config import ConfigError, load_config  # noqa: E402
from dpq_spark.pipeline.job import main  # noqa: E402
from dpq_spark.pipeline.ledger import open_ledger  # noqa: E402


def scores_csv(tmp_path) -> str:
    path = tmp_path / "scores.csv"
    path.write_text("score,grp\n" + "".join(f"{(i % 100) / 10:.1f},{'ab'[i % 2]}\n"
                                          for i in range(300)))
    return str(path)


def config(tmp_path, *, table=None, path=True, fmt="csv") -> str:
    written = write_job_config(
        tmp_path / "job.toml", data=scores_csv(tmp_path), column="score", group_by=["grp"],
        keys=["a", "b"], quantiles="[0.25, 0.5, 0.75]", epsilon=1.0, output_format=fmt,
        output=tmp_path / "out" / "rel", ledger_url="sqlite://" + str(tmp_path / "l.sqlite"),
        dataset_id="scores", cap=10.0, create=True)
    text = open(written).read()
    if not path:
        text = text.replace(f'path = "{tmp_path / "out" / "rel"}"\n', "")
    if table is not None:
        text = text.replace("[output]\n", f'[output]\ntable = "{table}"\n')
    open(written, "w").write(text)
    return written


def test_a_local_csv_release_is_one_file_that_pandas_reads(spark, tmp_path):
    assert main(["--config", config(tmp_path)]) == 0
    out = tmp_path / "out" / "rel"
    assert sorted(os.listdir(out)) == ["_release.json", "release.csv"]
    release = pd.read_csv(out / "release.csv")
    assert list(release.columns) == ["grp", "quantile", "value", "mechanism"]
    assert len(release) == 6 and release["value"].between(0, 10).all()


def test_a_table_gets_one_release_per_run_and_a_retry_appends_nothing(spark, tmp_path):
    spark.sql(f"CREATE DATABASE IF NOT EXISTS dpq_out LOCATION '{tmp_path / 'warehouse'}'")
    try:
        job = config(tmp_path, table="dpq_out.releases", path=False)
        assert main(["--config", job, "--run-id", "2026-12-01"]) == 0
        assert main(["--config", job, "--run-id", "2026-12-01"]) == 0  # a retry: nothing new
        assert main(["--config", job, "--run-id", "2026-12-02"]) == 0
        rows = spark.table("dpq_out.releases").toPandas()
        assert len(rows) == 12  # two runs of 2 groups x 3 quantiles
        assert sorted(set(rows["release_name"])) == ["dp_quantiles 2026-12-01",
                                                     "dp_quantiles 2026-12-02"]
        assert set(rows["epsilon"]) == {1.0} and set(rows["dataset_id"]) == {"scores"}
        assert set(rows["privacy_unit"]) == {"one row (add/remove)"}
        assert rows["released_at"].notna().all()
        records = open_ledger("sqlite://" + str(tmp_path / "l.sqlite")).records("scores")
        assert [r.output for r in records] == ["table dpq_out.releases"] * 2
        assert sorted(set(rows["ledger_record"])) == [r.id for r in records]
    finally:
        spark.sql("DROP DATABASE IF EXISTS dpq_out CASCADE")


def test_output_needs_a_path_or_a_table_and_a_table_name(tmp_path):
    with pytest.raises(ConfigError, match=r"needs `output.path` .*`output.table`"):
        load_config(config(tmp_path, path=False))
    with pytest.raises(ConfigError, match="`output.table` must be a table name"):
        load_config(config(tmp_path, table="releases; DROP TABLE x"))
    both = load_config(config(tmp_path, table="cat.db.releases"))
    assert both.output.table == "cat.db.releases" and both.output.path.endswith("rel")


def test_a_job_protecting_less_than_its_datasets_unit_is_refused_before_spark(tmp_path, caplog):
    """The job checks its release's unit against the dataset's, as a session does: a per-row
    release on a per-user budget stops before Spark starts, naming both units."""
    from dpq_spark import PrivacyUnit
    from dpq_spark.pipeline.ledger import init_ledger

    url = "sqlite://" + str(tmp_path / "l.sqlite")
    init_ledger(url, dataset_id="scores", epsilon_cap=10.0,
                unit=PrivacyUnit("user", max_rows_per_unit=3))
    job = config(tmp_path)
    text = open(job).read().replace("create = true", "create = false")
    open(job, "w").write(text)
    assert main(["--config", job]) == 2
    err = caplog.text
    assert "stage start spark" not in err
    assert "job 'dp_quantiles' protects one row (add/remove)" in err
    assert "counts all rows of one `user`" in err
    assert open_ledger(url).records("scores") == []
