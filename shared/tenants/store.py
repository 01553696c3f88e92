"""Tenants and their API keys in Redis: create, list, show, update; add, rotate, revoke and
look up keys. Also the small read accessor the scheduler uses (`scheduling`).

A tenant lives in two places: the registry slot (`{tenants}`: index and key hashes, so each
key operation is one script) and its own slot (`{tenant:<id>}`: settings and quota). Creating
a tenant writes the index, then its settings; a crash between leaves a tenant with default
settings, which is what a missing settings hash means anyway.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import orjson
from redis.asyncio import Redis

from splatq.shared.engine.keys import StreamName
from splatq.shared.tenants.apikeys import key_hash, key_hint, new_api_key, new_key_id
from splatq.shared.tenants.keys import TenantKeys, valid_tenant_id
from splatq.shared.tenants.periods import Period
from splatq.shared.tenants.scripts import TenantScript, TenantScripts

DEFAULT_WEIGHT = 1
MAX_WEIGHT = 1000
MAX_LABEL = 100


class TenantError(Exception):
    """A refused tenant operation, with a stable code (the admin API's problem code)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class TenantScheduling:
    """What the fair scheduler reads of a tenant: its weight (share of its class when several
    tenants wait) and its cap on running jobs per class (0 = no cap of its own)."""

    weight: int = DEFAULT_WEIGHT
    running_caps: Mapping[StreamName, int] = field(default_factory=dict)

    def running_cap(self, stream: StreamName) -> int:
        return self.running_caps.get(stream, 0)


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    gpu_ms: int | None  # None = unlimited
    period: Period


@dataclass(frozen=True, slots=True)
class KeyInfo:
    key_id: str
    label: str
    hint: str
    created_ms: int
    expires_ms: int  # 0 = never


@dataclass(frozen=True, slots=True)
class NewKey:
    info: KeyInfo
    api_key: str  # shown once, never stored


@dataclass(frozen=True, slots=True)
class KeyMatch:
    tenant: str
    key_id: str
    expires_ms: int


def _cap_field(stream: StreamName) -> str:
    return f"cap_{stream.value}"


def parse_scheduling(raw: Mapping[str, str]) -> TenantScheduling:
    """A settings hash as the scheduler sees it; unreadable values fall back to defaults."""
    try:
        weight = int(raw.get("weight") or DEFAULT_WEIGHT)
    except ValueError:
        weight = DEFAULT_WEIGHT
    caps: dict[StreamName, int] = {}
    for stream in StreamName:
        value = raw.get(_cap_field(stream), "")
        if value.isdigit() and int(value) > 0:
            caps[stream] = int(value)
    return TenantScheduling(max(1, min(weight, MAX_WEIGHT)), caps)


def check_tenant_id(tenant: str) -> None:
    if not valid_tenant_id(tenant):
        raise TenantError(
            "invalid_request",
            "tenant ids are 1-64 characters: letters, digits, '.', '_' and '-',"
            " starting with a letter or digit",
        )


class TenantStore:
    def __init__(self, redis: Redis, keys: TenantKeys | None = None) -> None:
        self.redis = redis
        self.keys = keys or TenantKeys()
        self.scripts = TenantScripts(redis)

    # -- tenants -----------------------------------------------------------------------

    async def create(
        self, tenant: str, weight: int = DEFAULT_WEIGHT, caps: Mapping[StreamName, int] = {}
    ) -> None:
        check_tenant_id(tenant)
        now = int(time.time() * 1000)
        if not await self.redis.hsetnx(self.keys.index, tenant, str(now)):  # type: ignore[misc]
            raise TenantError("tenant_exists", f"tenant {tenant!r} exists already")
        await self.update(tenant, weight=weight, caps=caps)

    async def exists(self, tenant: str) -> bool:
        return bool(await self.redis.hexists(self.keys.index, tenant))  # type: ignore[misc]

    async def all(self) -> dict[str, int]:
        """Every tenant created in Redis -> created_ms."""
        raw = await self.redis.hgetall(self.keys.index)  # type: ignore[misc]
        return {t: int(ms) for t, ms in sorted(raw.items())}

    async def update(
        self,
        tenant: str,
        weight: int | None = None,
        caps: Mapping[StreamName, int] | None = None,
    ) -> TenantScheduling:
        """Change a tenant's weight and/or running caps (0 = no cap of its own)."""
        fields: dict[str, str] = {}
        if weight is not None:
            if not 1 <= weight <= MAX_WEIGHT:
                raise TenantError("invalid_request", f"weight must be within [1, {MAX_WEIGHT}]")
            fields["weight"] = str(weight)
        for stream, cap in (caps or {}).items():
            if cap < 0:
                raise TenantError("invalid_request", "running caps must be >= 0")
            fields[_cap_field(stream)] = str(cap)
        if fields:
            await self.redis.hset(self.keys.settings(tenant), mapping=fields)  # type: ignore[misc]
        return await self.scheduling(tenant)

    # -- the scheduler's accessor ------------------------------------------------------

    async def scheduling(self, tenant: str) -> TenantScheduling:
        """The tenant's weight and running caps (defaults when it has no settings)."""
        raw = await self.redis.hgetall(self.keys.settings(tenant))  # type: ignore[misc]
        return parse_scheduling(raw)

    async def scheduling_many(self, tenants: Sequence[str]) -> dict[str, TenantScheduling]:
        """Several tenants' settings in one round trip (one pipeline)."""
        if not tenants:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for tenant in tenants:
            pipe.hgetall(self.keys.settings(tenant))
        replies = await pipe.execute()
        return {t: parse_scheduling(r) for t, r in zip(tenants, replies, strict=True)}

    # -- quota configuration -----------------------------------------------------------

    async def set_quota(self, tenant: str, gpu_seconds: float | None, period: Period) -> None:
        """The tenant's GPU-seconds per period (None = unlimited). Takes effect at the next
        submission; reservations already held stay."""
        key = self.keys.quota(tenant)
        if gpu_seconds is not None and gpu_seconds < 0:
            raise TenantError("invalid_request", "gpu_seconds must be >= 0 (or null: unlimited)")
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, "period", period.value)
        if gpu_seconds is None:
            pipe.hdel(key, "gpu_ms")
        else:
            pipe.hset(key, "gpu_ms", str(round(gpu_seconds * 1000)))
        await pipe.execute()

    async def quota(self, tenant: str) -> QuotaConfig:
        raw = await self.redis.hmget(self.keys.quota(tenant), ["gpu_ms", "period"])  # type: ignore[misc]
        period = Period.DAY if raw[1] == "day" else Period.MONTH
        return QuotaConfig(int(raw[0]) if raw[0] else None, period)

    # -- API keys ----------------------------------------------------------------------

    async def add_key(
        self, tenant: str, label: str = "", retire: str = "", retire_after_s: int = 0
    ) -> NewKey:
        """A new key for the tenant (returned once). With `retire`, that key of the tenant
        stops working `retire_after_s` seconds from now, in the same step (a rotation)."""
        if len(label) > MAX_LABEL or not label.isprintable():
            raise TenantError("invalid_request", f"label: at most {MAX_LABEL} printable chars")
        if retire_after_s < 0:
            raise TenantError("invalid_request", "grace must be >= 0 seconds")
        api_key = new_api_key()
        now = int(time.time() * 1000)
        info = KeyInfo(new_key_id(), label, key_hint(api_key), now, 0)
        digest = key_hash(api_key)
        record = {"sha256": digest, "label": label, "hint": info.hint, "created_ms": now}
        record["expires_ms"] = 0
        reply = await self.scripts.run(
            TenantScript.KEY_PUT,
            [
                self.keys.index,
                self.keys.key_hashes,
                self.keys.tenant_keys(tenant),
                self.keys.key_version,
            ],
            [
                tenant,
                info.key_id,
                digest,
                orjson.dumps(record).decode(),
                retire,
                # the retired key's last valid instant; at least 1 so 0 keeps meaning "never"
                max(1, now + retire_after_s * 1000) if retire else 0,
            ],
        )
        if reply[0] == "no_tenant":
            raise TenantError("not_found", f"no such tenant {tenant!r}")
        if reply[0] == "no_key":
            raise TenantError("not_found", f"tenant {tenant!r} has no key {retire!r}")
        return NewKey(info, api_key)

    async def revoke_key(self, tenant: str, key_id: str) -> None:
        reply = await self.scripts.run(
            TenantScript.KEY_REVOKE,
            [self.keys.key_hashes, self.keys.tenant_keys(tenant), self.keys.key_version],
            [key_id],
        )
        if reply[0] == "no_key":
            raise TenantError("not_found", f"tenant {tenant!r} has no key {key_id!r}")

    async def list_keys(self, tenant: str) -> list[KeyInfo]:
        raw = await self.redis.hgetall(self.keys.tenant_keys(tenant))  # type: ignore[misc]
        infos = []
        for key_id, value in raw.items():
            rec = orjson.loads(value)
            infos.append(
                KeyInfo(
                    key_id,
                    str(rec.get("label", "")),
                    str(rec.get("hint", "")),
                    int(rec.get("created_ms", 0)),
                    int(rec.get("expires_ms", 0)),
                )
            )
        return sorted(infos, key=lambda k: (k.created_ms, k.key_id))

    async def key_version(self) -> int:
        """The key registry's version: it changes with every rotation and revocation."""
        raw = await self.redis.get(self.keys.key_version)
        return int(raw or 0)

    async def lookup(self, api_key: str) -> KeyMatch | None:
        """The tenant of a presented key, by its hash; None when unknown or expired."""
        value = await self.redis.hget(self.keys.key_hashes, key_hash(api_key))  # type: ignore[misc]
        if not value:
            return None
        tenant, key_id, expires = value.rsplit("|", 2)
        match = KeyMatch(tenant, key_id, int(expires))
        return match if is_live(match.expires_ms, time.time()) else None


def is_live(expires_ms: int, now_s: float) -> bool:
    return expires_ms == 0 or now_s * 1000 < expires_ms
