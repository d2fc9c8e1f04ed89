"""BudgetSession: every release charged to the dataset's ledger, named releases idempotent, the
dataset's privacy unit enforced, and the charge's life (given back only before data is read).
Run on SQLite and on the real PostgreSQL server the suite starts."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("pyspark")

from dpq_spark import BudgetSession, PrivacyUnit, dp_quantiles  # noqa: E402
from dpq_spark.core.errors import BudgetExceededError, DPQValueError  # noqa: E402
from dpq_spark.pipeline import session as session_module  # noqa: E402
from dpq_spark.pipeline.ledger import LedgerError, init_ledger, open_ledger  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
Q = [0.25, 0.5, 0.75]


@pytest.fixture(scope="module")
def books(spark):
    gen = np.random.default_rng(3)
    pdf = pd.DataFrame({"user": np.arange(2000) % 400, "genre": np.repeat(["a", "b"], 1000),
                        "rating": np.round(gen.uniform(0, 5, 2000), 2)})
    return spark.createDataFrame(pdf).cache()


def release(session, **kw):
    args = dict(quantiles=Q, epsilon=1.0, lower=0.0, upper=5.0)
    args.update(kw)
    return session.quantiles("rating", **args)


def test_a_release_is_charged_and_shown(books, ledger_url):
    init_ledger(ledger_url, dataset_id="books", epsilon_cap=3.0)
    s = BudgetSession(books, ledger=ledger_url, dataset="books")
    assert s.remaining == (3.0, 0.0)
    out = release(s, group_by="genre", groups=["a", "b"]).toPandas()
    assert out.shape == (6, 4) and out["value"].between(0, 5).all()
    assert s.remaining.epsilon == pytest.approx(2.0)
    history = s.history().toPandas()
    assert list(history["status"]) == ["committed"] and list(history["epsilon"]) == [1.0]
    assert "epsilon spent 1 of 3, 2 left" in repr(s) and "one row (add/remove)" in repr(s)
    record = open_ledger(ledger_url).records("books")[0]
    assert record.parameters["groups"].startswith("2 keys, sha256 ")  # not the keys
    assert record.parameters["column"] == "rating" and record.job == "session books"


def test_a_named_release_asked_again_is_the_stored_one_and_charges_once(books, ledger_url):
    init_ledger(ledger_url, dataset_id="books", epsilon_cap=3.0)
    s = BudgetSession(books, ledger=ledger_url, dataset="books")
    first = release(s, name="ratings 2026-12").toPandas()  # unseeded: a fresh draw
    # a re-run cell, a retried task, another process: the same numbers, no new charge
    again = release(BudgetSession(books, ledger=ledger_url, dataset="books"),
                    name="ratings 2026-12").toPandas()
    pd.testing.assert_frame_equal(first, again)
    assert [r.status for r in open_ledger(ledger_url).records("books")] == ["committed"]
    assert s.remaining.epsilon == pytest.approx(2.0)
    with pytest.raises(DPQValueError, match=r"the release named 'ratings 2026-12' .* was "
                                            r"released before .*\(epsilon differ\)"):
        release(s, name="ratings 2026-12", epsilon=0.5)
    assert s.remaining.epsilon == pytest.approx(2.0)
    fresh = release(s, name="ratings 2027-01").toPandas()  # another name: charged anew
    assert s.remaining.epsilon == pytest.approx(1.0) and fresh.shape == first.shape


def test_keys_in_a_dataframe_are_collected_once_and_named_as_the_same_list(books, ledger_url,
                                                                          spark, monkeypatch):
    """A DataFrame of keys (duplicates, another order) is collected once per release, for the
    stored digest and the release alike, and is the same release as the list of its keys."""
    from dpq_spark.spark import _dataflow

    init_ledger(ledger_url, dataset_id="books", epsilon_cap=3.0)
    s = BudgetSession(books, ledger=ledger_url, dataset="books")
    calls = []
    real = _dataflow.key_frame
    monkeypatch.setattr(_dataflow, "key_frame", lambda *a: calls.append(1) or real(*a))
    keys = spark.createDataFrame(pd.DataFrame({"genre": ["b", "a", "b"]}))
    first = release(s, name="by genre", group_by="genre", groups=keys).toPandas()
    assert len(calls) == 1 and set(first["genre"]) == {"a", "b"}
    again = release(s, name="by genre", group_by="genre", groups=["a", "b"]).toPandas()
    pd.testing.assert_frame_equal(first, again)  # the stored release: the same keys' digest
    assert s.remaining.epsilon == pytest.approx(2.0)


def test_a_weaker_unit_is_refused_and_the_dataset_unit_applies(books, ledger_url):
    init_ledger(ledger_url, dataset_id="users", epsilon_cap=5.0,
                unit=PrivacyUnit("user", max_rows_per_unit=3, max_groups_per_unit=1))
    s = BudgetSession(books, ledger=ledger_url, dataset="users")
    with pytest.raises(DPQValueError, match=r"protects one row \(add/remove\), but dataset "
                                            r"'users'.s budget counts all rows of one `user`"):
        release(s, privacy_unit=None)
    with pytest.raises(DPQValueError, match=r"protects all rows of one `user` \(swap"):
        release(s, neighboring="swap")
    assert open_ledger(ledger_url).records("users") == []
    out = release(s, group_by="genre", groups=["a", "b"], rng=np.random.default_rng(5))
    direct = dp_quantiles(books, "rating", quantiles=Q, epsilon=1.0, lower=0.0, upper=5.0,
                          group_by="genre", groups=["a", "b"], privacy_unit="user",
                          max_rows_per_unit=3, max_groups_per_unit=1,
                          rng=np.random.default_rng(5))
    pd.testing.assert_frame_equal(out.toPandas(), direct.toPandas())  # the unit's bounds applied
    # a per-user release on a per-row budget protects more: allowed
    init_ledger(ledger_url, dataset_id="rows", epsilon_cap=5.0)
    rows = BudgetSession(books, ledger=ledger_url, dataset="rows")
    release(rows, privacy_unit="user", max_rows_per_unit=2)
    assert open_ledger(ledger_url).records("rows")[0].parameters["privacy_unit"] == "user"


def test_refusals_before_the_data_charge_nothing(books, ledger_url):
    init_ledger(ledger_url, dataset_id="books", epsilon_cap=1.0)
    s = BudgetSession(books, ledger=ledger_url, dataset="books")
    with pytest.raises(BudgetExceededError):
        release(s, epsilon=1.5)
    with pytest.raises(ValueError, match="`quantiles`"):
        release(s, quantiles=[0.5, 1.5])
    with pytest.raises(ValueError, match="`column`"):
        s.quantiles("no_such_column", quantiles=Q, epsilon=0.5)
    assert open_ledger(ledger_url).records("books") == []
    with pytest.raises(LedgerError, match="has no budget for dataset 'bokos'"):
        BudgetSession(books, ledger=ledger_url, dataset="bokos")


def test_a_failure_after_the_release_started_keeps_the_charge(books, ledger_url, monkeypatch):
    init_ledger(ledger_url, dataset_id="books", epsilon_cap=3.0)
    s = BudgetSession(books, ledger=ledger_url, dataset="books")

    def boom(req):
        raise RuntimeError("a Spark task failed")

    monkeypatch.setattr(session_module, "release_request", boom)
    with pytest.raises(RuntimeError):
        release(s, name="doomed")
    (record,) = open_ledger(ledger_url).records("books")
    assert record.status == "spent" and "budget stays charged" in record.note
    assert s.remaining.epsilon == pytest.approx(2.0)
    monkeypatch.undo()
    with pytest.raises(LedgerError, match=r"'doomed' .* is 'spent': it was charged but never "
                                          r"committed"):
        release(s, name="doomed")  # never a fresh draw under a name already charged
    assert s.remaining.epsilon == pytest.approx(2.0)


def test_a_failure_before_the_release_gives_the_charge_back(books, ledger_url, monkeypatch):
    init_ledger(ledger_url, dataset_id="books", epsilon_cap=3.0)
    s = BudgetSession(books, ledger=ledger_url, dataset="books")
    real = s._ledger.mark_spent

    def refuse(record):
        raise LedgerError("the ledger went away")

    monkeypatch.setattr(s._ledger, "mark_spent", refuse)
    with pytest.raises(LedgerError):
        release(s)
    monkeypatch.setattr(s._ledger, "mark_spent", real)
    (record,) = open_ledger(ledger_url).records("books")
    assert record.status == "cancelled" and s.remaining.epsilon == 3.0


def test_a_session_and_a_job_in_other_processes_share_one_budget(books, ledger_url, tmp_path):
    """A notebook-like session in this process and a spark-submit-like job in another spend
    one dataset's budget; the job's config states no cap (the ledger's applies)."""
    init_ledger(ledger_url, dataset_id="shared", epsilon_cap=2.0)
    data = tmp_path / "ratings.csv"
    books.toPandas().to_csv(data, index=False)
    config = tmp_path / "job.toml"
    config.write_text(textwrap.dedent(f"""
        [input]
        format = "csv"
        path = "{data}"
        column = "rating"
        schema = {{ rating = "double" }}
        [release]
        quantiles = "median"
        epsilon = 1.5
        lower = 0.0
        upper = 5.0
        [output]
        path = "{tmp_path / 'out'}"
        [ledger]
        url = "{ledger_url}"
        dataset_id = "shared"
    """))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    env.pop("SPARK_REMOTE", None)
    job = subprocess.run([sys.executable, os.path.join(ROOT, "jobs", "dp_quantiles.py"),
                          "--config", str(config)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert job.returncode == 0, job.stderr[-2000:]
    s = BudgetSession(books, ledger=ledger_url, dataset="shared")
    assert s.remaining.epsilon == pytest.approx(0.5)
    with pytest.raises(BudgetExceededError):
        release(s, epsilon=1.0)
    release(s, epsilon=0.5)
    again = subprocess.run([sys.executable, os.path.join(ROOT, "jobs", "dp_quantiles.py"),
                            "--config", str(config), "--output", str(tmp_path / "out2")],
                           env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 3, again.stderr[-2000:]  # budget exceeded: the session spent it
    assert [r.status for r in open_ledger(ledger_url).records("shared")] == ["committed"] * 2


def test_a_ledger_written_before_units_and_names_is_migrated_in_place(books, tmp_path):
    """A SQLite ledger with the previous schema (no unit, no name, no result, no cancelled_by)
    opens, gains the columns, keeps its records, and reads its budget's unit as one row."""
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE budgets (dataset_id TEXT PRIMARY KEY, epsilon_cap REAL NOT NULL,
                              delta_cap REAL NOT NULL, updated_at TEXT NOT NULL);
        CREATE TABLE releases (id INTEGER PRIMARY KEY AUTOINCREMENT, dataset_id TEXT NOT NULL,
            status TEXT NOT NULL, epsilon REAL NOT NULL, delta REAL NOT NULL,
            mechanism TEXT NOT NULL, parameters TEXT NOT NULL, output TEXT, job TEXT, host TEXT,
            pid INTEGER, reserved_at TEXT NOT NULL, updated_at TEXT NOT NULL, note TEXT);
        INSERT INTO budgets VALUES ('books', 2.0, 0.0, '2026-11-30T00:00:00+00:00');
        INSERT INTO releases (dataset_id, status, epsilon, delta, mechanism, parameters,
            reserved_at, updated_at) VALUES ('books', 'committed', 0.5, 0.0, 'joint_exp', '{}',
            '2026-11-30T00:00:00+00:00', '2026-11-30T00:00:00+00:00');
    """)
    conn.commit()
    conn.close()
    s = BudgetSession(books, ledger=str(path), dataset="books")
    assert s.unit == PrivacyUnit() and s.remaining.epsilon == pytest.approx(1.5)
    release(s, epsilon=0.5, name="after the upgrade")
    release(s, epsilon=0.5, name="after the upgrade")  # the stored one
    records = open_ledger(str(path)).records("books")
    assert [(r.status, r.name) for r in records] == [("committed", None),
                                                     ("committed", "after the upgrade")]
    columns = {r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(releases)")}
    assert {"name", "result", "cancelled_by"} <= columns


def test_the_keys_digest_is_the_sha256_of_the_sorted_json_rows():
    """The column-wise digest equals its definition (each key row as sorted-key JSON, the rows
    sorted as text, joined by newlines), for integer, string, float, date and boolean keys,
    nulls, and several columns (the stored digest of a named release must not change)."""
    import datetime
    import hashlib
    import json
    from types import SimpleNamespace

    import pyarrow as pa

    def definition(table):
        rows = sorted(json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist())
        return f"{len(rows)} keys, sha256 " + hashlib.sha256("\n".join(rows).encode()).hexdigest()

    tables = [
        pa.table({"g": pa.array([3, -1, None, 2**62, 10], type=pa.int64())}),
        pa.table({"g": pa.array(["b", 'q"uote', "ünï", None, "\n", "a"])}),
        pa.table({"x": pa.array([1.5, float("nan"), -0.0, None, 1e300]),
                  "b": pa.array(["z", "y", None, "w", "v"])}),
        pa.table({"d": pa.array([datetime.date(2020, 1, 2), None]), "t": pa.array([True, False]),
                  "i": pa.array([1, 2], type=pa.int8())}),
        pa.table({"zz": pa.array([1, 2, 1]), "aa": pa.array([2, 1, 3])}),
    ]
    for table in tables:
        assert session_module._keys_digest(SimpleNamespace(groups=table)) == definition(table)
    assert session_module._keys_digest(SimpleNamespace(groups=None)) is None
