# Quick start: `make demo` runs the balance demo, measured on local Spark; `make test` runs the suite.
# Both create .venv and install what they need (Python 3.11+, Java 17). `make test` also
# runs the Connect-marked tests on a Spark Connect session and checks the built wheel.
# `make test` leaves the long crash, sweep and soak runs (tests/long_tests.txt, marked `long`)
# to `make test-long`; CI (.ci/run) runs both, the long tier after the main suite.
# `make test-fast` runs only the tests that need no Spark and take no seconds each
# (-m "not spark and not slow": tests/conftest.py marks the others), on the same xdist
# workers, in under two minutes; a test in it that starts a JVM fails.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# the demo needs only the package and PySpark; the suite also needs the test and bench extras
DEMO   := $(VENV)/.installed-demo
# pytest-xdist workers of the classic suite, whole test files each (0: one process). Each
# worker is a test session with its own local[2] SparkSession; a Spark test waits on the JVM
# and on Python workers for a third of its time, which the other worker fills.
TEST_WORKERS ?= 2
XDIST  := $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile)

.PHONY: demo test test-long test-fast typecheck wheel-check jar bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(DEMO): setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[spark]"
	touch $(DEMO)

$(STAMP): setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[spark,test,bench]"
	touch $(STAMP) $(DEMO)

demo: $(DEMO)
	$(BIN)/trilink-spark balance --measure

typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP) typecheck
	$(BIN)/python -m pytest -q -m "not long" $(XDIST)
	TRILINK_TEST_SESSION=connect $(BIN)/python -m pytest -q -m connect
	$(BIN)/python tools/check_wheel.py

test-long: $(STAMP)
	$(BIN)/python -m pytest -q -m long $(XDIST)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not spark and not slow" $(XDIST)

jar: $(STAMP)
	$(BIN)/python tools/build_jar.py

wheel-check: $(STAMP)
	$(BIN)/python tools/check_wheel.py

bench: $(STAMP)
	$(BIN)/python benches/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .hypothesis
