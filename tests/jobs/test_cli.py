"""The dpq-spark command line: ledger show / set-cap (no Spark needed)."""

from __future__ import annotations

import json

from dpq_spark.cli import main
from dpq_spark.ledger import Ledger


def _ledger(tmp_path):
    path = str(tmp_path / "l.sqlite")
    ledger = Ledger(path)
    a = ledger.reserve("books", epsilon=1.0, epsilon_cap=4.0, mechanism="joint_exp", job="nightly")
    ledger.mark_spent(a)
    ledger.commit(a, "/out/books/1")
    b = ledger.reserve("books", epsilon=0.5, epsilon_cap=4.0, mechanism="joint_exp", job="nightly")
    ledger.cancel(b, "failed before sampling: ConfigError")
    ledger.reserve("other", epsilon=2.0, epsilon_cap=4.0, mechanism="joint_exp")
    return path


def test_ledger_show_prints_the_records_of_one_dataset(tmp_path, capsys):
    path = _ledger(tmp_path)
    assert main(["ledger", "show", "--dataset", "books", "--ledger", path]) == 0
    out = capsys.readouterr().out
    assert "epsilon spent 1 of cap 4 (left 3)" in out
    assert "committed" in out and "/out/books/1" in out
    assert "cancelled" in out and "failed before sampling" in out
    assert "other" not in out


def test_ledger_show_json_and_config_path(tmp_path, capsys):
    path = _ledger(tmp_path)
    cfg = tmp_path / "job.toml"
    cfg.write_text(f'[ledger]\npath = "{path}"\n')
    assert main(["ledger", "show", "--dataset", "books", "--config", str(cfg), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in doc["records"]] == ["committed", "cancelled"]
    assert doc["usage"]["epsilon_remaining"] == 3.0


def test_ledger_set_cap_and_errors(tmp_path, capsys):
    path = _ledger(tmp_path)
    assert main(["ledger", "set-cap", "--dataset", "books", "--epsilon-cap", "6",
                 "--ledger", path]) == 0
    assert Ledger(path).usage("books").epsilon_cap == 6.0
    assert main(["ledger", "set-cap", "--dataset", "books", "--epsilon-cap", "-1",
                 "--ledger", path]) == 2
    assert "`epsilon_cap` must be finite and > 0" in capsys.readouterr().err
    assert main(["ledger", "show", "--dataset", "books"]) == 2
    assert "--ledger PATH or --config FILE" in capsys.readouterr().err


def test_run_dispatches_to_the_job(tmp_path, capsys):
    assert main(["run", "--config", str(tmp_path / "missing.toml")]) == 2
    assert "configuration error: config file" in capsys.readouterr().err
