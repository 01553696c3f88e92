"""problem+json for the errors aiohttp answers itself, before any handler or middleware runs.

A request the HTTP parser refuses (Content-Length with Transfer-Encoding, a malformed request
line or header, a header line too long) never reaches the application: aiohttp's protocol
answers it from `RequestHandler.handle_error` as text/plain. The gateway's connection handler
(`server.GatewayRequestHandler`) answers the same status as application/problem+json instead
(`invalid_request`, or `internal_error` for a 500), so every error the process sends is a
problem a client can parse. The connection still closes, as before.
"""

from __future__ import annotations

from splatq.services.gateway.problems import ApiError

MAX_DETAIL = 200


def parse_error_problem(status: int, message: str | None) -> ApiError:
    """The problem for an error the HTTP layer found (pure)."""
    if status >= 500:
        return ApiError(status, "internal_error", "unexpected error")
    reason = " ".join((message or "").split())[:MAX_DETAIL]
    return ApiError(status, "invalid_request", f"malformed HTTP request: {reason or status}")
