"""Fixtures: the real gateway app over loopback HTTP (aiohttp TestServer), on the session's
redis-server, with local storage and its own metrics registry."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from splatq.services.gateway.app import create_app
from splatq.services.gateway.appkeys import SETTINGS
from splatq.services.gateway.server import GatewayRunner
from splatq.shared.settings import Settings
from splatq.shared.storage.store import LocalFileStorage

KEY_A, KEY_B = "key-acme", "key-beta"
AUTH_A = {"Authorization": f"Bearer {KEY_A}"}
AUTH_B = {"Authorization": f"Bearer {KEY_B}"}
# The admin API's key in tests: as strong as the gateway insists on (>= 32 varied characters).
ADMIN_KEY = "admin-test-key-0123456789abcdefghijklmnop"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}

ClientFactory = Callable[..., Awaitable[TestClient[Any, Any]]]


class GatewayTestServer(TestServer):
    """aiohttp's TestServer on the gateway's own runner (what `splatq gateway` serves with)."""

    async def _make_runner(self, **kwargs: Any) -> GatewayRunner:
        timeout_s = self.app[SETTINGS].header_timeout_s
        return GatewayRunner(self.app, header_timeout_s=timeout_s, **kwargs)


@pytest.fixture
async def make_client(
    settings: Settings, storage: LocalFileStorage, redis: Redis
) -> AsyncIterator[ClientFactory]:
    """Start a gateway with settings overrides; every one is closed after the test."""
    clients: list[TestClient[Any, Any]] = []

    async def make(**overrides: Any) -> TestClient[Any, Any]:
        defaults: dict[str, Any] = {
            "api_keys": {KEY_A: "acme", KEY_B: "beta"},
            "max_upload_bytes": 2 * 1024 * 1024,
            "rate_limit_per_s": 1000.0,
            "rate_limit_burst": 1000,
            "list_rate_limit_per_s": 1000.0,
            "list_rate_limit_burst": 1000,
            "public_url": "http://gateway.test",
            "admin_api_key": ADMIN_KEY,
        }
        s = settings.with_overrides(**{**defaults, **overrides})
        app = create_app(s, storage=storage, registry=CollectorRegistry())
        client = TestClient(GatewayTestServer(app))
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for c in clients:
        await c.close()


@pytest.fixture
async def client(make_client: ClientFactory) -> TestClient[Any, Any]:
    return await make_client()
