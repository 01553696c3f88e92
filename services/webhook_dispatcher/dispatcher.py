"""The webhook dispatcher: fans each outbox event out to its targets (today: the job's
`webhook_url`) and delivers every message signed, SSRF-guarded and retried durably.

Two loops: `fan_out` reads the events streams with its own consumer group; `deliver` claims
due messages and sends them. State lives in Redis only, so any process may die at any line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import time
from typing import Any

import aiohttp
import structlog

from services.webhook_dispatcher.metrics import DispatcherMetrics
from services.webhook_dispatcher.policy import (
    Decision,
    classify_response,
    retry_or_fail,
    should_deliver,
)
from shared.ids import is_job_id
from shared.queue import JobQueue
from shared.ssrf import BlockedAddress, guarded_connector
from shared.webhook_signing import signed_headers
from shared.webhook_store import DISPATCHER_GROUP, AttemptResult, Message, WebhookStore

log = structlog.get_logger("splatq.dispatcher")
EVENTS_RECLAIM_IDLE_MS = 30_000
SNIPPET_BYTES = 512


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
        self._secrets: dict[str, tuple[float, str]] = {}
        self._results: asyncio.Queue[tuple[AttemptResult, asyncio.Future[str]]] = asyncio.Queue()

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
            recorder = asyncio.create_task(self._record_loop())
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
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dispatcher.fan_out_failed", partition=partition)
                await asyncio.sleep(1)

    async def _fan_out(self, partition: int, entries: list[tuple[str, dict[str, str]]]) -> None:
        """Two round trips per batch: the jobs' webhook settings, then every fan-out script."""
        pipe = self.queue.redis.pipeline(transaction=False)
        for _, fields in entries:
            job_id = fields.get("job_id", "")
            key = self.queue.keys.job(job_id) if is_job_id(job_id) else "splatq:none"
            pipe.hmget(key, ["webhook_url", "webhook_events"])
        targets = await pipe.execute()
        batch = []
        for (entry_id, fields), (url, events) in zip(entries, targets, strict=True):
            event_type = fields.get("type", "")
            subscribed = tuple(e for e in (events or "").split(",") if e)
            messages = []
            if url and event_type and should_deliver(event_type, subscribed):
                messages.append({
                    "id": f"{fields['event_id']}:job", "event_id": fields["event_id"],
                    "event_type": event_type, "job_id": fields["job_id"],
                    "tenant": fields.get("tenant", ""), "url": url,
                    "payload": fields.get("payload", "{}"), "target": "job",
                    "created_ms": str(int(time.time() * 1000)),
                })  # fmt: skip
            batch.append((entry_id, messages))
        await self.store.fan_out(partition, batch)

    # -- delivery ----------------------------------------------------------------------

    async def _deliver_loop(self, http: aiohttp.ClientSession) -> None:
        # Longer than any attempt can take (the total timeout), so only a dead dispatcher's
        # claim expires; then the message is simply due again (at-least-once).
        visibility_ms = int(self.settings.webhook_timeout_s * 2000) + 1000
        next_sample = 0.0
        while True:
            try:
                found = 0
                now_ms = int(time.time() * 1000)
                for p in range(self.settings.partitions):
                    ids = await self.store.due(p, now_ms, 100)
                    if not ids:
                        continue
                    for message in await self.store.claim(p, ids, visibility_ms):
                        found += 1
                        await self._slots.acquire()
                        task = asyncio.create_task(self._deliver(http, message))
                        self._in_flight.add(task)
                        task.add_done_callback(self._finished)
                if not found:
                    await asyncio.sleep(0.05)
                if self.metrics is not None and time.monotonic() >= next_sample:
                    await self._sample()
                    next_sample = time.monotonic() + 5
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dispatcher.deliver_loop_failed")
                await asyncio.sleep(1)

    async def _sample(self) -> None:
        assert self.metrics is not None
        keys = self.queue.keys
        for p in range(self.settings.partitions):
            self.metrics.pending.labels(str(p)).set(
                await self.queue.redis.zcard(keys.webhook_due(p))
            )
            self.metrics.dead_letters.labels(str(p)).set(
                await self.queue.redis.xlen(keys.webhook_dead_letters(p))
            )

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._slots.release()
        if not task.cancelled() and task.exception() is not None:
            # The message stays claimed and becomes due again after the visibility timeout.
            log.error("webhook.attempt_crashed", error=repr(task.exception()))

    async def _deliver(self, http: aiohttp.ClientSession, m: Message) -> None:
        s = self.settings
        secret = await self._secret(m.tenant)
        headers = signed_headers([secret], m.event_id, int(time.time()), m.payload)
        headers["Content-Type"] = "application/json"
        headers["User-Agent"] = "splatq-webhooks/1"
        started = time.perf_counter()
        status: int | None = None
        snippet = ""
        try:
            async with http.post(
                m.url, data=m.payload, headers=headers, allow_redirects=False
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
                decision = Decision("failed", reason=f"blocked address: {exc.os_error}")
            else:
                decision = self._transient(m, f"connect error: {exc}")
        except (TimeoutError, aiohttp.ClientError) as exc:
            decision = self._transient(m, f"{type(exc).__name__}: {exc}")
        latency_ms = round((time.perf_counter() - started) * 1000, 1)
        attempt: dict[str, Any] = {
            "message_id": m.id, "event_id": m.event_id, "event": m.event_type, "url": m.url,
            "attempt": m.attempts, "at": int(time.time()), "status_code": status,
            "latency_ms": latency_ms, "outcome": decision.outcome,
            "error": decision.reason or None, "response": snippet or None,
        }  # fmt: skip
        # Counted before the record is written: the attempt happened either way.
        if self.metrics is not None:
            status_class = f"{status // 100}xx" if status else "none"
            self.metrics.attempts.labels(decision.outcome, status_class).inc()
            self.metrics.attempt_seconds.observe(latency_ms / 1000)
        new_status = await self._record(
            AttemptResult(m, decision.outcome, decision.delay_ms, attempt, decision.reason)
        )
        log.info(
            "webhook.attempt",
            job_id=m.job_id,
            event_id=m.event_id,
            attempt=m.attempts,
            status_code=status,
            outcome=decision.outcome,
            message_status=new_status,
            latency_ms=latency_ms,
        )

    async def _record(self, result: AttemptResult) -> str:
        """Hand the result to the recorder, which writes everything finished at the same
        moment in one round trip (as the engine's committer does)."""
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        await self._results.put((result, done))
        return await done

    async def _record_loop(self) -> None:
        while True:
            batch = [await self._results.get()]
            while not self._results.empty() and len(batch) < 256:
                batch.append(self._results.get_nowait())
            try:
                statuses = await self.store.record_many([r for r, _ in batch])
            except Exception as exc:
                statuses = [exc] * len(batch)
            for (_, done), status in zip(batch, statuses, strict=True):
                if done.done():
                    continue
                if isinstance(status, Exception):
                    done.set_exception(status)
                else:
                    done.set_result(status)

    async def _secret(self, tenant: str) -> str:
        """The tenant's secret, cached for a minute (two round trips saved per attempt)."""
        cached = self._secrets.get(tenant)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        secret = await self.store.tenant_secret(tenant)
        self._secrets[tenant] = (time.monotonic() + 60, secret)
        return secret

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
