# Everything a fresh machine needs goes through these targets: `make demo`, `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYSRC := scheduler_svc agent native_plugin railover_testing

.PHONY: all venv plugin lint typecheck test test-python test-plugin demo openapi bench clean tools deploy-check mutation

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

# Programs the deploy and status-page tests drive, from Debian: promtool and prometheus
# (package prometheus), chromium (driven by Playwright, which never downloads a browser).
# kubectl with its built-in kustomize comes with the machine; Debian's is too old.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
tools:
	@missing=""; \
	command -v promtool >/dev/null && command -v prometheus >/dev/null || missing="prometheus"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing from Debian"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi
	@command -v kubectl >/dev/null || { echo "kubectl 1.27+ (with kustomize) is needed for tests/deploy" >&2; exit 1; }

# Manifests, alert rules, dashboards and the status page in Chromium (also part of `make test`).
deploy-check: venv tools
	RAILOVER_REQUIRE_TOOLS=1 $(BIN)/pytest -q tests/deploy tests/web

test-python: venv plugin tools
	bash scripts/ensure-postgres.sh
	RAILOVER_REQUIRE_TOOLS=1 $(BIN)/pytest -q

test: lint typecheck test-plugin test-python

demo: venv plugin
	$(BIN)/railover demo

openapi: venv
	$(BIN)/python -m scheduler_svc.openapi_dump openapi/openapi.json

# Mutation testing, module by module, with one niced worker (not part of `make test`: slow).
# Results: benchmarks/RESULTS.md, "Test strength". `make mutation TARGETS="signing spool"`.
mutation: venv plugin
	bash scripts/ensure-postgres.sh
	$(BIN)/python scripts/mutation.py $(TARGETS)

bench: venv plugin
	PYTHONPATH=. $(BIN)/python benchmarks/run_all.py

clean:
	$(MAKE) -C native_plugin clean
	rm -rf build *.egg-info .pytest_cache .mypy_cache .ruff_cache
