"""The HTTP server around the gateway app: the runner that `serve` (and the tests) use, the
headers every answer carries, and the header deadline aiohttp lacks.

**Header deadline** (SPLATQ_HEADER_TIMEOUT_S). aiohttp waits for a request's headers as long as
its keep-alive timeout (75 s), counted from the connection's start or the previous answer,
however slowly they trickle in: a slow-loris client holds a connection (and a few KB) each
for that long. Here a request's headers must be complete within the deadline of its first
byte (of the connection's start, for the first request); past it the connection gets a 408
`request_timeout` problem and is closed. An idle keep-alive connection (no byte of a next
request yet) keeps aiohttp's own timeout. The body's deadline is the handlers'
(`submission.read_capped`, SPLATQ_BODY_TIMEOUT_S), as only they read it.

Every response names the server `splatq` (aiohttp's default named the Python and aiohttp
versions) and carries `X-Content-Type-Options: nosniff`: the app's own answers through its
`on_response_prepare` hook (`install_headers`), and the answers aiohttp makes before any
handler runs (a malformed request's 400) through the connection handler's `handle_error`.
An answer that carries a secret (a new API key, a webhook signing secret, any admin answer)
also says `Cache-Control: no-store` (`NO_STORE`), so no cache, shared or the client's own,
keeps a copy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict

from splatq.services.gateway.http_errors import parse_error_problem
from splatq.services.gateway.problems import ApiError, problem_bytes, problem_response

SERVER_NAME = "splatq"
NO_STORE = {"Cache-Control": "no-store"}


def stamp(headers: CIMultiDict[str]) -> None:
    """The headers every answer carries."""
    headers["Server"] = SERVER_NAME
    headers["X-Content-Type-Options"] = "nosniff"


async def _stamp_response(request: web.Request, response: web.StreamResponse) -> None:
    stamp(response.headers)


def install_headers(app: web.Application) -> None:
    app.on_response_prepare.append(_stamp_response)


def headers_timed_out(timeout_s: float) -> ApiError:
    return ApiError(
        408,
        "request_timeout",
        f"the request headers did not arrive within {timeout_s:g} s",
        {"Server": SERVER_NAME, "X-Content-Type-Options": "nosniff"},
    )


class GatewayRequestHandler(RequestHandler):
    """aiohttp's connection handler, with splatq's headers on the answers it makes itself and
    the header deadline (`header_timeout_s`, 0 = none; set by the server that makes it).

    The deadline is armed at the connection's start and by the first byte that arrives while
    no request is being handled (`request_started`/`request_finished`, called by the
    `track_requests` middleware), and disarmed when a request starts. When it fires it acts
    only if the connection is still waiting for a request's headers; a request being
    answered, or a body being drained, is never cut."""

    header_timeout_s: float = 0.0
    _deadline: asyncio.TimerHandle | None = None
    _handling: int = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and not self._handling:
            self._arm()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def request_started(self) -> None:
        self._handling += 1
        self._disarm()

    def request_finished(self) -> None:
        self._handling -= 1

    def _arm(self) -> None:
        if self.header_timeout_s > 0:
            loop = asyncio.get_running_loop()
            self._deadline = loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _waiting_for_headers(self) -> bool:
        # aiohttp's own test for "idle between requests" (`_process_keepalive`): the request
        # loop awaits this future until a whole request head has been parsed.
        waiter = getattr(self, "_waiter", None)
        return waiter is not None and not waiter.done()

    def _headers_too_slow(self) -> None:
        self._deadline = None
        if self._handling or not self._waiting_for_headers() or self.transport is None:
            return
        self.transport.write(problem_bytes(headers_timed_out(self.header_timeout_s)))
        self.force_close()  # closes the transport once the answer is written

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # The parent logs the error (and raises if a response was already under way); its
        # text/plain answer is replaced by the same status as problem+json.
        super().handle_error(request, status, exc, message)
        response = problem_response(parse_error_problem(status, message))
        response.force_close()
        stamp(response.headers)
        return response


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def track_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tell the connection a request is being handled (no header deadline meanwhile)."""
    protocol = request.protocol
    if not isinstance(protocol, GatewayRequestHandler):
        return await handler(request)
    protocol.request_started()
    try:
        return await handler(request)
    finally:
        protocol.request_finished()


class _GatewayServer(web.Server):
    """aiohttp's protocol factory, making `GatewayRequestHandler`s."""

    header_timeout_s: float = 0.0

    def __call__(self) -> RequestHandler:
        handler = GatewayRequestHandler(self, loop=self._loop, **self._kwargs)
        handler.header_timeout_s = self.header_timeout_s
        return handler


class GatewayRunner(web.AppRunner):
    """An AppRunner whose connections are served by `GatewayRequestHandler`, with headers
    due within `header_timeout_s` (0 = aiohttp's behaviour)."""

    def __init__(self, app: web.Application, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.header_timeout_s = header_timeout_s

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # The app's own factory, built by aiohttp (startup, freeze, handler arguments), with
        # only the handler class it makes swapped: `_GatewayServer` adds a setting, no state.
        server.__class__ = _GatewayServer
        assert isinstance(server, _GatewayServer)
        server.header_timeout_s = self.header_timeout_s
        return server
