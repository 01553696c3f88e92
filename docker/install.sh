#!/bin/sh
# The image's install step (Dockerfile, build stage), kept in one script so that
# tests/deploy/test_image.py runs exactly this on a clean copy of the build context.
#
#   docker/install.sh VENV            create the virtual environment VENV and, when
#                                     TORCH_INDEX_URL is set, install torch from that index
#   docker/install.sh VENV CONTEXT    install splatq with the `worker` extra from the
#                                     build context CONTEXT into VENV
#
# Two steps so the layer with torch (GBs for a CUDA build) stays cached while the code
# changes. The `worker` extra pins torch==TORCH_VERSION: the wheel installed first from
# TORCH_INDEX_URL (CPU or a CUDA build, e.g. 2.13.0+cu126) satisfies that pin, so pip keeps
# it instead of pulling PyPI's default build.
set -eu

venv=$1
if [ $# -eq 1 ]; then
    python3 -m venv "$venv"
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        "$venv/bin/pip" install --no-cache-dir --index-url "$TORCH_INDEX_URL" \
            "torch==${TORCH_VERSION:?TORCH_VERSION must be set with TORCH_INDEX_URL}"
    fi
    exit 0
fi

context=$2
"$venv/bin/pip" install --no-cache-dir "${context}[worker]"
# Fail the build, not the first pod, if the console script or a service does not import.
"$venv/bin/splatq" --version
"$venv/bin/python" -c "import splatq.services.gateway.app, splatq.services.webhook_dispatcher.dispatcher, splatq.services.dlq_redriver.service, splatq.services.quota_settler.settler, splatq.shared.engine.stage_runner"
