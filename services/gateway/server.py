"""The HTTP server around the gateway app: the runner that `serve` (and the tests) use, and the
headers every answer carries.

Every response names the server `splatq` (aiohttp's default named the Python and aiohttp
versions) and carries `X-Content-Type-Options: nosniff`: the app's own answers through its
`on_response_prepare` hook (`install_headers`), and the answers aiohttp makes before any
handler runs (a malformed request's 400) through the connection handler's `handle_error`.
An answer that carries a secret (a new API key, a webhook signing secret, any admin answer)
also says `Cache-Control: no-store` (`NO_STORE`), so no cache, shared or the client's own,
keeps a copy.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict

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


class GatewayRequestHandler(RequestHandler):
    """aiohttp's connection handler, with splatq's headers on the answers it makes itself."""

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        response = super().handle_error(request, status, exc, message)
        stamp(response.headers)
        return response


class _GatewayServer(web.Server):
    """aiohttp's protocol factory, making `GatewayRequestHandler`s."""

    def __call__(self) -> RequestHandler:
        return GatewayRequestHandler(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """An AppRunner whose connections are served by `GatewayRequestHandler`."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # The app's own factory, built by aiohttp (startup, freeze, handler arguments), with
        # only the handler class it makes swapped: `_GatewayServer` adds no state.
        server.__class__ = _GatewayServer
        return server
