"""The admin API's hardening over real loopback HTTP on a real Redis: failed authentications
are throttled per client address and in all (429 with Retry-After, even for the right key
while throttled), a weak admin key keeps the gateway from starting, and the admin API can
have a listener of its own (the public one then answers 404 for it)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from splatq.services.cli import main as cli
from splatq.shared.redis.server import free_port
from splatq.shared.settings import Settings, SettingsError
from tests.gateway.conftest import ADMIN, ADMIN_KEY, AUTH_A, ClientFactory
from tests.gateway.test_api import problem

Client = TestClient[Any, Any]
WRONG = {"Authorization": "Bearer not-the-admin-key-but-long-enough-0123456789"}


@pytest.fixture
async def other_address() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session whose connections come from 127.0.0.2 (another client address)."""
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with aiohttp.ClientSession(connector=connector) as session:
        yield session


async def test_failed_admin_auth_is_throttled_per_client_address(
    make_client: ClientFactory, other_address: aiohttp.ClientSession
) -> None:
    client = await make_client(
        admin_api_key=ADMIN_KEY,
        admin_auth_failures_per_min=5,
        admin_auth_failures_global_per_min=1000,
    )
    for _ in range(5):
        await problem(await client.get("/v1/admin/tenants", headers=WRONG), 401, "unauthorized")
    refused = await client.get("/v1/admin/tenants", headers=WRONG)
    await problem(refused, 429, "too_many_auth_failures")
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    # While throttled no key is even compared: the right one is refused the same way.
    await problem(
        await client.get("/v1/admin/tenants", headers=ADMIN), 429, "too_many_auth_failures"
    )
    # A tenant's key is a failure too; tenants themselves are not affected.
    assert (await client.get("/v1/usage", headers=AUTH_A)).status == 200
    # Another client address still gets in.
    url = client.make_url("/v1/admin/tenants")
    async with other_address.get(url, headers=ADMIN) as resp:
        assert resp.status == 200, await resp.text()


async def test_failed_admin_auth_is_throttled_in_all(
    make_client: ClientFactory, other_address: aiohttp.ClientSession
) -> None:
    client = await make_client(
        admin_api_key=ADMIN_KEY,
        admin_auth_failures_per_min=1000,
        admin_auth_failures_global_per_min=3,
    )
    for _ in range(3):
        await problem(await client.get("/v1/admin/tenants", headers=WRONG), 401, "unauthorized")
    async with other_address.get(client.make_url("/v1/admin/tenants"), headers=WRONG) as resp:
        assert resp.status == 429
        assert (await resp.json(content_type=None))["code"] == "too_many_auth_failures"
        assert int(resp.headers["Retry-After"]) >= 1


@pytest.mark.parametrize(
    "key",
    [
        "x",
        "admin-secret-key",  # 16 characters
        "a" * 40,  # long, one character
        "0123456789abcdef0123456789abcdef 0",  # a space
    ],
)
def test_a_weak_admin_key_is_refused(key: str) -> None:
    with pytest.raises(SettingsError, match="SPLATQ_ADMIN_API_KEY is too weak") as caught:
        Settings.from_env({"SPLATQ_ADMIN_API_KEY": key})
    assert key not in str(caught.value)
    assert Settings.from_env({"SPLATQ_ADMIN_API_KEY": ADMIN_KEY}).admin_api_key == ADMIN_KEY


def test_the_gateway_does_not_start_with_a_weak_admin_key() -> None:
    """`splatq gateway` exits at once with the configuration error, naming the rule (and
    not the key)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLATQ_")}
    env.update(SPLATQ_ADMIN_API_KEY="admin", SPLATQ_GATEWAY_PORT=str(free_port()))
    done = subprocess.run(
        [sys.executable, "-m", "splatq.services.cli", "gateway"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == cli.EXIT_CONFIG, done.stderr[-2000:]
    assert "SPLATQ_ADMIN_API_KEY is too weak" in done.stderr
    assert "at least 32" in done.stderr


async def test_the_admin_api_on_a_listener_of_its_own(make_client: ClientFactory) -> None:
    port = free_port()
    client = await make_client(admin_api_key=ADMIN_KEY, admin_port=port)
    assert client.server.runner is not None
    site = web.TCPSite(client.server.runner, "127.0.0.1", port)
    await site.start()
    # The public listener serves no admin path, whatever the key: a plain 404.
    await problem(await client.get("/v1/admin/tenants", headers=ADMIN), 404, "not_found")
    await problem(await client.post("/v1/admin/tenants", headers=ADMIN), 404, "not_found")
    assert (await client.get("/v1/usage", headers=AUTH_A)).status == 200
    async with aiohttp.ClientSession() as http:
        admin = f"http://127.0.0.1:{port}"
        async with http.get(f"{admin}/v1/admin/tenants", headers=ADMIN) as resp:
            assert resp.status == 200, await resp.text()
        async with http.get(f"{admin}/healthz") as resp:
            assert resp.status == 200
        # ... and the admin listener nothing else.
        for path in ("/v1/usage", "/v1/jobs", "/openapi.json", "/metrics"):
            async with http.get(f"{admin}{path}", headers=AUTH_A) as resp:
                assert resp.status == 404, path
