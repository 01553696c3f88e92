"""A tenant's jobs, newest first, read from the per-partition listing indexes (GET /v1/jobs).

enqueue.lua adds each new job to `KeySchema.tenant_jobs(partition, tenant)`, a sorted set
scored by creation time (ms), in the same script as the job: a job exists iff it is indexed.
A page is a k-way merge of the partitions' indexes in (created desc, job id desc) order,
each read with one single-key command (no cross-slot command: works on Redis Cluster).

A position in that order (`Position`) is where the next page starts; the gateway turns it
into an opaque cursor. Filters on the record (status) are applied after the read, so a page
examines at most `scan_budget(limit)` index entries -- a few per item asked for, never a
fixed thousand -- and may come back short, even empty, with a position to go on from, as
Stripe's and GitHub's list APIs do. A filtered page probes each candidate's status with one
small HMGET and reads the whole record only of the jobs it returns, so what one request
costs Redis and the gateway is O(limit), whatever the tenant's history holds.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from splatq.shared.engine.jobs import JobRecord
from splatq.shared.engine.queue import JobQueue

# Index entries one page may examine: SCAN_PER_ITEM per item asked for, at least MIN_SCAN.
SCAN_PER_ITEM = 4
MIN_SCAN = 32
MIN_BATCH = 8


def scan_budget(limit: int, per_item: int = SCAN_PER_ITEM) -> int:
    """The most index entries a page of `limit` items examines before it returns, short if
    need be, with a position to go on from."""
    return max(MIN_SCAN, per_item * limit)


@dataclass(frozen=True, slots=True, order=True)
class Position:
    """A point in the listing order: entries strictly below (older than) it come next."""

    created_ms: int
    job_id: str


@dataclass(frozen=True, slots=True)
class JobFilter:
    statuses: frozenset[str] = frozenset()  # empty: any
    since_ms: int | None = None  # created at or after
    until_ms: int | None = None  # created before

    def admits(self, job: JobRecord) -> bool:
        return not self.statuses or job.status.value in self.statuses


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: list[JobRecord]
    # Where the next page starts, or None when nothing is left.
    next: Position | None


@dataclass(slots=True)
class _Source:
    """One partition's index, read in batches below a moving position."""

    key: str
    buffered: list[Position]
    exhausted: bool = False


async def list_jobs(
    queue: JobQueue,
    tenant: str,
    limit: int,
    job_filter: JobFilter = JobFilter(),
    after: Position | None = None,
    budget: int | None = None,
) -> JobPage:
    """Up to `limit` of the tenant's jobs after `after` that pass `job_filter`, examining at
    most `budget` (default `scan_budget(limit)`) index entries."""
    budget = scan_budget(limit) if budget is None else max(1, budget)
    filtered = bool(job_filter.statuses)
    batch = min(budget, _batch(limit, queue.settings.partitions, filtered))
    sources = [
        _Source(queue.keys.tenant_jobs(p, tenant), []) for p in range(queue.settings.partitions)
    ]
    jobs: list[JobRecord] = []
    examined = 0
    position = after
    while True:
        await _refill(queue, sources, job_filter, position, batch)
        candidates = _safe_merge(sources)
        if not candidates:
            return JobPage(jobs, None)
        # Unfiltered, nearly every candidate is a job of the page: read no more than it needs.
        room = budget - examined if filtered else min(budget - examined, limit - len(jobs))
        take = candidates[:room]
        wanted = [c.job_id for c in take]
        if filtered:
            # Probe the status of each; read whole records of the page's jobs only.
            admitted = await _admitted(queue, wanted, tenant, job_filter)
            take = _through_nth(take, admitted, limit - len(jobs))
            wanted = [c.job_id for c in take if c.job_id in admitted]
        records = await _records(queue, wanted)
        found = {job.id: job for job in records if job is not None and job.tenant == tenant}
        for candidate in take:
            examined += 1
            position = candidate
            _consume(sources, candidate)
            job = found.get(candidate.job_id)
            if job is None or not job_filter.admits(job):
                continue
            jobs.append(job)
            if len(jobs) == limit:
                more = await _any_left(queue, sources, job_filter, position)
                return JobPage(jobs, position if more else None)
        if examined >= budget and position is not None:
            more = await _any_left(queue, sources, job_filter, position)
            return JobPage(jobs, position if more else None)


def _through_nth(take: list[Position], admitted: set[str], n: int) -> list[Position]:
    """`take` up to and including its `n`th admitted candidate (all of it if fewer)."""
    for i, candidate in enumerate(take):
        if candidate.job_id in admitted:
            n -= 1
            if n == 0:
                return take[: i + 1]
    return take


def _batch(limit: int, partitions: int, filtered: bool) -> int:
    """Entries read per partition and round trip: a page's worth spread over the partitions
    (twice over, as they are rarely even), more when a filter drops some; never under
    MIN_BATCH. A partition holding more of the page is simply read again (`_safe_merge`
    keeps the order right whatever the batch)."""
    want = limit + 1 if not filtered else max(limit * 4, 64)
    if partitions <= 2:
        return want
    return max(MIN_BATCH, -(-2 * want // partitions))


async def _refill(
    queue: JobQueue,
    sources: Sequence[_Source],
    job_filter: JobFilter,
    position: Position | None,
    batch: int,
) -> None:
    """Read the next batch of every source whose buffer ran dry (one pipeline)."""
    empty = [s for s in sources if not s.buffered and not s.exhausted]
    if not empty:
        return
    high = f"({job_filter.until_ms}" if job_filter.until_ms is not None else "+inf"
    if position is not None and (
        job_filter.until_ms is None or position.created_ms < job_filter.until_ms
    ):
        high = str(position.created_ms)
    low = str(job_filter.since_ms) if job_filter.since_ms is not None else "-inf"
    offsets = dict.fromkeys((s.key for s in empty), 0)
    while empty:
        pipe = queue.redis.pipeline(transaction=False)
        for s in empty:
            pipe.zrevrangebyscore(s.key, high, low, start=offsets[s.key], num=batch,
                                  withscores=True)  # fmt: skip
        replies = await pipe.execute()
        again: list[_Source] = []
        for s, reply in zip(empty, replies, strict=True):
            got = [Position(int(score), str(member)) for member, score in reply]
            fresh = [p for p in got if position is None or p < position]
            s.buffered = fresh
            s.exhausted = len(got) < batch
            if not fresh and not s.exhausted:
                # A full batch at the position's own millisecond, all already listed:
                # skip past it (rare: more than a batch of one tenant's jobs in 1 ms).
                offsets[s.key] += batch
                again.append(s)
        empty = again


def _safe_merge(sources: Sequence[_Source]) -> list[Position]:
    """Buffered candidates, newest first, that no unread entry can precede: a source with
    more to read bounds the merge at its last buffered entry."""
    frontier = max(
        (s.buffered[-1] for s in sources if s.buffered and not s.exhausted), default=None
    )
    merged = sorted((p for s in sources for p in s.buffered), reverse=True)
    if frontier is None:
        return merged
    return [p for p in merged if p >= frontier]


def _consume(sources: Sequence[_Source], candidate: Position) -> None:
    for s in sources:
        if s.buffered and s.buffered[0] == candidate:
            s.buffered.pop(0)
            return


async def _any_left(
    queue: JobQueue, sources: Sequence[_Source], job_filter: JobFilter, position: Position
) -> bool:
    """Whether any indexed entry is left below `position` (cheap: buffers, then one read)."""
    if any(s.buffered for s in sources):
        return True
    if all(s.exhausted for s in sources):
        return False
    await _refill(queue, sources, job_filter, position, 1)
    return any(s.buffered for s in sources)


async def _admitted(
    queue: JobQueue, job_ids: Collection[str], tenant: str, job_filter: JobFilter
) -> set[str]:
    """The ids whose record exists, is the tenant's and passes the status filter: two fields
    of each record (one pipeline), not the whole record."""
    pipe = queue.redis.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hmget(queue.keys.job(job_id), ["status", "tenant"])
    replies = await pipe.execute()
    return {
        job_id
        for job_id, (status, owner) in zip(job_ids, replies, strict=True)
        if owner == tenant and status in job_filter.statuses
    }


async def _records(queue: JobQueue, job_ids: Collection[str]) -> list[JobRecord | None]:
    pipe = queue.redis.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hgetall(queue.keys.job(job_id))
    replies = await pipe.execute()
    return [JobRecord.from_hash(r) if r else None for r in replies]
