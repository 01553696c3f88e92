"""Bearer API keys -> tenant: static keys from SPLATQ_API_KEYS, and keys kept in Redis
(`shared/tenants/store.py`, stored as their SHA-256) behind a small per-process cache.

The cache holds at most SPLATQ_API_KEY_CACHE_SIZE lookups (least recently used go first),
each for at most SPLATQ_API_KEY_CACHE_S seconds and only while the key registry's version
(`TenantKeys.key_version`, bumped by every rotation and revocation in the same script) is the
one it was looked up under: each request reads that version (one GET), so a revoked key, or
one retired by a rotation, stops working at once on every gateway; a key's own expiry (a
rotation's grace) is checked on every request. Pub/sub invalidation would save the GET but
delivers at most once: a gateway that missed a message (a reconnect) would keep a revoked
key. Unknown keys are cached too (a flood of bad keys costs Redis one lookup per key and
version). Keys are never logged; the cache is keyed by their hash.

Authentication only; what a tenant may see is decided by the handlers (tenant isolation).
The admin API has its own key (SPLATQ_ADMIN_API_KEY, `authenticate_admin`), and its failed
authentications are throttled per client address and in all (`auth_throttle.py`).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Mapping

from aiohttp import web

from splatq.services.gateway.auth_throttle import ADMIN_THROTTLE
from splatq.services.gateway.problems import ApiError
from splatq.services.gateway.ttl_cache import TtlCache
from splatq.shared.tenants.apikeys import key_hash
from splatq.shared.tenants.store import TenantStore, is_live

_REALM = 'Bearer realm="splatq"'
_INVALID = f'{_REALM}, error="invalid_token"'


def _unauthorized(detail: str, challenge: str) -> ApiError:
    return ApiError(401, "unauthorized", detail, {"WWW-Authenticate": challenge})


class KeyResolver:
    """Static keys first (constant-time compare per key), then Redis through the cache."""

    def __init__(
        self,
        static: Mapping[str, str],
        store: TenantStore | None,
        ttl_s: float,
        max_entries: int,
    ) -> None:
        self._static = [(k.encode(), t) for k, t in static.items()]
        self._store = store
        # sha256(key) -> (tenant or '' when unknown, key expiry ms (0 = never), the key
        # registry's version it was looked up under)
        self._cache: TtlCache[str, tuple[str, int, int]] = TtlCache(ttl_s, max_entries)
        self.lookups = 0  # Redis lookups made (tests, metrics)

    def static_tenant(self, token: str) -> str | None:
        encoded = token.encode()
        for key, tenant in self._static:
            # Constant-time per key: how much of a key matched never shows in the timing.
            if hmac.compare_digest(key, encoded):
                return tenant
        return None

    async def tenant_for(self, token: str) -> str | None:
        tenant = self.static_tenant(token)
        if tenant is not None or self._store is None:
            return tenant
        store = self._store
        # Read before the lookup: a change between the two makes the entry look older than
        # it is (looked up again next time), never newer.
        version = await store.key_version()

        async def load() -> tuple[str, int, int]:
            self.lookups += 1
            match = await store.lookup(token)
            return (match.tenant, match.expires_ms, version) if match else ("", 0, version)

        tenant, expires_ms, _ = await self._cache.get(
            key_hash(token), load, fresh=lambda entry: entry[2] == version
        )
        return tenant if tenant and is_live(expires_ms, time.time()) else None


KEY_RESOLVER = web.AppKey("key_resolver", KeyResolver)


def bearer_token(request: web.Request) -> str:
    """The request's `Authorization: Bearer <key>` token, or 401."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized("missing or malformed Authorization: Bearer <api key>", _REALM)
    token = token.strip()
    if not (token.isascii() and token.isprintable()):
        # Undecodable bytes arrive as surrogates (they cannot even be encoded to compare);
        # no key is made of them.
        raise _unauthorized("malformed API key: visible ASCII characters only", _INVALID)
    return token


async def authenticate(request: web.Request) -> str:
    """The tenant of the request's API key, or 401."""
    token = bearer_token(request)
    tenant = await request.app[KEY_RESOLVER].tenant_for(token)
    if tenant is None:
        raise _unauthorized("unknown API key", _INVALID)
    return tenant


async def authenticate_admin(request: web.Request, admin_key: str) -> None:
    """Admin API access: 403 `admin_disabled` without SPLATQ_ADMIN_API_KEY; 429
    `too_many_auth_failures` while this client address, or every client together, failed too
    often (checked before the key, so no guess is evaluated then); 401 without a key or with
    an unknown one, 403 `forbidden` with a tenant's key (each a failure), else allowed."""
    if not admin_key:
        raise ApiError(403, "admin_disabled", "the admin API is off (no SPLATQ_ADMIN_API_KEY)")
    throttle = request.app[ADMIN_THROTTLE]
    client = request.remote or ""
    wait_s = throttle.retry_after_s(client)
    if wait_s:
        raise ApiError(
            429,
            "too_many_auth_failures",
            "too many failed admin authentications from this address or in all; retry later",
            {"Retry-After": str(wait_s)},
        )
    try:
        token = bearer_token(request)
        if hmac.compare_digest(admin_key.encode(), token.encode()):
            return
        if await request.app[KEY_RESOLVER].tenant_for(token) is not None:
            raise ApiError(403, "forbidden", "this is a tenant's API key, not the admin key")
        raise _unauthorized("unknown API key", _INVALID)
    except ApiError:
        throttle.failed(client)
        raise
