"""The result cache: an identical request answered from an identical completed job, fresh until
the soft TTL, stale until the hard TTL (answered at once with `stale: true`, and one refresh
job made in the background), a miss after it. Keys are versioned by the model/backend version
and a purge generation per version (`POST /v1/admin/cache/purge`).

Where things live: a submission's *content key* (tenant, image, quality, version,
generation) is the single-flight claim identical submissions share (the engine's idempotency
claim, as before); the cache *entry* (`splatq:{pN}:rcache:<digest>`, one string per content
key, in the slot of the content key's own claim so that one `MGET` reads both) names the job
that currently answers for it. A refresh, and a miss past the hard TTL, create
their job under the *successor key* of the job they replace (`<content key>|refresh:<job>`),
so concurrent stale hits and misses share one refresh job (its claim); once it completed, the
next lookup moves the entry onto it (an unconditional SET of the successor: concurrent movers
write the same value, and a stale mover only costs the next lookup one hop).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass
from enum import StrEnum

import structlog
from aiohttp import web
from prometheus_client import Counter
from redis.asyncio import Redis

from splatq.shared.engine.claims import Claim, answering, claim_partitions, parse_claim
from splatq.shared.engine.fairness import TenantPolicy
from splatq.shared.engine.jobs import JobRecord
from splatq.shared.engine.keys import KeySchema
from splatq.shared.engine.producers import Producers
from splatq.shared.engine.states import TERMINAL
from splatq.shared.settings import Settings
from splatq.shared.vendor.config import load_vendor_config

log = structlog.get_logger("splatq.gateway.cache")
# How many completed refreshes a lookup follows before it stops (the entry normally points at
# the newest; each hop is one claim read and one job read).
MAX_HOPS = 4
# A purge reaches every gateway within this long (the generation is cached per process).
GENERATION_CACHE_S = 1.0


class CacheState(StrEnum):
    HIT = "hit"
    STALE = "stale"
    MISS = "miss"


@dataclass(frozen=True, slots=True)
class Lookup:
    state: CacheState
    # The logical key a miss is computed under (single-flight), and a stale hit's refresh.
    key: str
    job: JobRecord | None = None
    # A refresh of this entry is already running (a stale hit starts none).
    refreshing: bool = False


def backend_version(settings: Settings) -> str:
    """The version results are cached under: a hosted model's (its vendor, model and version,
    from SPLATQ_REMOTE_CONFIG), else the model and its checkpoint, as cache keys always had."""
    if settings.model == "remote" and settings.remote_config:
        return load_vendor_config(settings.remote_config).version
    return f"{settings.model}:{settings.model_checkpoint}"


@dataclass(frozen=True, slots=True)
class CacheKeys:
    prefix: str = "splatq"

    def entry(self, keys: KeySchema, content_key: str) -> str:
        """STRING: the id of the completed job answering for a content key. It carries the
        hash tag of the content key's own partition, the slot its claim lives in (shared/engine/
        claims.py), so one `MGET` reads the entry and that claim together on a cluster too."""
        partition = keys.partition_for(content_key)
        return f"{keys.tag(partition)}:rcache:{keys.digest(content_key)}"

    def generation(self, version: str) -> str:
        """STRING (counter): the purge generation of one version's cache keys."""
        digest = hashlib.sha256(version.encode()).hexdigest()[:32]
        return f"{self.prefix}:rcache-gen:{digest}"


def successor_key(content_key: str, job_id: str) -> str:
    return f"{content_key}|refresh:{job_id}"


def content_key(
    tenant: str, image_sha256: str, quality: str, version: str, generation: int, progressive: bool
) -> str:
    """The cache and single-flight key of a submission. A progressive job has its own: an
    identical submission that asked for `preview_ready` must not join a job that will never
    send it. Generation 0 keeps the keys of before purges existed."""
    material = f"{image_sha256}|{quality}|{version}" + ("|progressive" if progressive else "")
    if generation:
        material += f"|g{generation}"
    return f"content:{tenant}:{hashlib.sha256(material.encode()).hexdigest()}"


def judge(job: JobRecord, now_ms: int, soft_ms: int, hard_ms: int) -> CacheState:
    """Fresh, stale or expired, by the age of the job's result (pure)."""
    age = now_ms - (job.completed_at_ms or 0)
    if age <= soft_ms:
        return CacheState.HIT
    return CacheState.STALE if age <= hard_ms else CacheState.MISS


class ResultCache:
    def __init__(self, settings: Settings, lookups: Counter) -> None:
        self.version = backend_version(settings)
        self.soft_ms = settings.cache_soft_ttl_s * 1000
        self.hard_ms = settings.cache_hard_ttl_s * 1000
        self.entry_ttl_ms = max(self.hard_ms * 2, settings.idempotency_ttl_s * 1000)
        self.keys = CacheKeys()
        self._generation: dict[str, tuple[int, float]] = {}
        self.lookups = lookups  # splatq_cache_lookups_total{result}

    async def generation(self, redis: Redis, version: str = "") -> int:
        version = version or self.version
        cached = self._generation.get(version)
        now = time.monotonic()
        if cached is not None and now - cached[1] < GENERATION_CACHE_S:
            return cached[0]
        raw = await redis.get(self.keys.generation(version))
        value = int(raw) if raw and str(raw).isdigit() else 0
        self._generation[version] = (value, now)
        return value

    async def content_key(
        self, redis: Redis, tenant: str, image_sha256: str, quality: str, progressive: bool
    ) -> str:
        gen = await self.generation(redis)
        return content_key(tenant, image_sha256, quality, self.version, gen, progressive)

    async def purge(self, redis: Redis, version: str) -> int:
        """Every cached result of `version` becomes a miss (within GENERATION_CACHE_S on
        every gateway): its keys move to the next generation. Returns that generation."""
        generation = int(await redis.incr(self.keys.generation(version)))
        self._generation.pop(version, None)
        log.info("cache.purged", version=version, generation=generation)
        return generation

    async def _completed(self, queue: Producers, job_id: str, tenant: str) -> JobRecord | None:
        job = await queue.get(job_id) if job_id else None
        if job is None or job.tenant != tenant:
            return None
        return job

    async def lookup(
        self, queue: Producers, tenant: str, content_key: str, policy: TenantPolicy
    ) -> Lookup:
        """What the cache holds for a content key (see the module docstring)."""
        answer = await self._lookup(queue, tenant, content_key, policy)
        self.lookups.labels(answer.state.value).inc()
        return answer

    @staticmethod
    async def _entry_and_claim(
        queue: Producers, entry_key: str, tenant: str, content_key: str, policy: TenantPolicy
    ) -> tuple[object, Claim | None]:
        """The entry and the claim answering for `content_key`: one `MGET` of the entry and
        the key's own-partition claim (same slot), plus, for a tenant whose home partition is
        another one, that claim's `GET` in the same round trip (claim_status's rule)."""
        keys = queue.keys
        places = claim_partitions(keys, tenant, content_key)
        digest = keys.digest(content_key)
        both = queue.redis.mget(entry_key, keys.idempotency(places[0], digest))
        if len(places) == 1:
            raw, own = await both
            found = {places[0]: parse_claim(own)}
        else:
            (raw, own), home = await asyncio.gather(
                both, queue.redis.get(keys.idempotency(places[1], digest))
            )
            found = {places[0]: parse_claim(own), places[1]: parse_claim(home)}
        return raw, answering(found, queue.route(tenant, content_key, policy))

    async def _lookup(
        self, queue: Producers, tenant: str, content_key: str, policy: TenantPolicy
    ) -> Lookup:
        entry_key = self.keys.entry(queue.keys, content_key)
        # The entry answers a repeat, the content claim a first completion (or a job still
        # computing, which identical requests join): both in one command (one slot).
        raw, claim = await self._entry_and_claim(queue, entry_key, tenant, content_key, policy)
        pointer = str(raw or "")
        job = await self._completed(queue, pointer, tenant)
        if job is None or job.status != "completed":
            job = await self._completed(queue, claim[1], tenant) if claim else None
            if job is None or job.status != "completed":
                # none yet, or computing (identical submissions join it), or failed (a new
                # submission steps over it): the content key itself
                return Lookup(CacheState.MISS, content_key)
        now_ms = int(time.time() * 1000)
        refreshing = False
        for _ in range(MAX_HOPS):
            if judge(job, now_ms, self.soft_ms, self.hard_ms) is CacheState.HIT:
                break
            claim = await queue.claim_status(successor_key(content_key, job.id), policy, tenant)
            newer = await self._completed(queue, claim[1], tenant) if claim else None
            if newer is None or newer.status != "completed":
                refreshing = newer is not None and newer.status not in TERMINAL
                break
            job = newer
        if job.id != pointer:
            await queue.redis.set(entry_key, job.id, px=self.entry_ttl_ms)
        state = judge(job, now_ms, self.soft_ms, self.hard_ms)
        successor = successor_key(content_key, job.id)
        if state is CacheState.MISS:
            return Lookup(CacheState.MISS, successor, refreshing=refreshing)
        return Lookup(state, successor, job, refreshing)


RESULT_CACHE = web.AppKey("result_cache", ResultCache)


def install(app: web.Application, settings: Settings, lookups: Counter) -> None:
    app[RESULT_CACHE] = ResultCache(settings, lookups)
