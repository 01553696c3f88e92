"""One job's call to a vendor: a permit from the fleet-wide lane, the create request under an
idempotency key derived from the job, the prediction id noted in the job before any wait,
the wait (polls with backoff, or the vendor's webhook), cancel forwarded, the output fetched
and converted. A run that takes over a killed run's job finds the noted prediction and
resumes it: one prediction per call, however often its worker dies.

How each answer is handled (shared/vendor/policy.py): a 429/503 with Retry-After pauses the
lane and the job waits -- here when the pause is short, else deferred on the delayed set --
without an attempt counted; a transient failure ends the run retryable (the engine's
full-jitter backoff); a permanent one fails the job with the vendor's sanitised message.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import structlog
from redis.asyncio import Redis

from splatq.services.gpu_worker.remote.client import Answer, VendorClient
from splatq.services.gpu_worker.remote.metrics import UpstreamMetrics
from splatq.shared.engine.job_context import JobContext
from splatq.shared.errors import (
    Deferred,
    JobCanceled,
    LeaseLost,
    PermanentError,
    TransientError,
)
from splatq.shared.vendor.config import VendorConfig
from splatq.shared.vendor.limiter import NotYet, Permit, VendorLane, new_permit_id
from splatq.shared.vendor.notes import call_notes, note_name
from splatq.shared.vendor.policy import (
    UPSTREAM_BAD_RESPONSE,
    UPSTREAM_PREDICTION_CANCELED,
    UPSTREAM_PREDICTION_FAILED,
    UPSTREAM_PREDICTION_LOST,
    UPSTREAM_TIMEOUT,
    UPSTREAM_UNAVAILABLE,
    Charge,
    Kind,
    Verdict,
    charge,
    idempotency_key,
    jittered_until,
    poll_delays,
    sanitize,
)
from splatq.shared.vendor.shape import (
    CANCELED,
    FAILED,
    PENDING,
    SUCCEEDED,
    Prediction,
    ShapeError,
    parse_prediction,
)

log = structlog.get_logger("splatq.remote")
# Polls of one prediction that may fail in a row (the vendor's GET) before the run gives up
# (retryable: the next run resumes the same prediction).
MAX_POLL_FAILURES = 8
WEBHOOK_INBOX_POLL_S = 0.25


@dataclass(slots=True)
class Lane:
    """What a call needs of its process: the vendor's client and lane, Redis (the webhook
    inbox), metrics, randomness, and the process's table of held slots (renewed by it)."""

    config: VendorConfig
    client: VendorClient
    lane: VendorLane
    redis: Redis
    metrics: UpstreamMetrics | None
    rng: random.Random
    held: dict[str, str]  # member -> tenant: the slots this process holds
    image_ref: Callable[[str, bytes], Any]  # (job id, image) -> awaitable URL or data URI


@dataclass(frozen=True, slots=True)
class Outcome:
    """A finished prediction's output bytes and what its quota charge is."""

    output: bytes
    charge: Charge
    latency_ms: int


class RemoteCall:
    def __init__(self, lane: Lane, ctx: JobContext, call: str, image: bytes, digest: str) -> None:
        self.lane, self.ctx, self.call = lane, ctx, call
        self.image, self.digest = image, digest
        self.member = f"{ctx.job.id}:{call}"
        self.tenant = ctx.job.tenant
        self.vendor = lane.config.name
        self.notes = call_notes(ctx.job.notes, call)
        self.log = ctx.log.bind(vendor=self.vendor, call=call)
        self._in_line = False  # waiting in the lane's fleet-wide line

    # -- the call --------------------------------------------------------------------

    async def run(self) -> Outcome:
        keep_slot = False
        try:
            pid = self.notes.get("pred", "")
            resumable = self.notes.get("digest") == self.digest and self.notes.get("status") in (
                "",
                PENDING,
                SUCCEEDED,
            )
            result: Prediction | bytes
            if pid and resumable:
                if self.notes.get("status") != SUCCEEDED:
                    await self._adopt(pid)
                result, latency = await self._wait(pid, int(self.notes.get("submitted", "0")))
            else:
                result, latency = await self._create()
            return await self._finish(result, latency)
        except (LeaseLost, asyncio.CancelledError):
            # Another run has (or will have) the job and resumes the prediction: its slot
            # stays held for it (it adopts it); a drain's release re-runs it the same way.
            keep_slot = self.member in self.lane.held
            raise
        finally:
            if not keep_slot:
                await self._release()

    async def _note(self, fields: dict[str, str], event: bool = False) -> None:
        self.notes.update(fields)
        named = {note_name(self.call, k): v for k, v in fields.items()}
        upstream = None
        if event:
            upstream = {
                "upstream": {
                    "vendor": self.vendor,
                    "request_id": self.notes.get("rid") or self.notes.get("pred") or None,
                    "latency_ms": int(self.notes["lat"]) if self.notes.get("lat") else None,
                    "prediction_id": self.notes.get("pred") or None,
                    "status": self.notes.get("status") or None,
                }
            }
        await self.ctx.note(named, upstream)

    # -- permits -------------------------------------------------------------------------

    async def _admit(self) -> Permit:
        """Wait for the lane's permit: in line here for the rate and the slots; here or on
        the delayed set (Deferred: no attempt counted) while the lane is paused or its circuit
        open -- for at most breaker.max_wait_s since the call first met one, then fail."""
        permit_id = new_permit_id()
        started = time.monotonic()
        while True:
            self.ctx.raise_if_stopped()
            answer = await self.lane.lane.acquire(
                self.member, self.tenant, permit_id, self.ctx.job.created_at_ms
            )
            if isinstance(answer, Permit):
                self.lane.held[self.member] = self.tenant
                self._in_line = False
                if self.lane.metrics is not None:
                    wait_s = time.monotonic() - started
                    self.lane.metrics.permit_wait.labels(self.vendor).observe(wait_s)
                return answer
            self._in_line = answer.reason not in ("tenant_slots", "tenant_rate")
            if answer.reason in ("paused", "open"):
                await self._wait_out(answer)
            else:
                await asyncio.sleep(answer.delay_ms / 1000 * self.lane.rng.uniform(1.0, 1.1))

    async def _wait_out(self, answer: NotYet) -> None:
        """A paused lane or an open circuit: wait here when it ends soon, else defer; past
        the bounded wait, UPSTREAM_UNAVAILABLE (dead-lettered: a redrive policy brings the
        job back once the circuit is closed)."""
        cfg = self.lane.config
        now_ms = int(time.time() * 1000)
        since = int(self.notes.get("since") or 0)
        if not since:
            since = now_ms
            await self._note({"since": str(since), "vendor": self.vendor})
        if now_ms - since > cfg.breaker.max_wait_s * 1000:
            what = "its circuit open" if answer.reason == "open" else "it asked us to slow down"
            raise PermanentError(
                f"{self.vendor} has been unavailable ({what}) for over"
                f" {cfg.breaker.max_wait_s:g} s",
                code=UPSTREAM_UNAVAILABLE,
            )
        remaining = max(0, answer.until_ms - now_ms)
        resume = jittered_until(answer.until_ms, remaining, cfg.wait.jitter, self.lane.rng)
        if remaining > cfg.wait.inline_max_s * 1000:
            await self._release()  # leaves the line
            if self.lane.metrics is not None:
                self.lane.metrics.deferrals.labels(self.vendor, answer.reason).inc()
            raise Deferred(resume - now_ms, f"upstream_{answer.reason}")
        await asyncio.sleep(max(0, resume - now_ms) / 1000)

    async def _adopt(self, pid: str) -> None:
        """Resume a prediction an earlier run created: its slot is ours (the vendor counts
        the prediction whether or not we do)."""
        await self.lane.lane.hold(self.member, self.tenant, adopt=True)
        self.lane.held[self.member] = self.tenant
        self.log.info("upstream.resumed", prediction_id=pid)

    async def _release(self) -> None:
        """Give the slot back (and leave the line, if waiting in it)."""
        if self.lane.held.pop(self.member, None) is None and not self._in_line:
            return
        self._in_line = False
        try:
            await self.lane.lane.release(self.member, self.tenant)
        except Exception as exc:  # the lease lapses on its own: never fail a job for it
            self.log.warning("upstream.release_failed", error=str(exc)[:200])

    # -- create ------------------------------------------------------------------------

    async def _create(self) -> tuple[Prediction | bytes, int]:
        cfg = self.lane.config
        sequence = int(self.notes.get("seq") or 0)
        key = idempotency_key(self.ctx.job.id, self.call, self.digest, sequence)
        image_ref = ""
        if cfg.request.shape == "json":
            image_ref = await self.lane.image_ref(self.ctx.job.id, self.image)
        while True:
            await self._admit()
            answer = await self.lane.client.create(self.image, image_ref, key, cfg.webhook_url)
            outcome = await self._judge("create", answer)
            if outcome is None:
                continue  # slowed down briefly, waited here: ask for a new permit
            assert isinstance(answer, Answer)
            return await self._created(answer)

    async def _judge(self, call: str, answer: Answer | Verdict) -> Answer | None:
        """Report the answer to the lane; an Answer goes on, a short slow-down is waited
        out here (None), anything else raises."""
        metrics = self.lane.metrics
        member, report_id = self.member, new_permit_id()
        if isinstance(answer, Answer):
            await self.lane.lane.report("success", member, report_id)
            if self.notes.get("since"):  # the vendor answers again: the bounded wait is over
                await self._note({"since": ""})
            if metrics is not None:
                metrics.answers.labels(self.vendor, call, "ok", "").inc()
                metrics.latency.labels(self.vendor, call).observe(answer.latency_ms / 1000)
            return answer
        if metrics is not None:
            metrics.answers.labels(self.vendor, call, answer.kind.value, answer.code).inc()
        pause_until = 0
        if answer.kind is Kind.SLOW_DOWN:
            pause_until = int(time.time() * 1000 + answer.retry_after_s * 1000)
        # Reported while the slot is held: a probe's report must find it still the probe.
        state = await self.lane.lane.report(answer.breaker_outcome, member, report_id, pause_until)
        await self._release()  # the vendor created nothing: the slot is free again
        if metrics is not None and state.opened:
            metrics.breaker_opened.labels(self.vendor).inc()
        self.log.warning(
            "upstream.refused", call=call, code=answer.code, kind=answer.kind.value,
            retry_after_s=answer.retry_after_s, message=answer.message,
        )  # fmt: skip
        if answer.kind is Kind.SLOW_DOWN:
            if metrics is not None:
                metrics.throttled.labels(self.vendor).inc()
                metrics.pauses.labels(self.vendor).inc()
            # The lane is paused now: the next permit waits it out (here or deferred).
            return None
        if answer.kind is Kind.TRANSIENT:
            raise TransientError(answer.message, code=answer.code)
        raise PermanentError(answer.message, code=answer.code)

    async def _created(self, answer: Answer) -> tuple[Prediction | bytes, int]:
        cfg = self.lane.config
        if cfg.response.mode == "sync" and not answer.content_type.endswith("json"):
            await self._note({"vendor": self.vendor, "rid": answer.request_id,
                              "digest": self.digest, "status": SUCCEEDED})  # fmt: skip
            return answer.body, answer.latency_ms
        default = SUCCEEDED if cfg.response.mode == "sync" else ""
        prediction = self._parse(answer, default)
        submitted = int(time.time() * 1000) - answer.latency_ms
        if prediction.status == PENDING and not prediction.id:
            raise TransientError(
                "the vendor's answer has no prediction id", code=UPSTREAM_BAD_RESPONSE
            )
        # Noted before any wait: a run that takes over after a crash resumes this prediction.
        await self._note(
            {
                "vendor": self.vendor,
                "pred": prediction.id,
                "digest": self.digest,
                "rid": answer.request_id,
                "submitted": str(submitted),
                "status": prediction.status,
            },
            event=True,
        )
        self.log.info("upstream.created", prediction_id=prediction.id,
                      request_id=answer.request_id, latency_ms=answer.latency_ms)  # fmt: skip
        if prediction.status != PENDING:
            return prediction, answer.latency_ms
        return await self._wait(prediction.id, submitted)

    def _parse(self, answer: Answer, default_status: str = "") -> Prediction:
        try:
            return parse_prediction(self.lane.config.response, answer.json(), default_status)
        except (ShapeError, orjson.JSONDecodeError) as exc:
            raise TransientError(
                sanitize(f"unreadable vendor answer: {exc}"), code=UPSTREAM_BAD_RESPONSE
            ) from None

    # -- wait ----------------------------------------------------------------------------

    async def _wait(self, pid: str, submitted_ms: int) -> tuple[Prediction, int]:
        """Until the prediction ends: its webhook (the gateway's inbox) or polls with backoff;
        a cancel is forwarded; past poll.timeout_s it counts as failed (a new one next)."""
        cfg = self.lane.config
        delays = poll_delays(cfg.poll.initial_s, cfg.poll.max_s, cfg.poll.factor, self.lane.rng)
        deadline_ms = (submitted_ms or int(time.time() * 1000)) + cfg.poll.timeout_s * 1000
        failures, next_poll = 0, 0.0
        while True:
            if self.ctx.cancel_requested:
                await self._forward_cancel(pid)
                raise JobCanceled(self.ctx.job.id)
            self.ctx.raise_if_stopped()
            prediction: Prediction | None = None
            if cfg.webhook.enabled:
                prediction = await self._inbox(pid)
            now = time.monotonic()
            if prediction is None and now >= next_poll:
                answer = await self.lane.client.get(pid)
                if isinstance(answer, Verdict):
                    failures = await self._poll_failed(pid, answer, failures)
                else:
                    failures, prediction = 0, self._parse(answer)
                gap = cfg.webhook.fallback_poll_s if cfg.webhook.enabled else next(delays)
                next_poll = time.monotonic() + gap
            if prediction is not None and prediction.status != PENDING:
                latency = max(0, int(time.time() * 1000) - submitted_ms) if submitted_ms else 0
                return prediction, latency
            if time.time() * 1000 > deadline_ms:
                await self._forward_cancel(pid)
                await self._note({"seq": str(int(self.notes.get("seq") or 0) + 1),
                                  "status": FAILED})  # fmt: skip
                raise TransientError(
                    f"prediction {pid} ran past {cfg.poll.timeout_s:g} s", code=UPSTREAM_TIMEOUT
                )
            pause = WEBHOOK_INBOX_POLL_S if cfg.webhook.enabled else next_poll - time.monotonic()
            await asyncio.sleep(max(0.0, pause))

    async def _poll_failed(self, pid: str, answer: Verdict, failures: int) -> int:
        """A failed GET of the prediction: a vendor that forgot it (404) means a new one; a
        few transient failures are polled through; the rest end the run."""
        if answer.code == "UPSTREAM_REJECTED" and answer.message.startswith("HTTP 404"):
            await self._note({"seq": str(int(self.notes.get("seq") or 0) + 1), "status": FAILED})
            raise TransientError(f"the vendor lost prediction {pid}", code=UPSTREAM_PREDICTION_LOST)
        if answer.kind is Kind.PERMANENT:
            raise PermanentError(answer.message, code=answer.code)
        failures += 1
        self.log.warning("upstream.poll_failed", code=answer.code, failures=failures)
        if failures >= MAX_POLL_FAILURES:
            raise TransientError(answer.message, code=answer.code)
        return failures

    async def _inbox(self, pid: str) -> Prediction | None:
        raw = await self.lane.redis.get(self.lane.lane.keys.inbox(pid))
        if not raw:
            return None
        try:
            return parse_prediction(self.lane.config.response, orjson.loads(raw))
        except (ShapeError, orjson.JSONDecodeError):
            return None

    async def _forward_cancel(self, pid: str) -> None:
        answer = await self.lane.client.cancel(pid)
        outcome = "none" if answer is None else "ok" if isinstance(answer, Answer) else "failed"
        if self.lane.metrics is not None:
            self.lane.metrics.cancels.labels(self.vendor, outcome).inc()
        self.log.info("upstream.cancel_forwarded", prediction_id=pid, outcome=outcome)

    # -- the end ---------------------------------------------------------------------------

    async def _finish(self, result: Prediction | bytes, latency_ms: int) -> Outcome:
        await self._release()  # the vendor no longer counts it
        cfg = self.lane.config
        if isinstance(result, bytes):
            owed = charge(None, None, 0, latency_ms)
            await self._note({"lat": str(latency_ms), "charge": str(owed.ms),
                              "basis": owed.basis}, event=True)  # fmt: skip
            return Outcome(result, owed, latency_ms)
        if result.status in (FAILED, CANCELED):
            message = sanitize(result.error or f"the prediction ended {result.raw_status}")
            await self._note({"seq": str(int(self.notes.get("seq") or 0) + 1),
                              "status": result.status, "lat": str(latency_ms)})  # fmt: skip
            code = (
                UPSTREAM_PREDICTION_FAILED
                if result.status == FAILED
                else UPSTREAM_PREDICTION_CANCELED
            )
            raise TransientError(message, code=code)
        if not result.output_url:
            raise TransientError("the prediction succeeded without an output URL",
                                 code=UPSTREAM_BAD_RESPONSE)  # fmt: skip
        owed = charge(result.predict_time_s, result.cost, cfg.response.ms_per_cost, latency_ms)
        await self._note({"status": SUCCEEDED, "lat": str(latency_ms), "charge": str(owed.ms),
                          "basis": owed.basis}, event=True)  # fmt: skip
        data = await self.lane.client.fetch(result.output_url)
        if isinstance(data, Verdict):
            # The prediction is done: a retry resumes it and fetches again (a fresh URL).
            exc_type = PermanentError if data.kind is Kind.PERMANENT else TransientError
            raise exc_type(data.message, code=data.code)
        self.log.info("upstream.done", prediction_id=result.id, latency_ms=latency_ms,
                      charge_ms=owed.ms, basis=owed.basis, bytes=len(data))  # fmt: skip
        return Outcome(data, owed, latency_ms)
