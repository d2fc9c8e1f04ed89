# The two README commands: `make run` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The second test target: the Spark and job tests on the newest pyspark 3.5.x in its own venv.
VENV35 ?= .venv35
PY35 := $(VENV35)/bin/python
STAMP35 := $(VENV35)/.installed
SPARK35_TESTS ?= tests/spark tests/jobs tests/test_readme_snippets.py

.PHONY: run test test-spark35 bench clean

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
test: $(STAMP)
	@echo "make test: pyspark 4.x, all tests (about 4 minutes on 2 idle cores)"
	$(PY) -m pytest -q tests || [ $$? -eq 5 ]

test-spark35: $(STAMP35)
	@echo "make test-spark35: pyspark 3.5, Spark and job tests (about N minutes on 2 idle cores)"
	$(PY35) -m pytest -q $(SPARK35_TESTS) || [ $$? -eq 5 ]

bench: $(STAMP)
	$(PY) benchmarks/bench_joint_exp.py

clean:
	rm -rf $(VENV) $(VENV35) out
