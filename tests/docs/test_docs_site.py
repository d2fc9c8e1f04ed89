"""The docs site builds strictly, and every Python example on its pages runs.

The site (``mkdocs.yml``, pages under ``docs/``, the API reference rendered by mkdocstrings
from the docstrings) is built with ``mkdocs build --strict``, so a broken link, a missing image
or a docstring griffe cannot parse fails the build.

The ```python blocks of each ``docs/*.md`` page run as written, in order, in one namespace per
page, from the repository root (the pages read ``data/goodreads_books.csv``). A page whose
examples use Spark gets the suite's local session as ``spark``. A block is skipped only when an
HTML comment ``<!-- no-test: REASON -->`` stands right before it; the reason is shown in the
test report.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))

# A ```python fence, also indented inside a list item, with an optional no-test mark on the line
# (or blank line and line) right before it.
BLOCK = re.compile(
    r"(?:^[ \t]*<!--\s*no-test:\s*(?P<reason>.*?)\s*-->\n(?:[ \t]*\n)?)?"
    r"^(?P<indent>[ \t]*)```python\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    flags=re.S | re.M,
)


def python_blocks(markdown: str) -> list[tuple[str, str | None, int]]:
    """``(body, skip reason or None, line number)`` of every ```python block, in order."""
    return [(textwrap.dedent(m["body"]), m["reason"], markdown.count("\n", 0, m.start("body")) + 1)
            for m in BLOCK.finditer(markdown)]


def test_python_blocks_finds_blocks_and_skip_marks():
    text = ("```python\na = 1\n```\n\n```bash\nmake\n```\n\n"
            "<!-- no-test: needs a cluster -->\n```python\nb = 2\n```\n\n"
            "1. in a list:\n   ```python\n   if c:\n       d = 3\n   ```\n")
    assert python_blocks(text) == [("a = 1\n", None, 2), ("b = 2\n", "needs a cluster", 11),
                                   ("if c:\n    d = 3\n", None, 16)]
    assert python_blocks("```text\nx\n```\n") == []


def test_every_skip_mark_has_a_reason_and_a_block():
    for page in PAGES:
        text = page.read_text()
        marks = re.findall(r"<!--\s*no-test:(.*?)-->", text)
        skipped = [b for b in python_blocks(text) if b[1] is not None]
        assert len(marks) == len(skipped), f"{page.name}: a no-test mark not right before a python block"
        assert all(reason.strip() for reason in marks), f"{page.name}: a no-test mark without a reason"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout}\n{run.stderr}"
    return out


def _text(html_file: Path) -> str:
    """The visible text of a page, tags stripped and whitespace collapsed."""
    import html

    text = re.sub(r"<[^>]+>", "", html_file.read_text())
    return re.sub(r"\s+", " ", html.unescape(text))


def test_site_builds_strictly_with_every_page(site):
    for page in PAGES:
        out = site / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")
        assert out.is_file(), f"{page.name} was not built"
    for api in ["quantiles", "spark", "interactive", "pipeline", "errors"]:
        assert (site / "api" / api / "index.html").is_file()


@pytest.mark.parametrize("page, names, phrases", [
    ("quantiles",
     ["dpq_spark.joint_exp", "dpq_spark.core.auto", "dpq_spark.core.choose_mechanism",
      "dpq_spark.ind_exp", "dpq_spark.core.app_ind_exp", "dpq_spark.approx_quantiles",
      "dpq_spark.agg_tree", "dpq_spark.histogram", "dpq_spark.core.smooth",
      "dpq_spark.core.csmooth", "dpq_spark.core.private_bounds", "dpq_spark.core.PrivateBounds",
      "dpq_spark.core.QuantileRelease", "dpq_spark.core.MECHANISMS",
      "dpq_spark.core.NeighboringRelation"],
     # JointExp's Privacy section and a parameter of its docstring
     ["epsilon-DP (pure) for the mechanism defined below", "Strictly increasing, each in (0, 1)"]),
    ("spark",
     ["dpq_spark.dp_quantiles", "dpq_spark.MedianMechanismSession", "dpq_spark.spark.NumericColumn",
      "dpq_spark.spark.CategoricalColumn", "dpq_spark.spark.QuantileAnswer"],
     ["Privacy"]),
    ("interactive",
     ["dpq_spark.MedianMechanism", "dpq_spark.MedianAnswer", "dpq_spark.AnswerKind",
      "dpq_spark.plan_median_session", "dpq_spark.Plan"],
     ["Privacy"]),
    ("pipeline",
     ["dpq_spark.BudgetSession", "dpq_spark.PrivacyUnit",
      "dpq_spark.pipeline.ledger.open_ledger", "dpq_spark.pipeline.ledger.init_ledger",
      "dpq_spark.pipeline.ledger.Ledger", "dpq_spark.pipeline.job.main",
      "dpq_spark.pipeline.job.run_job"],
     ["never creates one unless"]),
    ("errors",
     ["dpq_spark.core.DPQValueError", "dpq_spark.core.BudgetExceededError",
      "dpq_spark.core.SessionHaltedError"],
     []),
])
def test_api_pages_render_the_public_names(site, page, names, phrases):
    text = _text(site / "api" / page / "index.html")
    for name in names + phrases:
        assert name in text, f"api/{page}.md: {name!r} not rendered"


def test_images_of_the_pages_exist():
    for page in PAGES:
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text()):
            assert (DOCS / target).is_file(), f"{page.name}: image {target} is missing"


def _page_id(page: Path) -> str:
    return page.name


def _pages_with_examples() -> list[Path]:
    return [p for p in PAGES if any(reason is None for _, reason, _ in python_blocks(p.read_text()))]


@pytest.mark.parametrize("page", _pages_with_examples(), ids=_page_id)
def test_python_examples_run(page, request, monkeypatch, tmp_path):
    blocks = [(body, line) for body, reason, line in python_blocks(page.read_text()) if reason is None]
    monkeypatch.chdir(ROOT)  # the examples' paths are relative to the repository root
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # their scratch files go here
    namespace: dict = {"__name__": "__docs__"}
    if any(re.search(r"\bspark\b|pyspark", body) for body, _ in blocks):
        namespace["spark"] = request.getfixturevalue("spark")
    for body, line in blocks:
        # blank lines first, so that a traceback points at the page's own line numbers
        code = compile("\n" * (line - 1) + body, str(page.relative_to(ROOT)), "exec")
        exec(code, namespace)


_SKIPPED = [(page, line, reason) for page in PAGES
            for _, reason, line in python_blocks(page.read_text()) if reason is not None]


@pytest.mark.parametrize("page, line, reason", _SKIPPED,
                         ids=[f"{p.name}:{line}" for p, line, _ in _SKIPPED])
def test_python_examples_not_run(page, line, reason):
    """Each block marked ``no-test`` shows up as a skipped test with its reason."""
    pytest.skip(f"{page.name} line {line}: {reason}")
