"""Retention (task `retention`): inputs and artifacts older than their age are deleted, in
checkpointed batches, unless a job still needs them. Works on any `Storage` that lists
(file:// and s3://).

- inputs (`inputs/..`, content-addressed and shared by tenants): deleted when older than
  `inputs_max_age_s` -- and never younger than `inputs_grace_s` -- and no job record that is
  not completed or canceled names it (a failed job may be redriven and needs its input back);
- artifacts (`jobs/<job id>/..`): deleted when older than the tenant's artifact age (the job
  record names the tenant; without a record, the default), never while the job is unfinished;
- intermediates of the staged pipeline (`intermediates/<job id>/..`): the same rule as
  artifacts. The cleanup stage deletes a completed or canceled job's at once; a failed or
  dead-lettered job keeps its own until this age (a redrive resumes from them), and so do
  those of a job whose cleanup was given up.

Concurrent submissions: the gateway stores an input before it records its job, and never
deletes one (a refused submission leaves its input: a concurrent twin may need it); storing
an input that exists refreshes its age (`Storage.put_if_absent`). So an input that a
submission in flight has stored but not yet named in a job is younger than the grace. The
job references are read after each batch was listed, and an input's age is read again just
before its delete: what is left is a re-upload of an old input landing between that read and
the delete, one storage call apart (docs/operations.md#retention).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import structlog

from splatq.shared.engine.queue import JobQueue
from splatq.shared.maintenance.config import RetentionConfig
from splatq.shared.maintenance.schedule import Schedule
from splatq.shared.maintenance.scheduler import TaskRun
from splatq.shared.storage.store import ObjectInfo, Storage

log = structlog.get_logger("splatq.retention")
UNFINISHED = frozenset({"queued", "processing", "retrying"})
KEEPS_INPUT = UNFINISHED | {"failed"}
PREFIXES = ("inputs", "intermediates", "jobs")  # in key order (the checkpoint resumes by it)

OnDeleted = Callable[[str, int], None]


def job_of(key: str) -> str:
    """For an artifact (`jobs/<job id>/..`) or an intermediate (`intermediates/<job id>/..`),
    its job id; '' for anything else (an input)."""
    if key.startswith(("jobs/", "intermediates/")):
        return key.split("/", 2)[1]
    return ""


def kind_of(key: str) -> str:
    if key.startswith("jobs/"):
        return "artifact"
    return "intermediate" if key.startswith("intermediates/") else "input"


async def listing(storage: Storage, after: str) -> AsyncIterator[ObjectInfo]:
    """Every object under inputs/, intermediates/ then jobs/, resuming after key `after` (a
    checkpoint)."""
    top = after.split("/", 1)[0] if after else ""
    for prefix in PREFIXES:
        if top and top > prefix:
            continue
        async for obj in storage.list_objects(prefix, after if top == prefix else ""):
            yield obj


@dataclass(frozen=True, slots=True)
class JobRefs:
    inputs: frozenset[str]  # input keys some job still needs
    jobs: dict[str, tuple[str, str]]  # job id -> (status, tenant)


class Retention:
    name = "retention"

    def __init__(
        self,
        queue: JobQueue,
        storage: Storage,
        config: RetentionConfig,
        schedule: Schedule,
        batch: int = 1000,
        on_deleted: OnDeleted | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.queue = queue
        self.storage = storage
        self.config = config
        self.schedule = schedule
        self.batch = batch
        self._on_deleted = on_deleted
        self._clock = clock

    async def run(self, run: TaskRun) -> str:
        deleted = {"input": 0, "artifact": 0, "intermediate": 0}
        batch: list[ObjectInfo] = []
        async for obj in listing(self.storage, run.checkpoint):
            batch.append(obj)
            if len(batch) >= self.batch:
                await self._sweep(batch, deleted)
                await run.save(batch[-1].key)
                batch = []
        if batch:
            await self._sweep(batch, deleted)
            await run.save(batch[-1].key)
        return (
            f"deleted {deleted['input']} inputs, {deleted['artifact']} artifacts, "
            f"{deleted['intermediate']} intermediates"
        )

    async def _sweep(self, batch: list[ObjectInfo], deleted: dict[str, int]) -> None:
        now = self._clock()
        candidates = [o for o in batch if self._old_enough(o, now, None)]
        if not candidates:
            return
        refs = await self.references()  # read after the candidates were listed
        for obj in candidates:
            kind = kind_of(obj.key)
            if self._needed(obj, refs, now):
                continue
            if kind == "input":
                # Its age again, now: a submission may have stored it since the listing.
                modified = await self.storage.modified_at(obj.key)
                if modified is None or not self._old_enough(
                    ObjectInfo(obj.key, modified), self._clock(), None
                ):
                    continue
            await self.storage.delete(obj.key)
            deleted[kind] += 1
            log.info("retention.deleted", kind=kind, key=obj.key)
            if self._on_deleted is not None:
                self._on_deleted(kind, 1)

    def _old_enough(self, obj: ObjectInfo, now: float, tenant: str | None) -> bool:
        if job_of(obj.key):
            age = (
                self.config.artifacts_age_for(tenant)
                if tenant is not None
                else min(
                    [
                        self.config.artifacts_max_age_s,
                        *self.config.tenant_artifacts_max_age_s.values(),
                    ]
                )
            )
        else:
            age = self.config.input_age_s
        return now - obj.modified_s >= age

    def _needed(self, obj: ObjectInfo, refs: JobRefs, now: float) -> bool:
        job_id = job_of(obj.key)
        if not job_id:
            return obj.key in refs.inputs
        status, tenant = refs.jobs.get(job_id, ("", ""))
        if status in UNFINISHED:
            return True
        return not self._old_enough(obj, now, tenant)

    async def references(self) -> JobRefs:
        """Every job record's status, tenant and input (one SCAN over the job hashes)."""
        redis = self.queue.redis
        inputs: set[str] = set()
        jobs: dict[str, tuple[str, str]] = {}
        pattern = f"{self.queue.keys.prefix}:{{p*}}:job:job_*"
        keys: list[str] = []
        async for key in redis.scan_iter(match=pattern, count=1000):
            if str(key).count(":") == 3:
                keys.append(str(key))
            if len(keys) >= 1000:
                await self._read(keys, inputs, jobs)
                keys = []
        await self._read(keys, inputs, jobs)
        return JobRefs(frozenset(inputs), jobs)

    async def _read(
        self, keys: list[str], inputs: set[str], jobs: dict[str, tuple[str, str]]
    ) -> None:
        if not keys:
            return
        pipe = self.queue.redis.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, ["id", "status", "tenant", "input_ref"])
        for job_id, status, tenant, input_ref in await pipe.execute():
            if not job_id:
                continue
            jobs[str(job_id)] = (str(status or ""), str(tenant or ""))
            if input_ref and status in KEEPS_INPUT:
                inputs.add(str(input_ref))
