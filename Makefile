# Everything a fresh machine needs goes through these targets: `make demo`, `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYSRC := scheduler_svc agent native_plugin

.PHONY: all venv plugin lint typecheck test test-python test-plugin demo openapi bench clean

all: venv plugin

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

plugin:
	$(MAKE) -C native_plugin

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy $(PYSRC) tests benchmarks

test-plugin:
	$(MAKE) -C native_plugin test

test-python: venv plugin
	bash scripts/ensure-postgres.sh
	$(BIN)/pytest -q

test: lint typecheck test-plugin test-python

demo: venv plugin
	$(BIN)/railover demo

openapi: venv
	$(BIN)/python -m scheduler_svc.openapi_dump openapi/openapi.json

bench: venv plugin
	$(BIN)/python benchmarks/run_all.py

clean:
	$(MAKE) -C native_plugin clean
	rm -rf build *.egg-info .pytest_cache .mypy_cache .ruff_cache
