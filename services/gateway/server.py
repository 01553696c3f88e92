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

    A request's head is due `header_timeout_s` after its first byte (after the connection's
    start, for the first request): `_head_since` is when the bytes of a head still incomplete
    began to arrive, cleared as soon as the parser has a whole head. Past the deadline, a
    connection still waiting for that head gets a 408 and is closed; a request being
    answered, a body being drained and an idle keep-alive connection (no byte of a next
    request yet) are never cut. The check is one timer per connection, re-armed for the
    current head's own due time when it fires early (a per-request timer, armed and cancelled
    for every request, cost the gateway's busiest path a timer-heap push and a cancel)."""

    header_timeout_s: float = 0.0
    _deadline: asyncio.TimerHandle | None = None
    _head_since: float | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.header_timeout_s > 0:
            self._head_since = self._loop.time()
            self._deadline = self._loop.call_at(
                self._head_since + self.header_timeout_s, self._check_head
            )

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.header_timeout_s <= 0:
            return
        if not self._waiting_for_headers():
            self._head_since = None  # a whole head arrived (or a request is being handled)
        elif self._head_since is None:
            self._head_since = self._loop.time()
            if self._deadline is None:
                self._deadline = self._loop.call_at(
                    self._head_since + self.header_timeout_s, self._check_head
                )

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)

    def _waiting_for_headers(self) -> bool:
        # aiohttp's own test for "idle between requests" (`_process_keepalive`): the request
        # loop awaits this future until a whole request head has been parsed.
        waiter = getattr(self, "_waiter", None)
        return waiter is not None and not waiter.done()

    def _check_head(self) -> None:
        self._deadline = None
        since = self._head_since
        if since is None:
            return  # no head pending: the next first byte re-arms
        due = since + self.header_timeout_s
        if self._loop.time() < due:
            self._deadline = self._loop.call_at(due, self._check_head)
            return
        if not self._waiting_for_headers() or self.transport is None:
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
