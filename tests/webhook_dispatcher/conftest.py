"""Fixtures: loopback webhook receivers and in-process dispatchers on the test's Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from splatq.services.webhook_dispatcher.dispatcher import Dispatcher
from splatq.services.webhook_dispatcher.metrics import DispatcherMetrics
from splatq.shared.engine.queue import JobQueue
from splatq.shared.settings import Settings
from splatq.shared.testing import eventually, finish_or_cancel
from tests.system.conftest import spawn_service  # noqa: F401 - dispatcher processes


@dataclass
class Receiver:
    """A loopback HTTP receiver answering from a script of (status, headers, delay_s)."""

    script: list[tuple[int, dict[str, str], float]] = field(default_factory=list)
    calls: list[tuple[float, dict[str, str], bytes]] = field(default_factory=list)
    url: str = ""
    # The answer once the script is used up (tests flip it to make a receiver fail or heal).
    default_status: int = 200
    wall_times_ms: list[int] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.calls.append((time.monotonic(), dict(request.headers), body))
        self.wall_times_ms.append(int(time.time() * 1000))
        default = (self.default_status, {}, 0.0)
        status, headers, delay = self.script.pop(0) if self.script else default
        if delay:
            await asyncio.sleep(delay)
        return web.Response(status=status, headers=headers, text="ok")

    async def wait_for_calls(self, n: int, timeout_s: float = 15.0) -> None:
        """Until the receiver has been called at least `n` times."""

        async def reached() -> bool:
            return len(self.calls) >= n

        await eventually(reached, timeout=timeout_s)


ReceiverFactory = Callable[..., Awaitable[Receiver]]


@dataclass
class TimedReceiver:
    """An aiohttp handler answering 204 after `delay_s`, recording when each request arrived
    and was answered, and the most requests it had in flight at once."""

    delay_s: float = 0.0
    arrived: list[float] = field(default_factory=list)
    answered: list[float] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.arrived.append(time.monotonic())
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
            self.answered.append(time.monotonic())
        return web.Response(status=204)


@pytest.fixture
async def receivers() -> AsyncIterator[ReceiverFactory]:
    servers: list[TestServer] = []

    async def make(
        *script: tuple[int, dict[str, str], float], default_status: int = 200
    ) -> Receiver:
        r = Receiver(list(script), default_status=default_status)
        app = web.Application()
        app.router.add_post("/hook", r.handle)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        r.url = str(server.make_url("/hook"))
        return r

    yield make
    for s in servers:
        await s.close()


def dispatcher_settings(settings: Settings, **kw: Any) -> Settings:
    base: dict[str, Any] = {
        "webhook_allow_private": True, "webhook_retry_base_ms": 20,
        "webhook_retry_cap_ms": 200, "webhook_max_attempts": 5, "webhook_timeout_s": 3.0,
    }  # fmt: skip
    return settings.with_overrides(**{**base, **kw})


@pytest.fixture
async def start_dispatcher(redis: Redis) -> AsyncIterator[Callable[[Settings], Dispatcher]]:
    running: list[tuple[Dispatcher, asyncio.Task[None]]] = []

    def start(settings: Settings) -> Dispatcher:
        d = Dispatcher(
            JobQueue(redis, settings), metrics=DispatcherMetrics.create(CollectorRegistry())
        )
        running.append((d, asyncio.create_task(d.run())))
        return d

    yield start
    for d, _ in running:
        d.stop()
    for _, t in running:
        await finish_or_cancel(t)
