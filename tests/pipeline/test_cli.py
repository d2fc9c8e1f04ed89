"""The dpq-spark command line: ledger init / show / set-cap / cancel / export on both backends
(no Spark needed), and the errors an operator meets (one line, naming the ledger)."""

from __future__ import annotations

import csv
import getpass
import io
import json

from dpq_spark.pipeline.cli import main
from dpq_spark.pipeline.ledger import init_ledger, open_ledger


def _ledger(url):
    ledger = init_ledger(url, dataset_id="books", epsilon_cap=4.0)
    ledger.create_dataset("other", epsilon_cap=4.0)
    a = ledger.reserve("books", epsilon=1.0, epsilon_cap=4.0, mechanism="joint_exp", job="nightly")
    ledger.mark_spent(a)
    ledger.commit(a, "/out/books/1")
    b = ledger.reserve("books", epsilon=0.5, epsilon_cap=4.0, mechanism="joint_exp", job="nightly")
    ledger.cancel(b, "failed before sampling: ConfigError")
    ledger.reserve("other", epsilon=2.0, epsilon_cap=4.0, mechanism="joint_exp")
    return ledger


def test_ledger_show_prints_the_records_of_one_dataset(ledger_url, capsys):
    _ledger(ledger_url)
    assert main(["ledger", "show", "--dataset", "books", "--ledger", ledger_url]) == 0
    out = capsys.readouterr().out
    assert "epsilon spent 1 of cap 4 (left 3)" in out
    assert "committed" in out and "/out/books/1" in out
    assert "cancelled" in out and "failed before sampling" in out
    assert "other" not in out


def test_ledger_show_json_and_config_path_relative_to_the_config(tmp_path, capsys):
    _ledger(f"sqlite://{tmp_path / 'l.sqlite'}")
    cfg = tmp_path / "job.toml"
    cfg.write_text('[ledger]\npath = "l.sqlite"\n')  # relative to the config's directory
    assert main(["ledger", "show", "--dataset", "books", "--config", str(cfg), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in doc["records"]] == ["committed", "cancelled"]
    assert doc["usage"]["epsilon_remaining"] == 3.0


def test_ledger_init_then_show(ledger_url, capsys):
    assert main(["ledger", "show", "--dataset", "d", "--ledger", ledger_url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ledger init" in err and "Traceback" not in err
    assert main(["ledger", "init", ledger_url, "--dataset", "d", "--epsilon-cap", "2",
                 "--delta-cap", "1e-6"]) == 0
    assert "ready; dataset 'd': epsilon_cap=2, delta_cap=1e-06" in capsys.readouterr().out
    usage = open_ledger(ledger_url).usage("d")
    assert (usage.epsilon_cap, usage.delta_cap) == (2.0, 1e-6)
    assert main(["ledger", "init", ledger_url, "--dataset", "d", "--epsilon-cap", "3"]) == 2
    assert "already has epsilon_cap=2" in capsys.readouterr().err
    assert main(["ledger", "init", ledger_url, "--dataset", "e"]) == 2
    assert "`--epsilon-cap` is required" in capsys.readouterr().err


def test_ledger_set_cap_and_errors(ledger_url, capsys):
    _ledger(ledger_url)
    assert main(["ledger", "set-cap", "--dataset", "books", "--epsilon-cap", "6",
                 "--ledger", ledger_url]) == 0
    assert open_ledger(ledger_url).usage("books").epsilon_cap == 6.0
    assert main(["ledger", "set-cap", "--dataset", "books", "--epsilon-cap", "-1",
                 "--ledger", ledger_url]) == 2
    assert "`epsilon_cap` must be finite and > 0" in capsys.readouterr().err
    assert main(["ledger", "show", "--dataset", "books"]) == 2
    assert "--ledger URL or --config FILE" in capsys.readouterr().err


def test_ledger_cancel_needs_force_and_reason_and_records_who(ledger_url, capsys):
    ledger = _ledger(ledger_url)
    stale = ledger.reserve("books", epsilon=2.0, epsilon_cap=4.0, mechanism="joint_exp")
    base = ["ledger", "cancel", str(stale), "--ledger", ledger_url]
    assert main(base + ["--reason", "x"]) == 2
    assert "confirm with --force" in capsys.readouterr().err
    assert main(base + ["--force"]) == 2
    assert "`--reason` is required" in capsys.readouterr().err
    assert ledger.get(stale).status == "reserved"
    assert main(base + ["--force", "--reason", "driver lost, run 77 failed"]) == 0
    assert "given back" in capsys.readouterr().out
    rec = ledger.get(stale)
    assert rec.status == "cancelled" and rec.cancelled_by == getpass.getuser()
    assert rec.note == "operator: driver lost, run 77 failed"
    assert ledger.usage("books").epsilon_spent == 1.0
    # only a reservation: a spent/committed release stays charged
    committed = ledger.records("books")[0].id
    assert main(["ledger", "cancel", str(committed), "--force", "--reason", "x", "--by", "bob",
                 "--ledger", ledger_url]) == 2
    assert "is 'committed'; cannot become 'cancelled'" in capsys.readouterr().err
    assert main(["ledger", "cancel", "999", "--force", "--reason", "x",
                 "--ledger", ledger_url]) == 2
    assert "no ledger record with id 999" in capsys.readouterr().err


def test_ledger_export_csv_and_json(ledger_url, tmp_path, capsys):
    _ledger(ledger_url)
    assert main(["ledger", "export", "--format", "csv", "--ledger", ledger_url]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["dataset_id"], r["status"]) for r in rows] == [
        ("books", "committed"), ("books", "cancelled"), ("other", "reserved")]
    out = tmp_path / "audit.json"
    assert main(["ledger", "export", "--format", "json", "--dataset", "books", "--output",
                 str(out), "--ledger", ledger_url]) == 0
    doc = json.loads(out.read_text())
    assert [r["status"] for r in doc["records"]] == ["committed", "cancelled"]
    assert doc["budgets"] == [{"dataset_id": "books", "epsilon_spent": 1.0, "delta_spent": 0.0,
                               "epsilon_cap": 4.0, "delta_cap": 0.0, "epsilon_remaining": 3.0,
                               "delta_remaining": 0.0}]


def test_ledger_show_on_a_corrupt_or_missing_file(tmp_path, capsys):
    bad = tmp_path / "ledger.sqlite"
    bad.write_bytes(b"\x00garbage" * 500)
    assert main(["ledger", "show", "--dataset", "d", "--ledger", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == f"dpq-spark ledger show: ledger {bad}: DatabaseError: file is not a database\n"
    missing = tmp_path / "typo.sqlite"
    assert main(["ledger", "show", "--dataset", "d", "--ledger", str(missing)]) == 2
    assert f"ledger {missing}: does not exist" in capsys.readouterr().err
    assert not missing.exists()  # never created by a read


def test_run_dispatches_to_the_job(tmp_path, caplog):
    assert main(["run", "--config", str(tmp_path / "missing.toml")]) == 2
    assert "configuration error: config file" in caplog.text


def test_job_errors_are_printed_once(tmp_path):
    """A failing job reports its error exactly once on stderr (it used to be logged and printed)."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "dpq_spark.pipeline.cli", "run", "--config",
                             str(tmp_path / "missing.toml")], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("does not exist") == 1, result.stderr
    assert "Traceback" not in result.stderr
