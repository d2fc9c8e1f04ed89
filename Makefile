# The two README commands: `make run` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The second test target: the Spark and job tests on the newest pyspark 3.5.x in its own venv.
VENV35 ?= .venv35
PY35 := $(VENV35)/bin/python
STAMP35 := $(VENV35)/.installed
SPARK35_TESTS ?= tests/spark tests/pipeline tests/docs/test_readme_snippets.py

.PHONY: run test test-spark35 bench docs clean pg-server

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[spark,test]"
	touch $(STAMP)

run: $(STAMP)
	$(PY) jobs/dp_quantiles.py --config conf/goodreads.toml

$(STAMP35): pyproject.toml
	$(PYTHON) -m venv $(VENV35)
	$(PY35) -m pip install --quiet --upgrade pip
	$(PY35) -m pip install --quiet -e ".[spark35,test]"
	touch $(STAMP35)

# pytest exits 5 when it collected no test; that is not a failure of the code.
# Two xdist workers: one runs every test that starts a JVM, in order, the other the numpy-only
# core tests (tests/conftest.py); TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
test: $(STAMP) pg-server
	@echo "make test: pyspark 4.x, all tests (about 12-16 minutes on 2 idle cores)"
	$(PY) -m pytest -q -n $(TEST_WORKERS) tests || [ $$? -eq 5 ]

test-spark35: $(STAMP35) pg-server
	@echo "make test-spark35: pyspark 3.5, Spark and job tests, Arrow conversions $${DPQ_TEST_ARROW:-true} (about 8-9 minutes on 2 idle cores)"
	$(PY35) -m pytest -q $(SPARK35_TESTS) || [ $$? -eq 5 ]

# The ledger tests start their own PostgreSQL server (127.0.0.1, ephemeral port, temp data dir,
# run as the `postgres` user when root) from the distribution's server binaries; install them
# here when missing (root with apt-get, as on CI). Without them the PostgreSQL tests fail loudly.
pg-server:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || \
	{ if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing the PostgreSQL server for the ledger tests (apt-get install postgresql)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q --no-install-recommends postgresql >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends postgresql >/dev/null; }; \
	  else echo "make test needs PostgreSQL server binaries: apt-get install postgresql (as root)" >&2; exit 1; fi; }

# The docs site, built strictly (a warning fails it) into site/; `make test` builds it too.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(PY) benchmarks/bench_joint_exp.py

clean:
	rm -rf $(VENV) $(VENV35) out site
