"""The example notebook runs top to bottom on a local session (in its own kernel process)."""

from __future__ import annotations

import os
import sys

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "examples", "dp_quantiles_goodreads.ipynb")


def test_example_notebook_executes(monkeypatch, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")
    # The kernel (and the local Spark workers it starts) must be this interpreter, with
    # dpq_spark installed: put its directory first on PATH and name it for PySpark.
    bindir = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", bindir + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the %pip cell must not need the network
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    ledger = tmp_path / "ledger.sqlite"
    monkeypatch.setenv("DPQ_LEDGER", str(ledger))  # the notebook's budget, in a fresh ledger
    runs = []
    for _ in range(2):  # the second run is the notebook after a kernel restart
        nb = nbformat.read(NOTEBOOK, as_version=4)
        client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                         resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}})
        client.execute()
        outputs = [o for cell in nb.cells if cell.cell_type == "code"
                   for o in cell.get("outputs", [])]
        assert not [o for o in outputs if o.get("output_type") == "error"]
        assert any("image/png" in o.get("data", {}) for o in outputs), "the plot was not drawn"
        runs.append("".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream"))
    assert "0 answer(s) recorded before this cell" in runs[0]
    assert "0 answer(s) recorded before this cell" not in runs[1]  # resumed from the ledger
    from dpq_spark.core.interactive.median_state import MedianState
    from dpq_spark.pipeline.ledger import open_ledger

    # one charge each: the quantiles re-asked were the stored ones, the session was resumed
    ledger = open_ledger(str(ledger))
    records = ledger.records("goodreads_books")
    assert [(r.epsilon, r.name) for r in records] == \
        [(1.0, "deciles by language, v1"), (1.0, "ratings, interactive v1")]
    assert records[0].status == "committed" and records[1].status in ("spent", "committed")
    state = MedianState.from_json(ledger.result(records[1].id))
    assert state.queries_answered > 2  # both runs' answers, recorded
