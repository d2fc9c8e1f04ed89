"""A new user's first hour: the README's install lines, the licence, the signatures `help()`
shows, the job's printed hints, and a quickstart run as ``.venv/bin/python script.py`` without
an activated venv (the local Spark workers must run this interpreter, or fail in one line).

The command-line parts (``--version``, ``--dry-run``, usage errors, pipes, a missing Spark
extra) are in ``tests/pipeline/test_cli.py``.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = set(PYPROJECT["project"]["optional-dependencies"])


def _fenced(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", README, flags=re.S | re.M)


# -- 1. install lines that work as written ---------------------------------------------------


def _pip_lines() -> list[str]:
    lines = [line.split("#")[0].strip() for block in _fenced("bash") for line in block.splitlines()]
    return [line for line in lines if re.search(r"\bpip install\b", line)]


def test_readme_installs_from_a_clone_or_a_git_url_never_from_an_index():
    from packaging.requirements import Requirement

    lines = _pip_lines()
    assert lines, "the README shows no install line"
    assert 'pip install -e ".[spark]"' in lines
    for line in lines:
        target = line.split("pip install", 1)[1].strip()
        if target.startswith("-e "):  # the clone: a local path with extras
            assert re.fullmatch(r'-e "\.(\[[a-z0-9,]+\])?"', target), line
            extras = set(re.findall(r"[a-z0-9]+", target[5:]))
        else:  # a PEP 508 direct reference to the Git repository, OWNER a marked placeholder
            req = Requirement(target.strip('"'))
            assert req.name == "dpq_spark" and req.url is not None, line
            assert req.url.startswith("git+https://github.com/OWNER/"), line
            extras = req.extras
        assert extras <= EXTRAS, (line, extras - EXTRAS)
    assert "replace `OWNER`, a placeholder" in README


def test_readme_explains_every_extra_and_the_venv():
    for extra in EXTRAS:
        assert re.search(rf"^\| `{extra}` \|", README, flags=re.M), f"extra {extra!r} unexplained"
    assert "source .venv/bin/activate" in README and ".venv/bin/dpq-spark" in README
    assert "PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit" in README
    bash = "\n".join(_fenced("bash"))
    assert re.search(r"^make run\b", bash, flags=re.M) and re.search(r"^make test\b", bash,
                                                                    flags=re.M)


def test_the_jobs_printed_hint_works_without_an_activated_venv():
    """The job prints `dpq-spark ledger show ...`; outside the venv that is the script beside
    this interpreter (`.venv/bin/dpq-spark`), inside it the plain name."""
    beside = Path(sys.executable).parent / "dpq-spark"
    if not beside.exists():
        pytest.skip(f"no dpq-spark script beside {sys.executable} (not a venv install)")
    code = "from dpq_spark.pipeline.job import _cli_command; print(_cli_command())"
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    outside = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             cwd=ROOT, env={**env, "PATH": "/usr/bin:/bin"}, check=True)
    assert outside.stdout.strip() == os.path.relpath(beside, ROOT)
    inside = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, check=True,
                            env={**env, "PATH": f"{beside.parent}:/usr/bin:/bin"})
    assert inside.stdout.strip() == "dpq-spark"


# -- 3. the licence ----------------------------------------------------------------------------


def test_license_is_the_apache_2_text_pyproject_names():
    text = (ROOT / "LICENSE").read_text()
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) > 190


# -- 7. the signatures of the bounds-optional mechanisms --------------------------------------

BOUNDS_OPTIONAL = ("joint_exp", "ind_exp", "agg_tree", "histogram", "approx_quantiles")


@pytest.mark.parametrize("name", BOUNDS_OPTIONAL)
def test_bounds_optional_mechanisms_show_optional_bounds(name):
    import dpq_spark
    from dpq_spark.core.quantiles.bounds import DEFAULT_BOUNDS_SHARE

    wrapped = getattr(dpq_spark, name)
    sig = inspect.signature(wrapped)
    base = inspect.signature(wrapped.__wrapped__)
    params = sig.parameters
    assert params["lower"].default is None and params["upper"].default is None
    assert params["bounds_share"].default == DEFAULT_BOUNDS_SHARE
    assert params["n_hint"].default is None
    assert params["bounds_share"].kind is inspect.Parameter.KEYWORD_ONLY
    assert [p for p in params if p not in ("bounds_share", "n_hint")] == list(base.parameters)
    assert "lower: 'float | None' = None, upper: 'float | None' = None" in str(sig)
    sig.bind(np.zeros(3), [0.5], epsilon=1.0)  # what help() shows is a valid call
    # every default the signature shows is the one the call uses: same draw either way
    x, q = np.random.default_rng(0).normal(0, 5, 400), [0.25, 0.75]
    defaults = {k: p.default for k, p in params.items()
                if p.default is not inspect.Parameter.empty and k != "rng"}
    a = wrapped(x, q, epsilon=1.0, rng=np.random.default_rng(5))
    b = wrapped(x, q, **{**defaults, "epsilon": 1.0}, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)


# -- 2. the local Spark workers run this interpreter, or fail in one line ----------------------


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A Python of this version without pyarrow, numpy or dpq_spark (a fresh empty venv)."""
    where = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True,
                   timeout=120)
    python = str(where / "bin" / "python")
    assert subprocess.run([python, "-c", "import pyarrow"], capture_output=True).returncode != 0
    return python


def _clean_env(**extra) -> dict:
    """The environment of a user who did not activate the venv: no VIRTUAL_ENV, no venv on
    PATH, no PYSPARK_PYTHON (unless given)."""
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
                        "PYSPARK_SUBMIT_ARGS", "SPARK_REMOTE")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and p != venv_bin)
    return {**env, **extra}


WORKERS_WITHOUT_PYARROW = textwrap.dedent("""
    from pyspark.sql import SparkSession
    from dpq_spark import dp_quantiles

    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .getOrCreate())
    jobs = lambda: len(spark.sparkContext.statusTracker().getJobIdsForGroup(None))
    df = spark.createDataFrame([(float(i), "ab"[i % 2]) for i in range(20)], "x double, g string")
    if not spark.version.startswith("3."):
        # ungrouped, pyspark 4: no Python worker runs, so the workers' interpreter is no matter
        dp_quantiles(df, "x", quantiles=[0.5], epsilon=1.0, lower=0.0, upper=20.0).collect()
        print("UNGROUPED OK")
    before = jobs()
    try:
        dp_quantiles(df, "x", quantiles=[0.5], epsilon=1.0, lower=0.0, upper=20.0,
                     group_by="g", groups=["a", "b"]).collect()
    except Exception as exc:
        lines = str(exc).splitlines()
        print(f"ERROR {type(exc).__name__} {len(lines)} line(s): {lines[0] if lines else ''}")
    print("NEW JOBS", jobs() - before)
""")


def test_local_workers_without_pyarrow_fail_in_one_line_before_any_job(bare_python, tmp_path):
    script = tmp_path / "release.py"
    script.write_text(WORKERS_WITHOUT_PYARROW)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=600, env=_clean_env(PYSPARK_PYTHON=bare_python))
    assert result.returncode == 0, result.stderr[-3000:]
    errors = [line for line in result.stdout.splitlines() if line.startswith("ERROR ")]
    assert len(errors) == 1, result.stdout
    message = errors[0]
    assert message.startswith("ERROR WorkerPythonError 1 line(s): dp_quantiles: "), message
    assert f"run {bare_python!r} (from PYSPARK_PYTHON)" in message
    assert "cannot import numpy, pyarrow, dpq_spark" in message
    assert f"export PYSPARK_PYTHON={sys.executable}" in message
    assert "NEW JOBS 0" in result.stdout  # refused before its first Spark job
    from dpq_spark.spark._compat import SPARK_VERSION

    assert ("UNGROUPED OK" in result.stdout) == (SPARK_VERSION >= (4, 0))


def test_readme_dataframe_quickstart_runs_without_an_activated_venv(tmp_path):
    """The README's DataFrame example, saved as a file and run as `.venv/bin/python file.py`
    from the repository root, with `python3` on PATH being another interpreter."""
    block = next(b for b in _fenced("python") if "dp_quantiles(" in b)
    script = tmp_path / "quickstart.py"
    script.write_text(block + '\nprint("ROWS", release.count())\n')
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=600, cwd=ROOT, env=_clean_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "language_code" in result.stdout and "ROWS 9" in result.stdout


# -- the worker check's rules, without Spark ---------------------------------------------------


class _Conf:
    def __init__(self, values):
        self.values = values

    def get(self, key, default=None):
        return self.values.get(key, default)


class _Session:
    """A classic session's conf and no SparkContext: the check must not need one. ``python`` is
    the PYSPARK_PYTHON it started with (None: unset), which ``_check`` puts in the environment."""

    def __init__(self, master, python, app="app-1", **conf):
        self.conf = _Conf({"spark.master": master, "spark.app.id": app, **conf})
        self.python = python

    @property
    def sparkContext(self):
        raise AssertionError("the worker check read the SparkContext")


def test_worker_check_rules(monkeypatch, bare_python):
    from dpq_spark.spark import _workers

    calls = []

    def probe(python):
        calls.append(python)
        return _workers.__dict__["_real_probe"](python)

    monkeypatch.setitem(_workers.__dict__, "_real_probe", _workers._probe)
    monkeypatch.setattr(_workers, "_probe", probe)
    monkeypatch.setattr(_workers, "_checked", {})
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)

    def check(session, **kw):
        if session.python is None:
            monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
        else:
            monkeypatch.setenv("PYSPARK_PYTHON", session.python)
        _workers.check_workers(session, **kw)

    check(_Session("local[2]", sys.executable))  # this interpreter: no probe
    check(_Session("spark://host:7077", bare_python))  # a cluster: not ours
    check(_Session("local-cluster[2,1,1024]", bare_python))
    if not _workers._collects_in_workers():  # pyspark 4: an ungrouped release needs no worker
        check(_Session("local[2]", bare_python), grouped=False)
    assert calls == []
    session = _Session("local[*]", bare_python, **{"spark.pyspark.python": sys.executable})
    for _ in range(2):
        with pytest.raises(_workers.WorkerPythonError, match=r"cannot import numpy, pyarrow, "
                           r"dpq_spark \(`spark.pyspark.python` is read by spark-submit only"):
            check(session)
    assert calls == [bare_python]  # cached per application and interpreter
    with pytest.raises(_workers.WorkerPythonError, match="cannot be started"):
        check(_Session("local", "/nonexistent/python3"))
    # unset: pyspark's default "python3" on PATH, here an interpreter without the packages
    monkeypatch.setenv("PATH", f"{os.path.dirname(bare_python)}{os.pathsep}{os.environ['PATH']}")
    assert shutil.which("python3") == os.path.join(os.path.dirname(bare_python), "python3")
    with pytest.raises(_workers.WorkerPythonError, match="pyspark's default while "
                       "PYSPARK_PYTHON is unset"):
        check(_Session("local[2]", None, app="app-2"))
    assert _workers._probe(sys.executable) is None  # another path to a good interpreter is fine
