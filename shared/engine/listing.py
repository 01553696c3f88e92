"""A tenant's jobs, newest first, read from the per-partition listing indexes (GET /v1/jobs).

enqueue.lua adds each new job to `KeySchema.tenant_jobs(partition, tenant)`, a sorted set
scored by creation time (ms), in the same script as the job: a job exists iff it is indexed.
A page is a k-way merge of the partitions' indexes in (created desc, job id desc) order,
each read with one single-key command (no cross-slot command: works on Redis Cluster).

A position in that order (`Position`) is where the next page starts; the gateway turns it
into an opaque cursor. Filters on the record (status) are applied after the read, so a page
examines at most `scan_budget` candidates and may come back short with a position to go on
from, as Stripe's and GitHub's list APIs do.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from splatq.shared.engine.jobs import JobRecord
from splatq.shared.engine.queue import JobQueue

DEFAULT_SCAN_BUDGET = 1000
MIN_BATCH = 8


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
    scan_budget: int = DEFAULT_SCAN_BUDGET,
) -> JobPage:
    """Up to `limit` of the tenant's jobs after `after` that pass `job_filter`."""
    batch = _batch(limit, queue.settings.partitions, filtered=bool(job_filter.statuses))
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
        take = candidates[: min(len(candidates), scan_budget - examined)]
        records = await _records(queue, [c.job_id for c in take])
        for candidate, job in zip(take, records, strict=True):
            examined += 1
            position = candidate
            _consume(sources, candidate)
            if job is None or job.tenant != tenant or not job_filter.admits(job):
                continue
            jobs.append(job)
            if len(jobs) == limit:
                more = await _any_left(queue, sources, job_filter, position)
                return JobPage(jobs, position if more else None)
        if examined >= scan_budget:
            return JobPage(jobs, position)


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


async def _records(queue: JobQueue, job_ids: Collection[str]) -> list[JobRecord | None]:
    pipe = queue.redis.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hgetall(queue.keys.job(job_id))
    replies = await pipe.execute()
    return [JobRecord.from_hash(r) if r else None for r in replies]
