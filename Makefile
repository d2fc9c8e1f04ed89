# The two README commands: `make run` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[spark,test]"
	touch $(STAMP)

run: $(STAMP)
	$(PY) jobs/dp_quantiles.py --config conf/goodreads.toml

test: $(STAMP)
	$(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) benchmarks/bench_joint_exp.py

clean:
	rm -rf $(VENV) out
