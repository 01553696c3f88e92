"""Admission: what becomes of a submission once its image is valid. It is answered from the
result cache, joined to the job its key (or an identical submission) already has, or made a
new job -- quota reserved under the new job's id, input stored, enqueued, on the replicas
asked for -- or refused. No HTTP here: `admit` takes the submission's parts and answers one
of `Created | Joined | Cached | Refused`; the route translates that into a response.

The order is the guarantee's (docs/architecture.md, "A submission"):
1. the cache, unless the client opted out or its Idempotency-Key is already in use (a key
   in use goes on to its own job, or to 422 when the request differs);
2. the quota gate, under a fresh job id (the settler and the sweeper find the reservation by
   that id), or join-only when the tenant is at its quota but the key names a live job;
3. the input, stored before the job exists (a worker may start the job at once);
4. the enqueue script, retried while Redis answers "not now" (TRYAGAIN, CLUSTERDOWN); a
   claim whose job failed or was canceled is stepped over (MAX_STALE_CLAIM_HOPS);
5. a keyed job's content claim (identical unkeyed submissions join it), and WAIT for the
   replicas SPLATQ_REDIS_WAIT_REPLICAS names.
A reservation the submission did not use is given back at once (compensation).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import structlog
from prometheus_client import Counter

from splatq.services.gateway import quota_gate
from splatq.services.gateway.images import ValidatedImage
from splatq.services.gateway.problems import ApiError
from splatq.services.gateway.result_cache import CacheState, ResultCache
from splatq.services.gateway.submission import Params
from splatq.services.gateway.tenant_policies import TenantPolicies
from splatq.shared.engine.fairness import TenantPolicy
from splatq.shared.engine.jobs import QUALITY_STREAMS, JobRecord, JobSpec
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.producers import Producers
from splatq.shared.engine.queue_types import EnqueueResult
from splatq.shared.redis.replica_wait import ReplicaWait
from splatq.shared.redis.retry import while_refused
from splatq.shared.settings import Settings
from splatq.shared.storage.store import Storage, input_key
from splatq.shared.tenants.quota import QuotaBook, ReleaseReason

log = structlog.get_logger("splatq.gateway")

OVERLOAD_RETRY_AFTER_S = 5
# A claim whose job failed or was canceled is no claim (see `_enqueue`); how many such
# claims in a row a submission steps over before it gives up single-flight.
MAX_STALE_CLAIM_HOPS = 3
# How long a submission waits out a Redis refusal for now (TRYAGAIN, CLUSTERDOWN) before 503.
ENQUEUE_RETRY_BUDGET_S = 3.0


@dataclass(frozen=True, slots=True)
class Ask:
    """A valid submission: whose it is, the image (bytes and what validation found), what
    the client asked for, its Idempotency-Key header ('' without) and its trace."""

    tenant: str
    image: ValidatedImage
    data: bytes
    params: Params
    fingerprint: str
    idempotency_key: str = ""
    trace_id: str = ""


@dataclass(frozen=True, slots=True)
class Created:
    """A new job (202)."""

    job: JobRecord


@dataclass(frozen=True, slots=True)
class Joined:
    """The job this submission's key, or an identical submission, already has: 202 while it
    runs, 200 once completed (`cached` for an unkeyed twin's result)."""

    job: JobRecord
    keyed: bool


@dataclass(frozen=True, slots=True)
class Cached:
    """The result cache's answer (200): a completed identical job, `stale` past its soft TTL
    (one refresh then runs in the background)."""

    job: JobRecord
    stale: bool = False


@dataclass(frozen=True, slots=True)
class Refused:
    """Not admitted: the error says why (429 quota or backlog, 422 key reuse, 503)."""

    error: ApiError


Outcome = Created | Joined | Cached | Refused


@dataclass(frozen=True)
class Admission:
    """What admission needs, handed over once (the gateway app builds it)."""

    settings: Settings
    queue: Producers  # the job store's producer role (a JobQueue is one too)
    storage: Storage
    quotas: QuotaBook
    cache: ResultCache
    policies: TenantPolicies
    replica_wait: ReplicaWait
    submissions: Counter  # splatq_gateway_submissions_total{outcome}

    async def admit(self, ask: Ask) -> Outcome:
        try:
            return await self._admit(ask)
        except ApiError as error:
            return Refused(error)

    async def _admit(self, ask: Ask) -> Outcome:
        params, tenant, queue = ask.params, ask.tenant, self.queue
        content_key = await self.cache.content_key(
            queue.redis, tenant, ask.image.sha256, params.quality, params.progressive
        )
        idem = ask.idempotency_key
        logical_key = f"idempotency:{tenant}:{idem}" if idem else ""
        stream = QUALITY_STREAMS[params.quality]
        # The tenant's scheduling terms: a capped tenant's jobs and claims live in its home
        # partition, so every claim lookup below routes with them.
        policy = await self.policies.get(tenant, stream)
        looked = None
        if params.cache and not (idem and await self._key_in_use(tenant, logical_key, policy)):
            looked = await self.cache.lookup(queue, tenant, content_key, policy)
            content_key = looked.key  # past the hard TTL: the successor key (see result_cache)
        if not idem and params.cache:
            logical_key = content_key  # single-flight: identical submissions share one job
        spec = JobSpec(
            tenant=tenant,
            quality=params.quality,
            params=params.canonical(),
            metadata=params.metadata or {},
            input_ref=input_key(ask.image.sha256, ask.image.extension),
            input_sha256=ask.image.sha256,
            model=self.settings.model,
            webhook_url=params.webhook_url,
            webhook_events=params.webhook_events,
            trace_id=ask.trace_id,
            idempotency_key=logical_key,
            request_fingerprint=ask.fingerprint,
        )
        if looked is not None and looked.job is not None:
            self.submissions.labels("cached").inc()
            stale = looked.state is CacheState.STALE
            if stale and not looked.refreshing:
                await self._refresh(spec, looked.key, ask.data, policy)
            return Cached(looked.job, stale)
        outcome = await self._enqueue(spec, ask.data, stream, bool(idem), policy)
        if isinstance(outcome, Created) and idem and params.cache:
            await self._claim_content(tenant, content_key, outcome.job.id, policy)
        await self._confirm_replicated(outcome.job.id)
        return outcome

    async def _key_in_use(self, tenant: str, logical_key: str, policy: TenantPolicy) -> bool:
        claim = await self.queue.claim_status(logical_key, policy, tenant)
        return claim is not None and claim[0] != "FAILED"

    async def _claim_content(
        self, tenant: str, content_key: str, job_id: str, policy: TenantPolicy
    ) -> None:
        """Record a new keyed job under its content key too, so that identical submissions
        without the key join it while it runs and are answered from the cache once it
        completed. The engine moves one claim per job (here the Idempotency-Key's); this one
        stays PENDING, so readers judge by the job's status (the result cache, and `_enqueue`
        steps over a claim whose job failed). Losing it to an identical job that holds it
        already is fine."""
        await self.queue.claim(content_key, job_id, policy, tenant)

    async def _refresh(self, spec: JobSpec, key: str, data: bytes, policy: TenantPolicy) -> None:
        """A stale hit's one background refresh: a job of the tenant's under the stale job's
        successor key `key` (identical stale hits share it, so a hundred make one job),
        without the request's webhook or metadata (it is the cache's, not this request's).
        It is the tenant's like any job (quota, backlog share); a refusal leaves the stale
        answer standing and is counted, never returned."""
        refresh = dataclasses.replace(
            spec, idempotency_key=key, webhook_url="", webhook_events=(), metadata={}
        )
        try:
            await self._enqueue(refresh, data, spec.stream, False, policy)
        except ApiError as exc:
            self.submissions.labels("refresh_refused").inc()
            log.info("cache.refresh_refused", code=exc.code, tenant=spec.tenant)

    async def _enqueue_once(
        self, spec: JobSpec, limit: int, tenant_limit: int, policy: TenantPolicy
    ) -> EnqueueResult:
        """Reserve the job's GPU quota under a fresh job id (429 `quota_exceeded`), then
        enqueue, waiting out a refusal for now (a slot in migration answers TRYAGAIN until its
        keys have moved; a failover, CLUSTERDOWN) for up to ENQUEUE_RETRY_BUDGET_S: the script
        did not run, so sending it again is safe. Longer than that, the client gets 503 (and
        the reservation, whose job may or may not exist, is left to the settler's sweep). A
        submission that did not create its job gives the reservation back at once."""
        queue = self.queue
        job_id = queue.new_job_id(spec, policy)
        gate = await self._reserve(spec, job_id, policy)
        result = await while_refused(
            lambda: queue.enqueue(
                spec,
                max_backlog=limit,
                max_tenant_backlog=tenant_limit,
                policy=policy,
                job_id=job_id,
                join_only=not gate.reserved,
            ),
            ENQUEUE_RETRY_BUDGET_S,
            "enqueue",
        )
        if result.not_joined and gate.refusal is not None:
            # The job the key named ended between the gate and the enqueue: no job, no
            # reservation.
            self.submissions.labels("quota_exceeded").inc()
            raise gate.refusal
        if gate.reserved and not result.created:
            await self.quotas.release(spec.tenant, job_id, ReleaseReason.REFUSED)
        return result

    async def _reserve(
        self, spec: JobSpec, job_id: str, policy: TenantPolicy | None
    ) -> quota_gate.Gate:
        """Reserve the job's estimate, or answer that the submission may only join the job
        its idempotency key names (the tenant is at its quota but that job exists), else 429
        `quota_exceeded`."""
        await self.quotas.note_tenant_once(spec.tenant)
        amount = quota_gate.estimate_ms(
            self.settings.quota_estimates_ms, spec.quality, spec.params.get("progressive") is True
        )
        reservation = await self.quotas.reserve(spec.tenant, job_id, amount)
        if reservation.granted:
            return quota_gate.Gate(reserved=True)
        refusal = quota_gate.quota_exceeded(reservation.usage, amount)
        if spec.idempotency_key:
            claim = await self.queue.claim_status(spec.idempotency_key, policy, spec.tenant)
            if claim is not None and claim[0] != "FAILED":
                # Join only: the enqueue script creates nothing if the claim ended meanwhile
                # (a cancel raced this request), so no job ever runs without a reservation.
                return quota_gate.Gate(reserved=False, refusal=refusal)
        self.submissions.labels("quota_exceeded").inc()
        raise refusal

    async def _enqueue(
        self, spec: JobSpec, data: bytes, stream: StreamName, keyed: bool, policy: TenantPolicy
    ) -> Created | Joined:
        """Store the input, enqueue: the new job, or the one the claim names."""
        settings = self.settings
        limit = (
            settings.max_backlog_interactive
            if stream == StreamName.INTERACTIVE
            else settings.max_backlog_synthesis
        )
        tenant_limit = settings.tenant_backlog_limit(limit)
        # Store the input first: once the job is in the stream a worker may start it at once.
        # Inputs are content-addressed, so a repeat or a concurrent twin writes the same object
        # (storing one that exists refreshes its age, which retention's grace relies on). A
        # refusal (quota, overload) leaves it: a concurrent identical submission may have
        # found it stored and named it in its job; retention deletes it once no job needs it
        # and it is past its age (docs/operations.md#retention).
        await self.storage.put_if_absent(spec.input_ref, data)
        result = await self._enqueue_once(spec, limit, tenant_limit, policy)
        job = result.job
        hops = 0
        while not keyed and not result.created and not result.overloaded:
            job = await self.queue.get(result.job_id)
            if job is None or job.status not in {"failed", "canceled"}:
                break
            if hops == MAX_STALE_CLAIM_HOPS:
                spec = dataclasses.replace(spec, idempotency_key="")  # compute, no claim
            else:
                # The claim outlived its job's failure (a keyed job's content claim, a dead
                # letter's claim): a failed or canceled job never blocks a resubmission. The
                # successor key keeps identical resubmissions on one new job.
                hops += 1
                spec = dataclasses.replace(
                    spec, idempotency_key=f"{spec.idempotency_key}|after:{result.job_id}"
                )
            result = await self._enqueue_once(spec, limit, tenant_limit, policy)
            job = result.job
        if result.overloaded:
            raise self._overloaded(result, stream)
        job = job or await self.queue.get(result.job_id)
        if job is None:  # the claimed job expired between the claim and this read
            raise ApiError(503, "overloaded", "retry the request", {"Retry-After": "1"})
        if result.created:
            self.submissions.labels("created").inc()
            log.info(
                "job.submitted",
                job_id=job.id,
                tenant=job.tenant,
                stream=stream.value,
                quality=spec.quality,
            )
            return Created(job)
        if keyed and job.request_fingerprint != spec.request_fingerprint:
            self.submissions.labels("idempotency_key_reused").inc()
            raise ApiError(
                422,
                "idempotency_key_reused",
                "this Idempotency-Key was used with a different request",
            )
        self.submissions.labels("cached" if job.status == "completed" else "duplicate").inc()
        return Joined(job, keyed)

    def _overloaded(self, result: EnqueueResult, stream: StreamName) -> ApiError:
        if result.overload_scope == "tenant":
            # This tenant's own share of the queue is full; every other tenant still submits.
            self.submissions.labels("tenant_backlog_full").inc()
            return ApiError(
                429,
                "tenant_backlog_full",
                f"this tenant already has {result.backlog} unfinished {stream.value} jobs, its"
                " share of the queue; retry when some have finished",
                {"Retry-After": str(OVERLOAD_RETRY_AFTER_S)},
            )
        self.submissions.labels("overloaded").inc()
        return ApiError(
            503,
            "overloaded",
            f"the {stream.value} queue is full ({result.backlog} jobs); retry later",
            {"Retry-After": str(OVERLOAD_RETRY_AFTER_S)},
        )

    async def _confirm_replicated(self, job_id: str) -> None:
        """With SPLATQ_REDIS_WAIT_REPLICAS, a job is accepted only once that many replicas
        have it (a failover then cannot lose it); otherwise 503, and the client's retry of
        the same submission finds the same job (single-flight or its Idempotency-Key) and
        waits again."""
        wait = self.replica_wait
        if not wait.enabled:
            return
        acked = await wait.after_write(self.queue.keys.job(job_id), job_id=job_id)
        if acked < wait.replicas:
            self.submissions.labels("not_replicated").inc()
            raise ApiError(
                503,
                "not_replicated",
                f"the job is stored but not yet on {wait.replicas} Redis replica(s); retry"
                " the same request",
                {"Retry-After": "1"},
            )
