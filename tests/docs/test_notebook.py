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
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}})
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the plot was not drawn"
    # one charge: the notebook's second release of the same name was the stored one
    from dpq_spark.pipeline.ledger import open_ledger

    records = open_ledger(str(ledger)).records("goodreads_books")
    assert [(r.status, r.epsilon, r.name) for r in records] == \
        [("committed", 1.0, "deciles by language, v1")]
