"""Schemathesis against /openapi.json: a real gateway process on loopback HTTP answers every
generated request with a documented status, content type, headers and body, and never a 5xx.
The last test is the whole of it as an integrator runs it: the `st` CLI with every check and
every phase, stateful included, bounded in time, with zero failures; the refusals no schema
can state are listed, each with its reason, in tests/gateway/schemathesis_hooks.py.

The gateway runs as `python -m splatq.services.gateway` (a subprocess on a free port, on the
session's redis-server): schemathesis calls are synchronous `requests`, so the server must
not share the test's event loop.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from splatq.services.gateway.openapi import openapi_document
from splatq.shared.redis.server import RedisServer, free_port
from splatq.shared.testing import eventually_sync
from tests.gateway.conftest import AUTH_A, KEY_A, KEY_B
from tests.gateway.corpus import valid_png
from tests.helpers import REPO_ROOT

START_TIMEOUT_S = 30.0
ADMIN_KEY = "schemathesis-admin-key-0123456789-abcdefXYZ"
DOC_BASE_URL = "http://127.0.0.1:8080"  # only `servers`; requests go to `gateway_url`
# Every call has a read timeout: a response that never ends (an SSE stream on a live job)
# fails its case instead of hanging the suite.
REQUEST_TIMEOUT_S = 10.0
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    ignored_auth,  # re-sends each authenticated 2xx without / with a bad key: must be 401
]


@pytest.fixture(scope="module")
def gateway_url(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A gateway subprocess on 127.0.0.1:<free port>; stopped after the module."""
    tmp = tmp_path_factory.mktemp("gateway")
    port = free_port()
    env = {
        **os.environ,
        "SPLATQ_REDIS_URL": redis_server.url,
        "SPLATQ_API_KEYS": f"acme:{KEY_A},beta:{KEY_B}",
        "SPLATQ_STORAGE_URL": f"file://{tmp / 'objects'}",
        "SPLATQ_DATA_DIR": str(tmp / "data"),
        "SPLATQ_GATEWAY_HOST": "127.0.0.1",
        "SPLATQ_GATEWAY_PORT": str(port),
        "SPLATQ_PUBLIC_URL": f"http://127.0.0.1:{port}",
        # Generated requests must reach the handlers, not the rate limiter.
        "SPLATQ_RATE_LIMIT_PER_S": "100000",
        "SPLATQ_RATE_LIMIT_BURST": "100000",
        "SPLATQ_LIST_RATE_LIMIT_PER_S": "100000",
        "SPLATQ_LIST_RATE_LIMIT_BURST": "100000",
        # Its auth checks send wrong keys on purpose, again and again: they must meet the 401
        # (the throttle's 429 is tested in tests/gateway/test_hardening.py).
        "SPLATQ_ADMIN_AUTH_FAILURES_PER_MIN": "1000000",
        "SPLATQ_ADMIN_AUTH_FAILURES_GLOBAL_PER_MIN": "1000000",
        "SPLATQ_LOG_LEVEL": "warning",
        "SPLATQ_ADMIN_API_KEY": ADMIN_KEY,  # tests/gateway/schemathesis.toml sends it
        # Generated `Prefer: wait` and `image_url` values must not hold a request for long:
        # no worker runs here, and no outside address answers.
        "SPLATQ_PREFER_WAIT_MAX_S": str(PREFER_WAIT_MAX_S),
        "SPLATQ_IMAGE_URL_TIMEOUT_S": "2",
    }
    url = f"http://127.0.0.1:{port}"
    log_path = tmp / "gateway.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "splatq.services.gateway"],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_ready(proc, url, log_path)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"gateway exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            return requests.get(f"{url}/readyz", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    eventually_sync(
        ready,
        START_TIMEOUT_S,
        0.1,
        message=lambda: f"gateway ready:\n{log_path.read_text()[-4000:]}",
    )


# The document the gateway serves, built by the same function with the same base URL (the
# first test pins that the served /openapi.json is exactly this). Loading it at import time
# lets `schema.parametrize()` make one test per operation; `schemathesis.pytest.from_fixture`
# (which would load it from the running server) fails on pytest 9.2 in schemathesis 4.32.5:
# its lazy runner writes `Function._nodeid`, which pytest 9.2 no longer has.
PREFER_WAIT_MAX_S = 1
schema = schemathesis.openapi.from_dict(openapi_document(DOC_BASE_URL, PREFER_WAIT_MAX_S))


def test_served_document_is_the_one_under_test(gateway_url: str) -> None:
    """GET /openapi.json serves exactly the document the operations below are generated from."""
    resp = requests.get(f"{gateway_url}/openapi.json", timeout=REQUEST_TIMEOUT_S)
    assert resp.status_code == 200
    served = resp.json()
    assert served["servers"] == [{"url": gateway_url}]
    assert {**served, "servers": schema.raw_schema["servers"]} == schema.raw_schema


# Reproducible (derandomized) and bounded: 25 fuzzed cases per operation, plus the
# deterministic examples/coverage cases schemathesis derives from the schema.
FUZZ_SETTINGS = settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@schema.parametrize()
@FUZZ_SETTINGS
def test_every_operation_conforms_to_the_openapi_document(
    case: schemathesis.Case[Any], gateway_url: str
) -> None:
    """Every generated request gets a documented status/content type/body and never a 5xx."""
    case.call_and_validate(
        base_url=gateway_url, headers=dict(AUTH_A), checks=CHECKS, timeout=REQUEST_TIMEOUT_S
    )


@pytest.fixture(scope="module")
def acme_job_id(gateway_url: str) -> str:
    """A real (queued; nothing consumes it) job of tenant acme."""
    resp = requests.post(
        f"{gateway_url}/v1/jobs",
        headers=AUTH_A,
        files={"image": ("scene.png", valid_png(16, 16), "image/png")},
        timeout=REQUEST_TIMEOUT_S,
    )
    assert resp.status_code == 202, resp.text
    job_id: str = resp.json()["id"]
    return job_id


# Generated job ids never name a real job, so the operations above only ever see 401/404.
# Here every generated case is aimed at a real job instead: GET answers the Job, the first
# cancel 202 and later ones 409, artifacts 409 not_ready. The events stream is left out: on a
# real job it stays open by design (a Last-Event-ID after the newest event waits for more).
@schema.include(operation_id=["getJob", "cancelJob", "getArtifact"]).parametrize()
@settings(FUZZ_SETTINGS, max_examples=10)
def test_operations_on_an_existing_job_conform_to_the_openapi_document(
    case: schemathesis.Case[Any], gateway_url: str, acme_job_id: str
) -> None:
    """Generated requests on a real job get documented statuses, content types and bodies."""
    assert case.path_parameters is not None
    case.path_parameters["job_id"] = acme_job_id
    case.call_and_validate(
        base_url=gateway_url, headers=dict(AUTH_A), checks=CHECKS, timeout=REQUEST_TIMEOUT_S
    )


def test_events_of_an_unknown_job_answer_404_problem_at_once(gateway_url: str) -> None:
    """The SSE route answers an unknown (well-formed) job id with a 404 problem, not a stream."""
    started = time.monotonic()
    resp = requests.get(
        f"{gateway_url}/v1/jobs/job_000{'0' * 26}/events", headers=AUTH_A, timeout=5
    )
    assert time.monotonic() - started < 2
    assert resp.status_code == 404
    assert resp.headers["Content-Type"].startswith("application/problem+json")
    assert resp.json()["code"] == "not_found"


@pytest.fixture(scope="module")
def acme_endpoint_id(gateway_url: str) -> str:
    """A real webhook endpoint of tenant acme (a public address literal: no DNS lookup)."""
    resp = requests.post(
        f"{gateway_url}/v1/webhook-endpoints",
        headers=AUTH_A,
        json={"url": "https://93.184.216.34/hooks", "events": ["3d_reconstruction.completed"]},
        timeout=REQUEST_TIMEOUT_S,
    )
    assert resp.status_code == 201, resp.text
    endpoint_id: str = resp.json()["id"]
    return endpoint_id


# As above for webhook endpoints: generated cases aimed at a real endpoint (show, change,
# rotate, recover). Deleting it is left out so that every case finds it.
@schema.include(
    operation_id=[
        "getWebhookEndpoint",
        "updateWebhookEndpoint",
        "rotateWebhookEndpointSecret",
        "recoverWebhookEndpoint",
        "testWebhookEndpoint",
        "listWebhookEndpointAttempts",
    ]
).parametrize()
@settings(FUZZ_SETTINGS, max_examples=15)
def test_operations_on_an_existing_endpoint_conform_to_the_openapi_document(
    case: schemathesis.Case[Any], gateway_url: str, acme_endpoint_id: str
) -> None:
    """Generated requests on a real endpoint get documented statuses, types and bodies."""
    assert case.path_parameters is not None
    case.path_parameters["endpoint_id"] = acme_endpoint_id
    case.call_and_validate(
        base_url=gateway_url, headers=dict(AUTH_A), checks=CHECKS, timeout=REQUEST_TIMEOUT_S
    )


# The full run: time-bounded (each phase stops when the budget is spent) on a shared 2-core
# machine; the seed makes the generated cases repeatable where the budget allows.
FULL_RUN_MAX_TIME_S = 100  # CI's time: the whole suite stays under 20 minutes
FULL_RUN_CONFIG = Path(__file__).with_name("schemathesis.toml")
PHASES = ("Examples", "Coverage", "Fuzzing", "Stateful")


@pytest.mark.timeout(FULL_RUN_MAX_TIME_S + 330)  # past the subprocess' own timeout
def test_all_checks_and_the_stateful_phase_find_nothing(gateway_url: str) -> None:
    """`st run --checks all` with every phase against the live gateway: zero failures and
    zero errors. Runs last: its admin calls change tenants' quotas and keys."""
    st = Path(sys.executable).with_name("st")
    command = [
        str(st), "--config-file", str(FULL_RUN_CONFIG), "run", f"{gateway_url}/openapi.json",
        "-H", f"Authorization: Bearer {KEY_A}",
        "--checks", "all",
        # Replaced by their wrappers in schemathesis_hooks.py (the same checks, less the
        # documented refusals listed there with their reasons).
        "--exclude-checks", "positive_data_acceptance,ensure_resource_availability",
        "--phases", "examples,coverage,fuzzing,stateful",
        "--max-time", str(FULL_RUN_MAX_TIME_S), "--max-examples", "20", "--seed", "28",
        "--request-timeout", str(REQUEST_TIMEOUT_S), "--workers", "1",
        "--suppress-health-check", "all",
    ]  # fmt: skip
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.gateway.schemathesis_hooks",
        "PYTHONPATH": str(REPO_ROOT),
        "NO_COLOR": "1",
    }
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False,
        timeout=FULL_RUN_MAX_TIME_S + 300,
    )  # fmt: skip
    output = done.stdout + done.stderr
    # The failures first (the warnings and summary after them are long).
    assert done.returncode == 0, output[output.find("= FAILURES =") :][:30_000] or output
    for phase in PHASES:
        assert f"✅ {phase}" in output, output[-30_000:]
    assert "Stateful" in output
