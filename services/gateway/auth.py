"""Bearer API keys → tenant. Static keys from SPLATQ_API_KEYS (development, tests).

Authentication only; what a tenant may see is decided by the handlers (tenant isolation).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from aiohttp import web

from splatq.services.gateway.problems import ApiError

_REALM = 'Bearer realm="splatq"'


def _unauthorized(detail: str, challenge: str) -> ApiError:
    return ApiError(401, "unauthorized", detail, {"WWW-Authenticate": challenge})


def authenticate(request: web.Request, api_keys: Mapping[str, str]) -> str:
    """The tenant of the request's `Authorization: Bearer <key>`, or 401."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized("missing or malformed Authorization: Bearer <api key>", _REALM)
    token = token.strip()
    invalid = f'{_REALM}, error="invalid_token"'
    if not (token.isascii() and token.isprintable()):
        # Undecodable bytes arrive as surrogates (they cannot even be encoded to compare);
        # no key is made of them.
        raise _unauthorized("malformed API key: visible ASCII characters only", invalid)
    for key, tenant in api_keys.items():
        # Constant-time per key: how much of a key matched never shows in the timing.
        if hmac.compare_digest(key.encode(), token.encode()):
            return tenant
    raise _unauthorized("unknown API key", invalid)
