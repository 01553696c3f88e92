"""Bearer API keys → tenant. Static keys from SPLATQ_API_KEYS (development, tests).

Authentication only; what a tenant may see is decided by the handlers (tenant isolation).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from aiohttp import web

from services.gateway.problems import ApiError


def authenticate(request: web.Request, api_keys: Mapping[str, str]) -> str:
    """The tenant of the request's `Authorization: Bearer <key>`, or 401."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401, "unauthorized", "missing or malformed Authorization: Bearer <api key>",
            {"WWW-Authenticate": 'Bearer realm="splatq"'},
        )  # fmt: skip
    token = token.strip()
    for key, tenant in api_keys.items():
        # Constant-time per key: how much of a key matched never shows in the timing.
        if hmac.compare_digest(key.encode(), token.encode()):
            return tenant
    raise ApiError(
        401,
        "unauthorized",
        "unknown API key",
        {"WWW-Authenticate": 'Bearer realm="splatq", error="invalid_token"'},
    )
