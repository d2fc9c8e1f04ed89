"""The dpq-spark command line: ledger init / show / set-cap / cancel / export on both backends
(no Spark needed), and the errors an operator meets (one line, naming the ledger)."""

from __future__ import annotations

import csv
import getpass
import io
import json

from dpq_spark.pipeline.cli import main
from dpq_spark.pipeline.ledger import init_ledger, open_ledger
from jobconfig import write_job_config


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


def test_ledger_operations_cannot_damage_a_budget(ledger_url, tmp_path, capsys):
    """set-cap never creates a budget, keeps the cap not given, refuses a cap below the spent
    total unless forced; --config supplies the dataset; init records a privacy unit."""
    _ledger(ledger_url)  # books: cap 4, 1 spent
    base = ["--ledger", ledger_url]
    assert main(["ledger", "set-cap", "--dataset", "bokos", "--epsilon-cap", "9"] + base) == 2
    assert "has no budget for dataset 'bokos'" in capsys.readouterr().err
    assert open_ledger(ledger_url).usage("bokos").epsilon_cap is None  # not created
    assert main(["ledger", "set-cap", "--dataset", "books", "--delta-cap", "1e-6"] + base) == 0
    assert main(["ledger", "set-cap", "--dataset", "books", "--epsilon-cap", "5"] + base) == 0
    usage = open_ledger(ledger_url).usage("books")
    assert (usage.epsilon_cap, usage.delta_cap) == (5.0, 1e-6)  # each kept the other
    capsys.readouterr()
    assert main(["ledger", "set-cap", "--dataset", "books", "--epsilon-cap", "0.5"] + base) == 2
    assert "below the epsilon already spent (1)" in capsys.readouterr().err
    assert open_ledger(ledger_url).usage("books").epsilon_cap == 5.0
    assert main(["ledger", "set-cap", "--dataset", "books", "--epsilon-cap", "0.5",
                 "--force"] + base) == 0
    assert open_ledger(ledger_url).usage("books").epsilon_cap == 0.5
    assert main(["ledger", "set-cap", "--dataset", "books"] + base) == 2
    assert "give --epsilon-cap, --delta-cap or both" in capsys.readouterr().err

    config = tmp_path / "job.toml"
    config.write_text(f'[ledger]\nurl = "{ledger_url}"\ndataset_id = "fresh"\n'
                      'epsilon_cap = 3.0\n')
    assert main(["ledger", "init", "--config", str(config), "--privacy-unit", "user_id",
                 "--max-rows-per-unit", "4"]) == 0
    assert "dataset 'fresh': epsilon_cap=3" in capsys.readouterr().out
    unit = open_ledger(ledger_url).unit("fresh")
    assert (unit.column, unit.max_rows_per_unit) == ("user_id", 4)
    assert main(["ledger", "show", "--config", str(config)]) == 0  # no --dataset needed
    out = capsys.readouterr().out
    assert "dataset 'fresh': epsilon spent 0 of cap 3" in out and "all rows of one `user_id`" in out
    assert main(["ledger", "init", "--config", str(config)]) == 2  # another unit: refused
    assert "already has the privacy unit all rows of one `user_id`" in capsys.readouterr().err
    assert main(["ledger", "set-cap", "--config", str(config), "--epsilon-cap", "4"]) == 0
    assert open_ledger(ledger_url).usage("fresh").epsilon_cap == 4.0


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
                               "delta_remaining": 0.0,
                               "privacy_unit": {"column": None, "max_rows_per_unit": 1,
                                                "max_groups_per_unit": 1,
                                                "neighboring": "add_remove"}}]


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


# -- a new user's first hour: --version, --dry-run, clean usage errors, pipes, the Spark extra --

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

from dpq_spark.pipeline.ledger import redact_url  # noqa: E402

#: Run the CLI with `pyspark` (and every submodule) refused by a meta-path finder, as on a
#: machine without the spark extra.
NO_PYSPARK = """
import sys

class _NoPyspark:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "pyspark":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoPyspark())
from dpq_spark.pipeline.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _cli(*args, code: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    head = [sys.executable, "-c", code] if code else [sys.executable, "-m",
                                                      "dpq_spark.pipeline.cli"]
    if "stdout" not in kwargs:
        kwargs["capture_output"] = True
    return subprocess.run(head + list(args), text=True, timeout=300, **kwargs)


def _job_config(tmp_path, ledger_url, *, epsilon=1.0, create=False, mode="error") -> str:
    data = tmp_path / "scores.csv"
    data.write_text("score,grp\n1.0,a\n2.0,b\n")
    return write_job_config(tmp_path / "job.toml", data=data, column="score", group_by=["grp"],
                            keys=["a", "b"], epsilon=epsilon,
                            output=tmp_path / "out" / "release", mode=mode,
                            ledger_url=ledger_url, dataset_id="books",
                            cap=4.0 if create else None, create=create)


def test_version_prints_the_package_version(capsys):
    import dpq_spark

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"dpq-spark {dpq_spark.__version__}\n"


def test_dry_run_prints_the_plan_and_changes_nothing(ledger_url, tmp_path, capsys):
    ledger = _ledger(ledger_url)  # books: 1.0 committed, 0.5 cancelled; cap 4
    before = ledger.records()
    config = _job_config(tmp_path, ledger_url, epsilon=1.5)
    assert main(["run", "--dry-run", "--config", config]) == 0
    out = capsys.readouterr().out
    assert "epsilon=1.5, delta=0" in out and "dataset 'books'" in out
    assert f"ledger: {redact_url(ledger_url)}" in out
    assert "budget before this run: epsilon left 3 of cap 4" in out
    assert "budget after this run: epsilon left 1.5 of cap 4" in out
    assert f"output: {tmp_path / 'out' / 'release'}" in out
    assert "would be allowed" in out
    assert ledger.records() == before  # nothing reserved, noted or cleaned
    assert not (tmp_path / "out").exists()
    # over the cap: exit 3, and still nothing recorded
    assert main(["run", "--dry-run", "--config", config, "--epsilon", "3.5"]) == 3
    assert "budget before this run: epsilon left 3 of cap 4" in capsys.readouterr().out
    assert ledger.records() == before
    # an existing output: exit 4; a bad config: exit 2
    (tmp_path / "out" / "release").mkdir(parents=True)
    assert main(["run", "--dry-run", "--config", config]) == 4
    assert main(["run", "--dry-run", "--config", config, "--set", "release.epsilon=-1"]) == 2
    assert ledger.records() == before


def test_dry_run_never_creates_a_ledger(tmp_path, capsys, caplog):
    missing = tmp_path / "new.sqlite"
    config = _job_config(tmp_path, f"sqlite://{missing}")
    assert main(["run", "--dry-run", "--config", config]) == 2
    assert "does not exist" in caplog.text
    # with `ledger.create = true` the run would create it: said so, and still not created
    config = _job_config(tmp_path, f"sqlite://{missing}", create=True)
    assert main(["run", "--dry-run", "--config", config]) == 0
    out = capsys.readouterr().out
    assert "the run would create it" in out
    assert "budget after this run: epsilon left 3 of cap 4" in out
    assert main(["run", "--dry-run", "--config", config, "--epsilon", "5"]) == 3  # cap 4
    assert not missing.exists()


def test_dry_run_reads_no_data_and_needs_no_spark(tmp_path):
    url = f"sqlite://{tmp_path / 'l.sqlite'}"
    init_ledger(url, dataset_id="books", epsilon_cap=4.0)
    config = _job_config(tmp_path, url)
    # without pyspark nothing can read the data or start a session: the dry run needs neither
    result = _cli("run", "--dry-run", "--config", config, code=NO_PYSPARK)
    assert result.returncode == 0, result.stderr
    assert "would be allowed" in result.stdout and result.stderr == ""
    assert open_ledger(url).records() == []


def test_a_run_without_pyspark_names_the_extra_in_one_line(tmp_path):
    url = f"sqlite://{tmp_path / 'l.sqlite'}"
    init_ledger(url, dataset_id="books", epsilon_cap=4.0)
    result = _cli("run", "--config", _job_config(tmp_path, url), code=NO_PYSPARK)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "pyspark is not installed" in lines[0] and "pip install 'dpq_spark[spark]'" in lines[0]
    assert "ModuleNotFoundError" not in result.stderr and "Traceback" not in result.stderr
    assert open_ledger(url).records() == []


def test_a_bogus_log_level_is_a_usage_error(tmp_path, capsys, caplog):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--config", "x.toml", "--log-level", "bogus"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: dpq-spark run") and "invalid choice: 'BOGUS'" in err
    # any case is accepted
    assert main(["run", "--config", str(tmp_path / "missing.toml"), "--log-level", "debug"]) == 2
    assert "configuration error" in caplog.text


def test_a_closed_stdout_ends_quietly(tmp_path):
    url = f"sqlite://{tmp_path / 'l.sqlite'}"
    _ledger(url)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write, as with `... | head -0`
    try:
        for args in (["ledger", "export", "--format", "csv", "--ledger", url],
                     ["run", "--dry-run", "--config", _job_config(tmp_path, url)]):
            result = _cli(*args, stdout=write, stderr=subprocess.PIPE)
            assert result.returncode == 141, (args, result.stderr)
            assert result.stderr == "", (args, result.stderr)
    finally:
        os.close(write)
