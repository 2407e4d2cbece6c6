# Everything a fresh machine needs goes through these targets: `make demo`, `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# One stamp per install: the runtime alone (`make demo`), then the dev extras (`make test`).
STAMP_RUNTIME := $(VENV)/.installed-runtime
STAMP := $(VENV)/.installed-dev
PYSRC := scheduler_svc agent native_plugin railover_testing
# Some machines' environments set PYTHONDONTWRITEBYTECODE=1 (these VMs do): then every Python
# process compiles the package's own modules from source again, 0.6-0.9 s of each start of
# the service, an agent or the CLI here (the suite starts hundreds), and pytest rewrites every
# test module in every worker. Writing bytecode is Python's default; the targets keep it.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: all venv venv-runtime plugin lint typecheck test test-python test-plugin demo openapi bench clean tools deploy-check image image-name image-test mutation

all: venv plugin

$(STAMP_RUNTIME): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $(STAMP_RUNTIME)

$(STAMP): $(STAMP_RUNTIME)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)
venv-runtime: $(STAMP_RUNTIME)

plugin:
	$(MAKE) -C native_plugin

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy $(PYSRC) tests benchmarks

test-plugin:
	$(MAKE) -C native_plugin test

# Programs the deploy, status-page, image and Slurm tests drive, from Debian: promtool and
# prometheus (package prometheus), chromium (driven by Playwright, which never downloads a
# browser), podman + runc + debootstrap (tests/image), slurm-wlm + munge (tests/slurm).
# kubectl with its built-in kustomize comes with the machine; Debian's is too old.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
tools:
	@missing=""; \
	command -v promtool >/dev/null && command -v prometheus >/dev/null || missing="prometheus"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v podman >/dev/null || missing="$$missing podman"; \
	command -v runc >/dev/null || missing="$$missing runc"; \
	command -v debootstrap >/dev/null || missing="$$missing debootstrap"; \
	command -v slurmctld >/dev/null && command -v slurmd >/dev/null || missing="$$missing slurm-wlm"; \
	command -v munged >/dev/null || missing="$$missing munge"; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing from Debian"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi
	@command -v kubectl >/dev/null || { echo "kubectl 1.27+ (with kustomize) is needed for tests/deploy" >&2; exit 1; }

# Manifests, alert rules, dashboards and the status page in Chromium (also part of `make test`).
deploy-check: venv tools
	RAILOVER_REQUIRE_TOOLS=1 $(BIN)/pytest -q tests/deploy tests/web

# The suite on TEST_WORKERS processes; a test file stays on one worker, so module
# fixtures (the throw-away Slurm cluster, one service per module) are made once. Files
# are handed out in collection order, the costliest first (tests/conftest.py, SLOW_FIRST).
TEST_WORKERS ?= 2
test-python: venv plugin tools
	bash scripts/ensure-postgres.sh
	RAILOVER_REQUIRE_TOOLS=1 $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		--durations=15

test: lint typecheck test-plugin test-python

# One OCI image with both programs and the plugin (deploy/image/Containerfile), built with
# podman; its tag is the package version, which the kustomize base names (tests/deploy).
# BASE=docker.io/library/python:3.11-slim where a registry is reachable; without BASE a
# minimal Debian base is made once with debootstrap. WHEELS=1: no PyPI inside the build.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= railover:$(VERSION)
image-name:
	@echo $(IMAGE)

image: tools
	IMAGE=$(IMAGE) BASE=$(BASE) WHEELS=$(WHEELS) bash deploy/image/build.sh

# Build the image, then run its tests (under `make test` they run only when it is built).
image-test: venv image
	RAILOVER_REQUIRE_TOOLS=1 RAILOVER_IMAGE=$(IMAGE) RAILOVER_IMAGE_REQUIRED=1 \
		$(BIN)/pytest -q tests/image

# Light: the runtime dependencies only (no torch, playwright or test tools).
# The demo is built from the test support (railover_testing/), so it runs from the checkout.
demo: venv-runtime plugin
	$(BIN)/python -m railover_testing.demo

openapi: venv
	$(BIN)/python -m scheduler_svc.api.openapi_dump openapi/openapi.json

# Mutation testing, module by module, niced (not part of `make test`: slow). Results:
# benchmarks/RESULTS.md, "Test strength". `make mutation TARGETS="signing spool"`; on a
# machine of your own, `MUTATION_WORKERS=2` tests two mutants at a time.
MUTATION_WORKERS ?= 1
mutation: venv plugin
	bash scripts/ensure-postgres.sh
	$(BIN)/python scripts/mutation.py --workers $(MUTATION_WORKERS) $(TARGETS)

bench: venv plugin
	$(BIN)/python -m benchmarks.run_all

clean:
	$(MAKE) -C native_plugin clean
	rm -rf build *.egg-info .pytest_cache .mypy_cache .ruff_cache
