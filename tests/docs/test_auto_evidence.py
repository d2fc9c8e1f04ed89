"""The measurements behind ``mechanism="auto"`` agree with the rule as it is now and with what
the docs say of them: the stored errors of ``benchmarks/choosing_auto_grid.py``, scored with the
current :func:`~dpq_spark.core.quantiles.choose.choose_mechanism`, give the counts and the
significant misses that docs/choosing_parameters.md and the rule's docstring state. A change of
the rule that is not measured and documented fails here."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

from dpq_spark.core.quantiles import choose

ROOT = Path(__file__).resolve().parents[2]


def _grid_script():
    spec = importlib.util.spec_from_file_location("dpq_choosing_auto_grid",
                                                  ROOT / "benchmarks" / "choosing_auto_grid.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stored_grid_scores_the_current_rule_as_documented():
    script = _grid_script()
    with open(ROOT / "benchmarks" / "results" / "choosing_auto_grid_errors.csv") as fh:
        ratios = script.ratio_rows(list(csv.DictReader(fh)))
    within, worse = script.score(ratios)
    misses = sorted((r["data"], r["m"], round(r["size"])) for r in worse)
    assert len(ratios) == 168
    assert (within, misses) == (158, [("continuous", 29, 1000), ("integral", 3, 100)])
    # the stored per-case ratios are those of the current rule
    with open(ROOT / "benchmarks" / "results" / "choosing_auto_grid_ratios.csv") as fh:
        stored = {(r["data"], int(r["m"]), int(r["n"]), float(r["epsilon"])): r["auto"]
                  for r in csv.DictReader(fh)}
    assert stored == {(r["data"], r["m"], r["n"], r["epsilon"]): r["auto"] for r in ratios}
    for text in ((ROOT / "docs" / "choosing_parameters.md").read_text(), choose.__doc__):
        flat = " ".join(text.split())
        assert "On 158 of the 168 cases auto" in flat
