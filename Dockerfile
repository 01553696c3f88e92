# syntax=docker/dockerfile:1
# One image for every splatq service: `splatq gateway|worker|dispatcher|redriver|settler`
# (k8s/ and compose.yaml run them all from it). `make image` builds the CPU variant,
# `make image-cuda` the CUDA one (k8s/overlays/gpu), both from this file:
#
#   CPU:  BASE_IMAGE=python:3.11-slim-bookworm, torch from the PyTorch CPU wheel index
#   CUDA: BASE_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04 (its Python 3.12 from the
#         distribution), TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126
#
# The container runs as UID/GID 10001 (the manifests' runAsUser) with a read-only root
# filesystem: nothing is written outside /tmp (HOME and XDG_CACHE_HOME point there; mount a
# tmpfs or an emptyDir on it), and bytecode is compiled at build time.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# --- python: the base, plus a Python 3.11+ with venv where the base has none (CUDA) -------------
FROM ${BASE_IMAGE} AS python
SHELL ["/bin/sh", "-eu", "-c"]
# The distribution's current python3 (a base image's, not pinned: its security updates should
# land with each rebuild).
# hadolint ignore=DL3008
RUN if ! command -v python3 >/dev/null 2>&1; then \
        apt-get update; \
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            python3 python3-venv ca-certificates; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    groupadd --system --gid 10001 splatq; \
    useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin splatq

# --- build: a virtual environment in /opt/splatq with torch, then splatq[worker] ---------------
FROM python AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# = the `worker` extra's pin in pyproject.toml (tests/deploy checks they agree)
ARG TORCH_VERSION=2.13.0
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
COPY docker/install.sh /src/docker/install.sh
RUN TORCH_INDEX_URL="${TORCH_INDEX_URL}" TORCH_VERSION="${TORCH_VERSION}" \
    sh /src/docker/install.sh /opt/splatq
# Only what .dockerignore lets through: the package sources, pyproject.toml, README, LICENSE.
COPY pyproject.toml README.md LICENSE /src/
COPY shared /src/shared
COPY services /src/services
RUN sh /src/docker/install.sh /opt/splatq /src

# --- runtime ----------------------------------------------------------------------------------
FROM python AS runtime
ARG SPLATQ_VERSION=0.1.0
ARG VCS_REF=unknown
ARG VARIANT=cpu
LABEL org.opencontainers.image.title="splatq" \
      org.opencontainers.image.description="Asynchronous image-to-3D-Gaussian-Splatting job system: gateway, workers, webhook dispatcher, redriver and quota settler" \
      org.opencontainers.image.source="https://github.com/splatq/splatq" \
      org.opencontainers.image.url="https://github.com/splatq/splatq" \
      org.opencontainers.image.documentation="https://github.com/splatq/splatq/tree/main/docs" \
      org.opencontainers.image.version="${SPLATQ_VERSION}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.splatq.image.variant="${VARIANT}"
COPY --from=build /opt/splatq /opt/splatq
ENV PATH=/opt/splatq/bin:${PATH} \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SPLATQ_LOG_FORMAT=json
WORKDIR /tmp
USER 10001:10001
# The gateway's port (SPLATQ_GATEWAY_PORT) and the metrics/liveness port of the other services
# (SPLATQ_METRICS_PORT, off unless set).
EXPOSE 8080 9100
ENTRYPOINT ["splatq"]
CMD ["--help"]
