"""The webhook dispatcher: fans each outbox event out to its targets (the job's `webhook_url`
and the tenant's endpoints subscribed to the event) and delivers every message signed,
SSRF-guarded, retried durably and held back while its endpoint's circuit is open.

Two loops: `fan_out` reads the events streams with its own consumer group; `deliver` claims
due messages and sends them. State lives in Redis only, so any process may die at any line.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import socket
import time
from collections.abc import Coroutine
from typing import Any

import aiohttp
import structlog
from redis.exceptions import RedisError

from splatq.services.webhook_dispatcher.collector import tuned_collector
from splatq.services.webhook_dispatcher.gates import Endpoint, Gatekeeper
from splatq.services.webhook_dispatcher.messages import messages_of, target_key, tenant_key
from splatq.services.webhook_dispatcher.metrics import DispatcherMetrics
from splatq.services.webhook_dispatcher.policy import (
    Decision,
    classify_response,
    defer_delay_ms,
    retry_or_fail,
    tenant_limit,
)
from splatq.services.webhook_dispatcher.secret_cache import SecretCache
from splatq.shared import tracing
from splatq.shared.backoff import Backoff
from splatq.shared.engine.batcher import Batcher
from splatq.shared.engine.ids import is_job_id
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.client import is_transient_reply
from splatq.shared.webhooks.endpoints import Gate, Health
from splatq.shared.webhooks.signing import signed_headers
from splatq.shared.webhooks.ssrf import BlockedAddress, guarded_connector
from splatq.shared.webhooks.store import (
    DISPATCHER_GROUP,
    AttemptResult,
    Message,
    Recorded,
    WebhookStore,
)

log = structlog.get_logger("splatq.dispatcher")
EVENTS_RECLAIM_IDLE_MS = 30_000
CLAIM_BATCH = 100
SECRET_CACHE_S = 5.0
BUSY_DEFER_MS = 200
FIRST_LOOK_MS = 20
MAX_BUSY_DEFER_MS = 600_000
SNIPPET_BYTES = 512
# Backoff of the fan-out and delivery loops after a failed round (Redis away).
RETRY_MIN_S = 0.05
RETRY_MAX_S = 1.0
# What the delivery log and the dead letter say about an address the SSRF guard refused.
BLOCKED_REASON = "blocked: private_address"


class Dispatcher:
    def __init__(
        self,
        queue: JobQueue,
        rng: random.Random | None = None,
        metrics: DispatcherMetrics | None = None,
    ) -> None:
        self.queue = queue
        self.metrics = metrics
        self.settings = queue.settings
        self.store = WebhookStore(queue)
        self.consumer = f"{socket.gethostname()}-{os.getpid()}"
        self._rng = rng or random.Random()
        self._stopping = asyncio.Event()
        self._in_flight: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(self.settings.webhook_concurrency)
        self._secrets = SecretCache(self.store.tenant_secrets, SECRET_CACHE_S)
        self._results: Batcher[AttemptResult, Recorded] = Batcher(self._record_batch)
        self._open_circuits: dict[str, int] = {}  # endpoint id -> open until (ms), as seen here
        self._busy: dict[str, int] = {}  # target -> attempts in flight
        self._tenant_busy: dict[str, int] = {}  # "tenant:<name>" -> attempts in flight
        self._tenant_since: dict[str, float] = {}  # ... since when (monotonic s)
        # Keyed by target or "tenant:<name>": recent attempt latency (EWMA), and until when
        # its capacity is booked (ms).
        self._latency_ms: dict[str, float] = {}
        self._booked: dict[str, float] = {}
        self.gatekeeper = Gatekeeper(self.store.endpoints, queue.scripts)

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        await self.queue.setup()
        await self.store.setup()
        timeout = aiohttp.ClientTimeout(
            total=self.settings.webhook_timeout_s, connect=min(5.0, self.settings.webhook_timeout_s)
        )
        connector = guarded_connector(
            self.settings.webhook_allow_private,
            limit=self.settings.webhook_concurrency,
            limit_per_host=self.settings.webhook_concurrency_per_host,
        )
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, trust_env=False
        ) as http:
            loops = [
                asyncio.create_task(self._fan_out_loop(p)) for p in range(self.settings.partitions)
            ]
            loops.append(asyncio.create_task(self._deliver_loop(http)))
            recorder = asyncio.create_task(self._results.run())
            with tuned_collector():  # set for many short-lived attempts (collector.py)
                log.info("dispatcher.started", consumer=self.consumer)
                await self._stopping.wait()
                for t in loops:
                    t.cancel()
                for t in loops:
                    with contextlib.suppress(asyncio.CancelledError):
                        await t
                if self._in_flight:
                    await asyncio.wait(self._in_flight, timeout=self.settings.shutdown_grace_s)
                recorder.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await recorder
        log.info("dispatcher.stopped")

    # -- fan-out -----------------------------------------------------------------------

    async def _fan_out_loop(self, partition: int) -> None:
        stream = self.queue.keys.events(partition)
        next_reclaim = 0.0
        backoff = Backoff(RETRY_MIN_S, RETRY_MAX_S)
        while True:
            try:
                entries: list[tuple[str, dict[str, str]]] = []
                if time.monotonic() >= next_reclaim:
                    # Events a dead dispatcher read but never fanned out.
                    reply = await self.queue.redis.xautoclaim(
                        stream,
                        DISPATCHER_GROUP,
                        self.consumer,
                        EVENTS_RECLAIM_IDLE_MS,
                        start_id="0-0",
                        count=100,
                    )
                    entries.extend((eid, dict(f)) for eid, f in reply[1] if f is not None)
                    next_reclaim = time.monotonic() + 5
                fresh = await self.queue.redis.xreadgroup(
                    DISPATCHER_GROUP, self.consumer, {stream: ">"}, count=100, block=500
                )
                for _, items in fresh or []:
                    entries.extend((eid, dict(f)) for eid, f in items)
                if entries:
                    await self._fan_out(partition, entries)
                backoff.reset()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await _pause_after(exc, "dispatcher.fan_out_failed", backoff,
                                   partition=partition, stream=stream)  # fmt: skip

    async def _fan_out(self, partition: int, entries: list[tuple[str, dict[str, str]]]) -> None:
        """Two round trips per batch: the jobs' webhook settings and the tenants' endpoint
        subscriptions (one pipeline), then every fan-out script."""
        keys = self.queue.keys
        tenants = sorted({f["tenant"] for _, f in entries if f.get("tenant")})
        pipe = self.queue.redis.pipeline(transaction=False)
        for _, fields in entries:
            job_id = fields.get("job_id", "")
            key = keys.job(job_id) if is_job_id(job_id) else "splatq:none"
            pipe.hmget(key, ["webhook_url", "webhook_events"])
        for tenant in tenants:
            pipe.hgetall(keys.webhook_endpoints(tenant))
        replies = await pipe.execute()
        subscriptions = dict(zip(tenants, replies[len(entries) :], strict=True))
        created_ms = str(int(time.time() * 1000))
        batch = []
        for (entry_id, fields), (url, events) in zip(entries, replies, strict=False):
            endpoints = subscriptions.get(fields.get("tenant", "")) or {}
            messages = messages_of(fields, url or "", events or "", endpoints, created_ms)
            batch.append((entry_id, messages))
        await self.store.fan_out(partition, batch)

    # -- delivery ----------------------------------------------------------------------

    async def _deliver_loop(self, http: aiohttp.ClientSession) -> None:
        # Longer than any attempt can take (the total timeout), so only a dead dispatcher's
        # claim expires; then the message is simply due again (at-least-once).
        visibility_ms = int(self.settings.webhook_timeout_s * 2000) + 1000
        next_sample = 0.0
        backoff = Backoff(RETRY_MIN_S, RETRY_MAX_S)
        while True:
            try:
                found = 0
                for p in range(self.settings.partitions):
                    found += await self._claim_and_send(http, p, visibility_ms)
                if not found:
                    await asyncio.sleep(0.05)
                if self.metrics is not None and time.monotonic() >= next_sample:
                    await self._sample()
                    next_sample = time.monotonic() + 5
                backoff.reset()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await _pause_after(exc, "dispatcher.deliver_loop_failed", backoff)

    async def _claim_and_send(
        self, http: aiohttp.ClientSession, partition: int, visibility_ms: int
    ) -> int:
        """Claim at most as many due messages as there are free delivery slots (a claimed
        message's visibility timeout runs from the claim, so none waits for a slot), defer
        those whose target or tenant has its share in flight, gate the rest, and start their
        attempts. Returns the number claimed."""
        free = await self._reserve_slots(CLAIM_BATCH)
        admitted: list[Message] = []
        try:
            # Finding the due messages and claiming them is one script call (Redis's clock);
            # the gates of their endpoints are peeked at in the same round trip.
            peeked: list[Endpoint] = []
            claimed, peeks = await self.store.claim_due_with(
                partition,
                free,
                visibility_ms,
                functools.partial(self.gatekeeper.peek_calls, peeked=peeked),
            )
            self.gatekeeper.remember(claimed)
            # Shares before the breaker's gate: a message that waits anyway costs no gate
            # call and takes no half-open probe.
            for message in claimed:
                busy = self._share_used_up(message)
                if busy:
                    self._hold_back(message, Gate(busy))
                else:
                    self._count(message, 1)
                    admitted.append(message)
            gates = await self.gatekeeper.gates(admitted, dict(zip(peeked, peeks, strict=True)))
        except BaseException:
            for message in admitted:
                self._count(message, -1)
            for _ in range(free):
                self._slots.release()
            raise
        for message in admitted:
            gate = gates.get(message.id)
            if gate is not None and gate.verdict not in {"send", "probe"}:
                self._count(message, -1)
                self._hold_back(message, gate)
                continue
            free -= 1  # the attempt's task releases it
            attempt = self._deliver(http, message, gate)
            if tracing.enabled():
                attempt = self._traced(attempt, message)
            task = asyncio.create_task(attempt)
            self._in_flight.add(task)
            task.add_done_callback(functools.partial(self._finished, message))
        for _ in range(free):
            self._slots.release()
        return len(claimed)

    def _share_used_up(self, m: Message) -> str:
        """'busy' when the message's target already has its share of attempts in flight (a
        slow receiver), 'tenant_busy' when its tenant has (slow receivers, one level up),
        else ''. Such a message waits a moment without spending an attempt or a slot, so it
        never holds slots that other targets or tenants could use."""
        if self._busy.get(target_key(m), 0) >= self.settings.webhook_concurrency_per_endpoint:
            return "busy"
        tenant = tenant_key(m)
        if self._tenant_busy.get(tenant, 0) >= self._tenant_limit(tenant):
            return "tenant_busy"
        return ""

    def _count(self, m: Message, change: int) -> None:
        """Count an attempt in (+1) or out (-1) of its target's and its tenant's shares."""
        tenant = tenant_key(m)
        for counts, key in ((self._busy, target_key(m)), (self._tenant_busy, tenant)):
            left = counts.pop(key, 0) + change
            if left > 0:
                counts[key] = left
        if tenant in self._tenant_busy:
            self._tenant_since.setdefault(tenant, time.monotonic())
        else:
            self._tenant_since.pop(tenant, None)

    def _tenant_limit(self, tenant: str) -> int:
        """How many attempts `tenant` may have in flight now (counting it among the tenants
        with attempts in flight). A tenant whose attempts are quicker than a deferral is not
        limited: its slots turn over sooner than a deferred message would come back, so it
        holds none for long (and a single fast tenant keeps every slot). One not yet
        measured counts as slow."""
        s = self.settings
        if self._latency_ms.get(tenant, BUSY_DEFER_MS) < BUSY_DEFER_MS:
            return s.webhook_concurrency
        active = len(self._tenant_busy) + (tenant not in self._tenant_busy)
        return tenant_limit(s.webhook_concurrency, s.webhook_tenant_share, active)

    async def _reserve_slots(self, most: int) -> int:
        """Wait for one free delivery slot, then take every other free one (up to `most`)."""
        await self._slots.acquire()
        taken = 1
        while taken < most and not self._slots.locked():
            await self._slots.acquire()  # free: returns at once
            taken += 1
        return taken

    def _hold_back(self, m: Message, gate: Gate) -> None:
        """A message not sent now: its endpoint's circuit is open, or its target or its
        tenant has its share of attempts in flight (deferred, the attempt is given back); its
        endpoint is disabled (dead-lettered, `recover` sends it later) or deleted (dropped)."""
        if gate.verdict in {"defer", "busy", "tenant_busy"}:
            if gate.verdict == "defer":
                delay = defer_delay_ms(gate.until_ms, int(time.time() * 1000), self._rng)
                reason = "circuit_open"
            elif gate.verdict == "busy":
                limit = self.settings.webhook_concurrency_per_endpoint
                delay, reason = self._busy_delay(target_key(m), limit), "target_busy"
            else:
                tenant, reason = tenant_key(m), "tenant_busy"
                if tenant in self._latency_ms:
                    delay = self._busy_delay(tenant, self._tenant_limit(tenant))
                else:
                    # Not measured yet (its first attempts are in flight): look again after
                    # as long as they have been running (so a fast tenant's first surplus is
                    # back within milliseconds, unlimited, and a slow one's is looked at a
                    # few times, not booked far ahead on a guess).
                    since = self._tenant_since.get(tenant, time.monotonic())
                    waited = int((time.monotonic() - since) * 1000)
                    delay = min(max(FIRST_LOOK_MS, waited), MAX_BUSY_DEFER_MS)
                    delay += self._rng.randint(0, FIRST_LOOK_MS)
            result = AttemptResult(m, "deferred", delay, None, code=reason)
            if self.metrics is not None:
                self.metrics.deferred.labels(reason).inc()
        else:
            disabled = gate.verdict == "disabled"
            reason = f"endpoint disabled: {gate.reason}" if disabled else "endpoint deleted"
            outcome = "failed" if disabled else "dropped"
            attempt = self._attempt_record(m, gate.url or m.url, None, 0.0, outcome, reason, "")
            result = AttemptResult(
                m, outcome, 0, attempt, reason, code="endpoint_disabled" if disabled else ""
            )
            if self.metrics is not None:
                self.metrics.attempts.labels(outcome, "none").inc()
        done = self._submit(result)
        done.add_done_callback(_log_record_failure)

    def _busy_delay(self, key: str, limit: int) -> int:
        """How long a message to a busy target (or of a busy tenant) waits: its capacity is
        booked like a schedule (one attempt per latency/limit), so a backlog for a slow
        receiver is spread over the time it needs instead of being claimed and deferred over
        and over."""
        now = time.monotonic() * 1000
        step = max(BUSY_DEFER_MS, self._latency_ms.get(key, BUSY_DEFER_MS)) / limit
        booked = max(self._booked.get(key, now), now) + step
        self._booked[key] = booked
        return min(int(booked - now) + self._rng.randint(0, int(step)), MAX_BUSY_DEFER_MS)

    async def _sample(self) -> None:
        assert self.metrics is not None
        keys = self.queue.keys
        now_ms = int(time.time() * 1000)
        for p in range(self.settings.partitions):
            pipe = self.queue.redis.pipeline(transaction=False)
            pipe.zcard(keys.webhook_due(p))
            pipe.xlen(keys.webhook_dead_letters(p))
            pipe.zrange(keys.webhook_due(p), 0, 0, withscores=True)
            pending, dead, oldest = await pipe.execute()
            self.metrics.pending.labels(str(p)).set(pending)
            self.metrics.dead_letters.labels(str(p)).set(dead)
            lag_ms = max(0.0, now_ms - oldest[0][1]) if oldest else 0.0
            self.metrics.due_lag.labels(str(p)).set(lag_ms / 1000)
        self.metrics.open_circuits.set(
            sum(until > now_ms for until in self._open_circuits.values())
        )
        # Forget targets and tenants that are idle: their bookings are in the past.
        now = time.monotonic() * 1000
        for key, booked in list(self._booked.items()):
            if booked < now and key not in self._busy and key not in self._tenant_busy:
                del self._booked[key]
                self._latency_ms.pop(key, None)
        # Forget circuits not heard of for an hour (deleted endpoints never report closing).
        for endpoint_id, until in list(self._open_circuits.items()):
            if until < now_ms - 3_600_000:
                del self._open_circuits[endpoint_id]

    def _finished(self, m: Message, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._slots.release()
        self._count(m, -1)
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            # The message stays claimed and becomes due again after the visibility timeout.
            log.error("webhook.attempt_crashed", job_id=m.job_id, event_id=m.event_id,
                      target=m.target, attempt=m.attempts, partition=m.partition,
                      error=repr(exc), exc_info=exc)  # fmt: skip

    async def _traced(self, attempt: Coroutine[Any, Any, None], m: Message) -> None:
        """`attempt` inside a span in the job's trace (its id read from the job record)."""
        trace_id: str | None = None
        with contextlib.suppress(RedisError, OSError):  # the attempt goes ahead untraced
            key = self.queue.keys.job(m.job_id)
            trace_id = await self.queue.redis.hget(key, "trace_id")  # type: ignore[misc]
        attributes: dict[str, tracing.AttributeValue] = {
            "splatq.job_id": m.job_id,
            "splatq.tenant": m.tenant,
            "splatq.event_id": m.event_id,
            "splatq.event_type": m.event_type,
            "splatq.target": m.target,
            "splatq.attempt": m.attempts,
        }
        with tracing.span("webhook.attempt", trace_id or "", kind="client", attributes=attributes):
            await attempt

    async def _deliver(self, http: aiohttp.ClientSession, m: Message, gate: Gate | None) -> None:
        s = self.settings
        secrets: tuple[str, ...]
        if gate is None:
            url, secrets = m.url, await self._secrets.get(m.tenant)
        else:
            url, secrets = gate.url, gate.secrets
        # The endpoint's custom headers first: validated never to name these, and set below
        # them all the same, so they cannot override framing or signature.
        headers = signed_headers(secrets, m.event_id, int(time.time()), m.payload)
        if gate is not None:
            headers = {**gate.headers, **headers}
        headers["Content-Type"] = "application/json"
        headers["User-Agent"] = "splatq-webhooks/1"
        if tracing.enabled():
            headers.update(tracing.traceparent_headers())
        started = time.perf_counter()
        status: int | None = None
        snippet = ""
        try:
            async with http.post(
                url, data=m.payload, headers=headers, allow_redirects=False
            ) as resp:
                status = resp.status
                snippet = (await resp.content.read(SNIPPET_BYTES)).decode(errors="replace")
                decision = classify_response(
                    resp.status,
                    resp.headers.get("Retry-After"),
                    m.attempts,
                    s.webhook_max_attempts,
                    s.webhook_retry_base_ms,
                    s.webhook_retry_cap_ms,
                    self._rng,
                )
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, BlockedAddress):
                # The tenant sees the reason class only: the address an internal name
                # resolves to is the operator's business (their log), not the tenant's.
                log.warning("webhook.blocked", tenant=m.tenant, target=m.target,
                            host=exc.os_error.host, address=exc.os_error.address,
                            reason=exc.os_error.reason)  # fmt: skip
                decision = Decision("failed", reason=BLOCKED_REASON, code="blocked")
            else:
                decision = self._transient(m, f"connect error: {exc}")
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            # ValueError: a URL aiohttp cannot use (registered before a stricter check).
            decision = self._transient(m, f"{type(exc).__name__}: {exc}")
        latency_ms = round((time.perf_counter() - started) * 1000, 1)
        for key in (target_key(m), tenant_key(m)):
            self._latency_ms[key] = 0.8 * self._latency_ms.get(key, latency_ms) + 0.2 * latency_ms
        attempt = self._attempt_record(
            m, url, status, latency_ms, decision.outcome, decision.reason, snippet
        )
        if gate is not None and gate.verdict == "probe":
            attempt["probe"] = True
        # Counted before the record is written: the attempt happened either way.
        if self.metrics is not None:
            status_class = f"{status // 100}xx" if status else "none"
            self.metrics.attempts.labels(decision.outcome, status_class).inc()
            self.metrics.attempt_seconds.observe(latency_ms / 1000)
        recorded = await self._submit(
            AttemptResult(
                m,
                decision.outcome,
                decision.delay_ms,
                attempt,
                decision.reason,
                code=decision.code,
                health=decision.health if m.endpoint_id else "",
            )
        )
        log.info(
            "webhook.attempt",
            job_id=m.job_id,
            event_id=m.event_id,
            target=m.target,
            attempt=m.attempts,
            status_code=status,
            outcome=decision.outcome,
            message_status=recorded.status,
            latency_ms=latency_ms,
        )
        if recorded.health is not None:
            self._note_health(m, recorded.health)

    @staticmethod
    def _attempt_record(
        m: Message,
        url: str,
        status: int | None,
        latency_ms: float,
        outcome: str,
        reason: str,
        snippet: str,
    ) -> dict[str, Any]:
        return {
            "message_id": m.id, "event_id": m.event_id, "event": m.event_type,
            "target": m.target, "url": url, "attempt": m.attempts, "at": int(time.time()),
            "status_code": status, "latency_ms": latency_ms, "outcome": outcome,
            "error": reason or None, "response": snippet or None,
        }  # fmt: skip

    def _note_health(self, m: Message, health: Health) -> None:
        """Track circuits this process has seen open (the metric) and log transitions."""
        endpoint_id = m.endpoint_id
        was_open = endpoint_id in self._open_circuits
        if health.state == "open":
            self._open_circuits[endpoint_id] = health.open_until_ms
            if not was_open and self.metrics is not None:
                self.metrics.circuit_transitions.labels("open").inc()
            if not was_open:
                log.warning("webhook.circuit_opened", endpoint_id=endpoint_id, tenant=m.tenant,
                            open_until_ms=health.open_until_ms)  # fmt: skip
            return
        self._open_circuits.pop(endpoint_id, None)
        if health.state == "disabled":
            if self.metrics is not None:
                self.metrics.circuit_transitions.labels("disabled").inc()
            log.warning("webhook.endpoint_disabled", endpoint_id=endpoint_id, tenant=m.tenant)
        elif was_open and health.state == "closed":
            if self.metrics is not None:
                self.metrics.circuit_transitions.labels("closed").inc()
            log.info("webhook.circuit_closed", endpoint_id=endpoint_id, tenant=m.tenant)

    def _submit(self, result: AttemptResult) -> asyncio.Future[Recorded]:
        """Hand the result to the recorder, which writes everything finished at the same
        moment in one round trip (shared/engine/batcher.py, as the engine's committer)."""
        return self._results.submit(result)

    async def _record_batch(self, results: list[AttemptResult]) -> list[Recorded | Exception]:
        return await self.store.record_many(results)

    def _transient(self, m: Message, reason: str) -> Decision:
        s = self.settings
        return retry_or_fail(
            reason,
            m.attempts,
            s.webhook_max_attempts,
            s.webhook_retry_base_ms,
            s.webhook_retry_cap_ms,
            self._rng,
        )


async def _pause_after(exc: Exception, event: str, backoff: Backoff, **fields: Any) -> None:
    """Log a failed loop round and wait before the next. Redis being briefly away (a
    failover, a restart, a slot in migration) is a warning without a traceback, waited out
    with `backoff` (RETRY_MIN_S doubling to RETRY_MAX_S); anything else is an error with its
    traceback, retried after RETRY_MAX_S."""
    if is_transient_reply(exc):
        delay = backoff.next()
        log.warning(event, error=repr(exc), retry_in_s=delay, redis_unavailable=True, **fields)
        await asyncio.sleep(delay)
        return
    log.exception(event, **fields)
    backoff.reset()
    await asyncio.sleep(RETRY_MAX_S)


def _log_record_failure(done: asyncio.Future[Recorded]) -> None:
    exc = None if done.cancelled() else done.exception()
    if exc is not None:
        # The message stays claimed and becomes due again after the visibility timeout.
        log.error("webhook.record_failed", error=repr(exc), exc_info=exc)
