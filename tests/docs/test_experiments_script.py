"""The experiment script behind docs/evaluation.md runs end to end in its quick configuration,
and writes the committed results only when asked (``--update``)."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("pandas")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "experiments.py"


def _load():
    spec = importlib.util.spec_from_file_location("dpq_experiments", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_configuration_writes_csv_and_figures(tmp_path, capsys):
    experiments = _load()
    assert experiments.main(["--quick", "--out", str(tmp_path / "res"), "--figures", str(tmp_path / "fig")]) == 0
    with open(tmp_path / "res" / "accuracy_trials.csv") as fh:
        rows = list(csv.DictReader(fh))
    mechanisms = {r["mechanism"] for r in rows}
    assert mechanisms == set(experiments.ORDER)
    assert {r["dataset"] for r in rows} == set(experiments.DATASETS)
    # 4 datasets x 2 trials x m in {1, 2, 3, 5} x 7 mechanisms
    assert len(rows) == 4 * 2 * 4 * 7
    for r in rows:
        assert 0 <= int(r["missed_sum"]) <= int(r["m"]) * 200
        assert float(r["missed_mean"]) == pytest.approx(int(r["missed_sum"]) / int(r["m"]))
    with open(tmp_path / "res" / "runtime.csv") as fh:
        runtime = list(csv.DictReader(fh))
    assert {r["experiment"] for r in runtime} == {"runtime_n", "runtime_m"}
    out = capsys.readouterr().out
    assert "Mean missed points" in out and "[pages]" in out
    if importlib.util.find_spec("matplotlib") is not None:
        assert sorted(p.name for p in (tmp_path / "fig").glob("*.png")) == [
            "error_vs_m.png",
            "error_vs_m_large_m.png",
            "time_vs_m.png",
            "time_vs_n.png",
        ]


def test_outputs_go_to_a_scratch_directory_unless_update():
    experiments = _load()
    scratch = experiments.parse_args([])
    assert scratch.out == experiments.SCRATCH / "results"
    assert scratch.figures == experiments.SCRATCH / "figures"
    assert experiments.SCRATCH.is_relative_to(experiments.REPO / "out")  # git-ignored
    update = experiments.parse_args(["--update"])
    assert update.out == experiments.REPO / "benchmarks" / "results"
    assert update.figures == experiments.REPO / "docs" / "figures"
    given = experiments.parse_args(["--update", "--out", "x", "--figures", "y"])
    assert (given.out, given.figures) == (Path("x"), Path("y"))
    with pytest.raises(SystemExit):
        experiments.parse_args(["--update", "--quick"])


def test_quick_run_prints_where_it_writes(tmp_path, capsys):
    experiments = _load()
    res, fig = tmp_path / "res", tmp_path / "fig"
    args = ["--quick", "--skip-runtime", "--datasets", "gaussian", "--mechanisms", "joint_exp",
            "--no-plots", "--out", str(res), "--figures", str(fig)]
    assert experiments.main(args) == 0
    out = capsys.readouterr().out
    assert f"results: {res}" in out and "--update replaces them" in out
    assert sorted(p.name for p in res.iterdir()) == ["accuracy_trials.csv"]


def test_missed_points_counts_points_between():
    experiments = _load()
    import numpy as np

    x = np.arange(10.0)
    miss = experiments.missed_points(x, np.array([2.0, 5.0]), np.array([4.5, 5.0]))
    assert miss.tolist() == [2, 0]
