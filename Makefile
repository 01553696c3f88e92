# splatq developer entry points. `make test` and `make up` work on a fresh clone: they create
# .venv, install, and make sure a redis-server binary exists before using it.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install redis-server promtool chromium test lint typecheck pytest up demo bench bench-gateway bench-gpu clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# dev pulls the worker extra: torch, pinned (2.13.0) in pyproject, the CPU wheel on these
	# machines' local disk. `pip install splatq` alone is the light client, CLI and gateway.
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

install: $(STAMP)

redis-server:
	@if command -v redis-server >/dev/null 2>&1; then \
	  true; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "redis-server missing: installing Debian's redis-server"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	else \
	  echo "ERROR: redis-server is not installed and this user cannot install it."; \
	  echo "Install Redis >= 7.0 (Debian/Ubuntu: sudo apt-get install redis-server) and retry."; \
	  exit 1; \
	fi

# promtool (Debian's prometheus package) runs the alert-rule unit tests; best effort: without
# it those tests skip, they do not fail.
promtool:
	@command -v promtool >/dev/null 2>&1 || { [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1 && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1; } || \
	  echo "promtool not installed: the alert-rule tests will skip"

# Debian's chromium drives the /docs page test (Playwright with executable_path: no browser
# download); best effort like promtool: without it that one test skips.
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1 && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; }; }; } || \
	  echo "chromium not installed: the /docs browser test will skip"

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy reads the code under its installed names (splatq.shared, splatq.services) through links.
typecheck: install
	@mkdir -p .typecheck/splatq && ln -sfn ../../shared .typecheck/splatq/shared && ln -sfn ../../services .typecheck/splatq/services
	$(VENV)/bin/mypy

pytest: install redis-server promtool chromium
	$(VENV)/bin/pytest -q

test: lint typecheck pytest

up: install redis-server
	$(VENV)/bin/splatq up

demo: install redis-server
	$(VENV)/bin/splatq demo

bench: install redis-server
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench.engine_throughput

bench-gateway: install redis-server
	@command -v wrk >/dev/null 2>&1 || { [ "$$(id -u)" = "0" ] && apt-get install -y -qq wrk >/dev/null; }
	$(PY) -m bench.gateway_submit

bench-gpu:
	bench/gpu_check.sh

clean:
	rm -rf $(VENV) var out .mypy_cache .ruff_cache .pytest_cache
