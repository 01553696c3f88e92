"""Liveness of an asyncio service, told from outside its event loop.

The metrics endpoint is served from a thread, so it keeps answering while the event loop is
stuck (a handler that blocks it, a deadlock): a probe of `/metrics` cannot see that. The loop
beats a `Heartbeat` every second; the same thread serves `/livez`, which answers 503 when the
last beat is older than `max_age_s`. `/metrics` is served as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

BEAT_INTERVAL_S = 1.0
LIVEZ_PATH = "/livez"

StartResponse = Callable[..., Any]


class Heartbeat:
    """The last time the event loop ran a beat (monotonic seconds); read from any thread."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.last = clock()

    def beat(self) -> None:
        self.last = self._clock()

    def age_s(self) -> float:
        return max(self._clock() - self.last, 0.0)

    async def run(self, interval_s: float = BEAT_INTERVAL_S) -> None:
        """Beat until cancelled: a stuck loop stops beating, which is the point."""
        while True:
            self.beat()
            await asyncio.sleep(interval_s)


def health_app(
    heartbeat: Heartbeat, max_age_s: float, registry: CollectorRegistry = REGISTRY
) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    """WSGI: `/livez` from the heartbeat, anything else is the Prometheus exposition."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != LIVEZ_PATH:
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        age = heartbeat.age_s()
        alive = age <= max_age_s
        body = f"{'ok' if alive else 'stuck'}: event loop last beat {age:.1f}s ago\n".encode()
        status = "200 OK" if alive else "503 Service Unavailable"
        start_response(
            status,
            [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
        )
        return [body]

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds are not log lines."""


def start_health_server(
    port: int,
    heartbeat: Heartbeat,
    max_age_s: float,
    registry: CollectorRegistry = REGISTRY,
    host: str = "0.0.0.0",
) -> WSGIServer:
    """Serve `/metrics` and `/livez` on `port` from a daemon thread; returns the server
    (`server.server_port` is the bound port when `port` is 0)."""
    server = make_server(
        host,
        port,
        health_app(heartbeat, max_age_s, registry),
        ThreadingWSGIServer,
        handler_class=_QuietHandler,
    )
    thread = threading.Thread(target=server.serve_forever, name="splatq-health", daemon=True)
    thread.start()
    return server


@contextlib.asynccontextmanager
async def health_endpoint(
    port: int, max_age_s: float, registry: CollectorRegistry = REGISTRY
) -> AsyncIterator[Heartbeat]:
    """While open: the event loop beats, and `/metrics` + `/livez` are served on `port`
    (nothing is served when `port` is 0; the loop still beats)."""
    heartbeat = Heartbeat()
    server = start_health_server(port, heartbeat, max_age_s, registry) if port else None
    beating = asyncio.create_task(heartbeat.run(), name="heartbeat")
    try:
        yield heartbeat
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
        if server is not None:
            server.shutdown()
            server.server_close()
