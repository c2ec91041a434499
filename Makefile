# fleetmq developer entry points. Everything is installed into .venv/ in the repo root.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CACHE ?= $(HOME)/.cache/fleetmq
LISTEN ?= 127.0.0.1:1883

.PHONY: run test lint bench deps venv clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python

# Python packages the tests need (the pipeline's Spark tests too), plus the project in editable mode.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test,pipeline,operator]'
	touch $@

deps: $(VENV)/.installed
	bash scripts/system-deps.sh

# The CustomResourceDefinitions in crds/, generated from the pydantic models (a test fails when stale).
.PHONY: crds
crds: $(VENV)/.installed
	$(BIN)/python -m fleetmq.operator.crdgen crds

run: $(VENV)/.installed
	$(BIN)/fleetmq-broker --listen $(LISTEN)

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

bench: deps
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
