# The two README commands: `make run` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench clean pg-server

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[spark,test]"
	touch $(STAMP)

run: $(STAMP)
	$(PY) jobs/dp_quantiles.py --config conf/goodreads.toml

test: $(STAMP) pg-server
	@echo "make test: about 15 minutes on an idle 2-core machine (24 min measured at load average 20): Spark, spark-submit and PostgreSQL ledger tests"
	$(PY) -m pytest -q tests

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

bench: $(STAMP)
	$(PY) benchmarks/bench_joint_exp.py

clean:
	rm -rf $(VENV) out
