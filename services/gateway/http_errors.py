"""problem+json for the errors aiohttp answers itself, before any handler or middleware runs.

A request the HTTP parser refuses (Content-Length with Transfer-Encoding, a malformed request
line or header, a header line too long) never reaches the application: aiohttp's protocol
answers it from `RequestHandler.handle_error` as text/plain. `ProblemAppRunner` serves the
app with a request handler whose `handle_error` answers the same status as
application/problem+json (`invalid_request`, or `internal_error` for a 500), so every error
the process sends is a problem a client can parse. The connection still closes, as before.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from splatq.services.gateway.problems import ApiError, problem_response

MAX_DETAIL = 200


def parse_error_problem(status: int, message: str | None) -> ApiError:
    """The problem for an error the HTTP layer found (pure)."""
    if status >= 500:
        return ApiError(status, "internal_error", "unexpected error")
    reason = " ".join((message or "").split())[:MAX_DETAIL]
    return ApiError(status, "invalid_request", f"malformed HTTP request: {reason or status}")


class _ProblemRequestHandler(RequestHandler):
    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # The parent logs the error and raises if a response was already under way.
        super().handle_error(request, status, exc, message)
        response = problem_response(parse_error_problem(status, message))
        response.force_close()
        return response


class _ProblemServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _ProblemRequestHandler(self, loop=self._loop, **self._kwargs)


class ProblemAppRunner(web.AppRunner):
    """`web.AppRunner` whose connections answer parser errors as problem+json."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _ProblemServer  # the same object, one method overridden
        return server
