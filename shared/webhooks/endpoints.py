"""Redis I/O of a tenant's webhook endpoints: registration, secrets and their rotation, the
per-endpoint health (circuit breaker, auto-disable) and `recover`.

Every call here touches one endpoint's slot (`{wh:<tenant>}`) through the wh_ep_*.lua
scripts, except `recover`, which reads the endpoint's dead-letter index in each partition.
The breaker's rules live in wh_ep_gate.lua / wh_ep_health.lua (run by wh_ep_record.lua,
with the attempt log's append); this module passes the settings in.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from splatq.shared.engine.backend import Backend, Role
from splatq.shared.engine.ids import ulid
from splatq.shared.engine.scripts import Arg, ScriptCall
from splatq.shared.webhooks.headers import decode_headers, encode_headers
from splatq.shared.webhooks.scripts import WebhookScript
from splatq.shared.webhooks.signing import generate_secret

ENDPOINT_ID_PREFIX = "ep_"
# A peek's answer where only the gate itself may decide (it would take the half-open probe).
ASK = "ask"
# How long a half-open probe holds the endpoint before another dispatcher may probe (its
# holder is presumed dead), and how long other messages wait for the probe's result.
PROBE_HOLD_MS = 30_000
HALF_OPEN_DEFER_MS = 1_000
RECOVER_BATCH = 500  # messages per wh_redrive call
ATTEMPT_LOG_CAP = 1_000  # attempts kept per endpoint (newest)
_ENDPOINT_ID_RE = re.compile(r"ep_[0-9A-HJKMNP-TV-Z]{26}")  # the prefix and a ULID


def new_endpoint_id() -> str:
    return f"{ENDPOINT_ID_PREFIX}{ulid()}"


def is_endpoint_id(value: str) -> bool:
    return _ENDPOINT_ID_RE.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An endpoint as stored: configuration and health."""

    id: str
    url: str
    events: tuple[str, ...]
    created_ms: int
    secret: str
    previous_secret: str
    previous_expires_ms: int
    disabled_at_ms: int
    disabled_reason: str
    circuit: str
    open_until_ms: int
    consecutive_failures: int
    failing_since_ms: int
    last_success_ms: int
    last_failure_ms: int
    # Sent with every delivery to it (shared/webhooks/headers.py validates them).
    headers: Mapping[str, str]

    @classmethod
    def from_hash(cls, endpoint_id: str, f: Mapping[str, str]) -> Endpoint:
        def num(name: str) -> int:
            raw = f.get(name) or "0"
            return int(raw) if raw.isdigit() else 0

        return cls(
            id=endpoint_id,
            url=f.get("url", ""),
            events=tuple(e for e in f.get("events", "").split(",") if e),
            created_ms=num("created_ms"),
            secret=f.get("secret", ""),
            previous_secret=f.get("previous_secret", ""),
            previous_expires_ms=num("previous_expires_ms"),
            disabled_at_ms=num("disabled_at_ms"),
            disabled_reason=f.get("disabled_reason", ""),
            circuit=f.get("circuit", "closed"),
            open_until_ms=num("open_until_ms"),
            consecutive_failures=num("consecutive_failures"),
            failing_since_ms=num("failing_since_ms"),
            last_success_ms=num("last_success_ms"),
            last_failure_ms=num("last_failure_ms"),
            headers=decode_headers(f.get("headers", "")),
        )

    @property
    def enabled(self) -> bool:
        return not self.disabled_at_ms


@dataclass(frozen=True, slots=True)
class Gate:
    """What the dispatcher may do with a message to an endpoint right now."""

    verdict: str  # send | probe | defer | disabled | gone
    url: str = ""
    secrets: tuple[str, ...] = ()
    until_ms: int = 0
    reason: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Health:
    """The endpoint's state after an attempt was folded in."""

    state: str  # closed | open | half_open | disabled | missing
    open_until_ms: int = 0


@dataclass(frozen=True, slots=True)
class RecoverResult:
    recovered: int
    expired: int
    truncated: bool


class EndpointLimitReached(Exception):
    """The tenant has as many endpoints as the settings allow."""


class EndpointStore:
    def __init__(self, store: Backend | Role) -> None:
        """Over the job store's backend (any role of it will do: its backend is taken)."""
        backend = store if isinstance(store, Backend) else store.backend
        self.scripts = backend.scripts
        self.scripts.register(WebhookScript)
        self.redis = backend.redis
        self.keys = backend.keys
        self.settings = backend.settings

    # -- management (the API) -------------------------------------------------------------

    async def create(
        self,
        tenant: str,
        url: str,
        events: Sequence[str],
        headers: Mapping[str, str] | None = None,
    ) -> Endpoint:
        endpoint_id = new_endpoint_id()
        now = int(time.time() * 1000)
        fields = {"url": url, "events": ",".join(events), "created_ms": str(now),
                  "secret": generate_secret(), "circuit": "closed"}  # fmt: skip
        if headers:
            fields["headers"] = encode_headers(headers)
        args: list[Arg] = [endpoint_id, self.settings.webhook_max_endpoints, fields["events"]]
        for name, value in fields.items():
            args.extend((name, value))
        reply = await self._run(
            WebhookScript.WH_EP_CREATE, tenant, endpoint_id, args, with_index=True
        )
        if reply == "limit":
            raise EndpointLimitReached(
                f"a tenant may have {self.settings.webhook_max_endpoints} endpoints"
            )
        if reply != "created":  # an id collision: 80 random bits, practically never
            raise RuntimeError(f"endpoint id collision: {endpoint_id}")
        return Endpoint.from_hash(endpoint_id, fields)

    async def get(self, tenant: str, endpoint_id: str) -> Endpoint | None:
        if not is_endpoint_id(endpoint_id):
            return None
        raw = await self.redis.hgetall(self.keys.webhook_endpoint(tenant, endpoint_id))  # type: ignore[misc]
        return Endpoint.from_hash(endpoint_id, raw) if raw else None

    async def of_tenant(self, tenant: str) -> list[Endpoint]:
        ids = sorted(await self.redis.hkeys(self.keys.webhook_endpoints(tenant)))  # type: ignore[misc]
        pipe = self.redis.pipeline(transaction=False)
        for endpoint_id in ids:
            pipe.hgetall(self.keys.webhook_endpoint(tenant, endpoint_id))
        rows = await pipe.execute() if ids else []
        return [Endpoint.from_hash(i, r) for i, r in zip(ids, rows, strict=True) if r]

    async def update(
        self,
        tenant: str,
        endpoint_id: str,
        url: str | None = None,
        events: Sequence[str] | None = None,
        enabled: bool | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Endpoint | None:
        """Change some of url / events / enabled / headers (replaced as a whole; {} clears
        them); None if there is no such endpoint."""
        if not is_endpoint_id(endpoint_id):
            return None
        args: list[Arg] = [
            endpoint_id,
            url or "",
            "1" if events is not None else "0",
            ",".join(events or ()),
            "" if enabled is None else ("1" if enabled else "0"),
            "1" if headers is not None else "0",
            encode_headers(headers or {}),
        ]
        reply = await self._run(
            WebhookScript.WH_EP_UPDATE, tenant, endpoint_id, args, with_index=True
        )
        return None if reply == "missing" else await self.get(tenant, endpoint_id)

    async def delete(self, tenant: str, endpoint_id: str) -> bool:
        if not is_endpoint_id(endpoint_id):
            return False
        reply = await self._run(
            WebhookScript.WH_EP_DELETE, tenant, endpoint_id, [endpoint_id], with_index=True
        )
        return bool(reply)

    async def rotate_secret(self, tenant: str, endpoint_id: str) -> Endpoint | None:
        """A new secret; the old one keeps signing for the rotation overlap."""
        if not is_endpoint_id(endpoint_id):
            return None
        until = int(time.time() * 1000) + self.settings.webhook_rotation_overlap_s * 1000
        reply = await self._run(
            WebhookScript.WH_EP_ROTATE, tenant, endpoint_id, [generate_secret(), until]
        )
        return None if reply == "missing" else await self.get(tenant, endpoint_id)

    async def recover(self, tenant: str, endpoint_id: str, since_ms: int) -> RecoverResult:
        """Send again every dead-lettered message of this endpoint failed since `since_ms`,
        at most `webhook_recover_limit` per call (`truncated`: more remain, call again)."""
        limit = self.settings.webhook_recover_limit
        picked_total = recovered = expired = 0
        truncated = False
        for p in range(self.settings.partitions):
            # One more than still allowed: finding it means the call is truncated.
            picked = await self._failed_since(
                p, tenant, endpoint_id, since_ms, limit - picked_total + 1
            )
            if picked_total + len(picked) > limit:
                picked = picked[: limit - picked_total]
                truncated = True
            picked_total += len(picked)
            for start in range(0, len(picked), RECOVER_BATCH):
                batch = picked[start : start + RECOVER_BATCH]
                r, e, _ = await self.redrive_messages(p, tenant, endpoint_id, batch)
                recovered += r
                expired += e
            if truncated:
                break
        return RecoverResult(recovered, expired, truncated)

    async def _failed_since(
        self, partition: int, tenant: str, endpoint_id: str, since_ms: int, most: int
    ) -> list[tuple[str, str]]:
        """(dead-letter entry id, message id) of the endpoint's failures since `since_ms` in
        one partition, oldest first, at most `most`: read from the endpoint's own index
        (wh_result.lua), so other endpoints' dead letters cost nothing. A member whose entry
        is gone (purged, trimmed) is dropped by wh_redrive.lua."""
        index = self.keys.webhook_dead_letter_index(partition, tenant, endpoint_id)
        members = await self.redis.zrangebyscore(index, since_ms, "+inf", start=0, num=most)
        picked: list[tuple[str, str]] = []
        for member in members:  # "<entry id> <message id>"
            entry_id, _, message_id = member.partition(" ")
            picked.append((entry_id, message_id))
        return picked

    async def redrive_messages(
        self, partition: int, tenant: str, target: str, entries: Sequence[tuple[str, str]]
    ) -> tuple[int, int, int]:
        """(dead-letter entry id, message id) pairs of one partition, all of one (tenant,
        target) -> (redriven, expired, skipped); see wh_redrive.lua."""
        if not entries:
            return 0, 0, 0
        keys = [self.keys.webhook_due(partition), self.keys.webhook_dead_letters(partition)]
        index = self.keys.webhook_dead_letter_index(partition, tenant, target)
        args: list[Arg] = []
        for entry_id, message_id in entries:
            keys.extend((self.keys.webhook_message(partition, message_id), index))
            args.extend((entry_id, message_id))
        reply = await self.scripts.run(ScriptCall(WebhookScript.WH_REDRIVE, keys, args))
        if isinstance(reply, Exception):
            raise reply
        return int(reply[0]), int(reply[1]), int(reply[2])

    # -- delivery (the dispatcher) ----------------------------------------------------------

    async def subscriptions(self, tenants: Sequence[str]) -> dict[str, dict[str, tuple[str, ...]]]:
        """tenant -> {endpoint id: subscribed event types (empty = all)}; one round trip."""
        if not tenants:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for tenant in tenants:
            pipe.hgetall(self.keys.webhook_endpoints(tenant))
        rows = await pipe.execute()
        return {
            t: {eid: tuple(e for e in ev.split(",") if e) for eid, ev in row.items()}
            for t, row in zip(tenants, rows, strict=True)
        }

    def gate_call(self, tenant: str, endpoint_id: str, peek: bool = False) -> ScriptCall:
        """The breaker's gate for one endpoint; a `peek` writes nothing and answers `ASK`
        where the gate would take the half-open probe (wh_ep_gate.lua)."""
        return ScriptCall(
            WebhookScript.WH_EP_GATE,
            [self.keys.webhook_endpoint(tenant, endpoint_id)],
            [PROBE_HOLD_MS, HALF_OPEN_DEFER_MS, "1" if peek else "0"],
        )

    @staticmethod
    def parse_gate(reply: Any, count: int) -> list[Gate] | None:
        """The gate's verdicts for `count` messages to one endpoint (claim order); None for
        a peek's `ASK` (gate them again)."""
        if str(reply[0]) == ASK:
            return None
        first, rest, url, secret, previous = (str(x) for x in reply[:5])
        until_ms, reason = int(reply[5]), str(reply[6])
        secrets = tuple(s for s in (secret, previous) if s)
        headers = decode_headers(str(reply[7])) if len(reply) > 7 else {}

        def gate(verdict: str) -> Gate:
            if verdict in {"send", "probe"}:
                return Gate(verdict, url=url, secrets=secrets, headers=headers)
            return Gate(verdict, url=url, until_ms=until_ms, reason=reason)

        return [gate(first)] + [gate(rest)] * (count - 1)

    def record_call(
        self, tenant: str, endpoint_id: str, outcomes: Sequence[str], attempts: Sequence[str]
    ) -> ScriptCall:
        """What a batch of results changes for one endpoint (wh_ep_record.lua): `outcomes`
        ('ok' | 'fail' | 'gone', oldest first) folded into its health, then `attempts`
        (records as JSON, oldest first) appended to its attempt log."""
        s = self.settings
        return ScriptCall(
            WebhookScript.WH_EP_RECORD,
            [self.keys.webhook_endpoint(tenant, endpoint_id),
             self.keys.webhook_endpoint_attempts(tenant, endpoint_id)],
            [",".join(outcomes), s.webhook_breaker_consecutive, s.webhook_breaker_ratio,
             s.webhook_breaker_min_attempts, s.webhook_breaker_window_ms,
             s.webhook_breaker_open_ms, s.webhook_breaker_open_cap_ms,
             s.webhook_disable_after_s * 1000, "410 Gone: the receiver asked to stop",
             ATTEMPT_LOG_CAP, self.settings.job_retention_ms, *attempts],
        )  # fmt: skip

    @staticmethod
    def parse_health(reply: Any) -> Health:
        return Health(str(reply[0]), int(reply[1]))

    async def attempts(
        self, tenant: str, endpoint_id: str, before: str | None, limit: int
    ) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
        """The endpoint's attempts, newest first: up to `limit` (log entry id, record) before
        the entry id `before` (None: from the newest), and whether older ones remain."""
        if before is not None and before.lstrip("0-") == "":
            return [], False  # nothing is older than 0-0 (and Redis refuses "(0-0")
        key = self.keys.webhook_endpoint_attempts(tenant, endpoint_id)
        high = f"({before}" if before else "+"
        rows = await self.redis.xrevrange(key, high, "-", count=limit + 1)
        out = [(str(eid), orjson.loads(f["a"])) for eid, f in rows[:limit]]
        return out, len(rows) > limit

    # -- helpers ----------------------------------------------------------------------------

    async def _run(
        self,
        script: WebhookScript,
        tenant: str,
        endpoint_id: str,
        args: Sequence[Arg],
        with_index: bool = False,
    ) -> Any:
        endpoint_key = self.keys.webhook_endpoint(tenant, endpoint_id)
        keys = [self.keys.webhook_endpoints(tenant), endpoint_key] if with_index else [endpoint_key]
        reply = await self.scripts.run(ScriptCall(script, keys, args))
        if isinstance(reply, Exception):
            raise reply
        return reply
