"""API errors as values with stable codes, and their `application/problem+json` rendering.

The one place HTTP statuses meet error codes; handlers raise `ApiError`, nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

PROBLEM_TYPE_BASE = "https://splatq.dev/problems/"

TITLES: Mapping[int, str] = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class ApiError(Exception):
    """An error answered to the client: status, stable code, human detail, extra headers."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = dict(headers or {})
        # Members added to the problem object (RFC 9457 extensions), e.g. `resets_at`.
        self.extra = dict(extra or {})


def problem_response(error: ApiError) -> web.Response:
    body = {
        "type": PROBLEM_TYPE_BASE + error.code,
        "title": TITLES.get(error.status, "Error"),
        "status": error.status,
        "detail": error.detail,
        "code": error.code,
        **error.extra,
    }
    return web.Response(
        status=error.status,
        body=orjson.dumps(body),
        content_type="application/problem+json",
        headers=error.headers,
    )


def problem_bytes(error: ApiError) -> bytes:
    """A whole HTTP/1.1 answer for `error` that closes the connection, for the server to
    write itself where no request object exists (a request whose headers never arrived)."""
    body = orjson.dumps(
        {
            "type": PROBLEM_TYPE_BASE + error.code,
            "title": TITLES.get(error.status, "Error"),
            "status": error.status,
            "detail": error.detail,
            "code": error.code,
        }
    )
    head = [
        f"HTTP/1.1 {error.status} {TITLES.get(error.status, 'Error')}",
        "Content-Type: application/problem+json",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in error.headers.items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def not_found(what: str = "job") -> ApiError:
    return ApiError(404, "not_found", f"no such {what}")


def invalid_request(detail: str) -> ApiError:
    return ApiError(400, "invalid_request", detail)
