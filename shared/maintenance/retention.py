"""Retention (task `retention`): inputs and artifacts older than their age are deleted, in
checkpointed batches, unless a job still needs them.

- inputs (`inputs/..`, content-addressed and shared by tenants): deleted when older than
  `inputs_max_age_s` and no job record that is not completed or canceled names it (a failed
  job may be redriven and needs its input back);
- artifacts (`jobs/<job id>/..`): deleted when older than the tenant's artifact age (the job
  record names the tenant; without a record, the default), never while the job is unfinished.

The references are read *after* each batch of candidates was listed, so a job created before
that read keeps its input. What is left is a narrow window: a new submission of an input that
is already old, between that read and the delete (milliseconds); closing it needs the gateway
to refresh an input's age when it re-uploads one (docs/operations.md#retention).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import structlog

from splatq.shared.engine.queue import JobQueue
from splatq.shared.maintenance.config import RetentionConfig
from splatq.shared.maintenance.schedule import Schedule
from splatq.shared.maintenance.scheduler import TaskRun
from splatq.shared.storage.store import TEMP_MARKER, LocalFileStorage, Storage

log = structlog.get_logger("splatq.retention")
UNFINISHED = frozenset({"queued", "processing", "retrying"})
KEEPS_INPUT = UNFINISHED | {"failed"}
PREFIXES = ("inputs", "jobs")

OnDeleted = Callable[[str, int], None]


@dataclass(frozen=True, slots=True)
class StoredObject:
    key: str
    mtime_s: float

    @property
    def job_id(self) -> str:
        """For an artifact (`jobs/<job id>/..`), its job id."""
        return self.key.split("/", 2)[1] if self.key.startswith("jobs/") else ""


def walk_local(root: Path, after: str) -> Iterator[StoredObject]:
    """Objects under inputs/ and jobs/ in key order (by path segment), after key `after`
    (staged temp files of writes in progress left out)."""
    mark = tuple(after.split("/")) if after else ()
    for prefix in PREFIXES:
        yield from _walk(root, root / prefix, mark)


def _walk(root: Path, directory: Path, mark: tuple[str, ...]) -> Iterator[StoredObject]:
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if TEMP_MARKER in entry.name or entry.name.startswith("."):
            continue
        path = Path(entry.path)
        parts = path.relative_to(root).parts
        if entry.is_dir(follow_symlinks=False):
            if not mark or parts >= mark[: len(parts)]:
                yield from _walk(root, path, mark)
        elif parts > mark:
            try:
                yield StoredObject("/".join(parts), entry.stat().st_mtime)
            except FileNotFoundError:
                continue


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
    ) -> None:
        self.queue = queue
        self.storage = storage
        self.config = config
        self.schedule = schedule
        self.batch = batch
        self._on_deleted = on_deleted

    async def run(self, run: TaskRun) -> str:
        if not isinstance(self.storage, LocalFileStorage):
            return "skipped: listing objects is implemented for file:// storage only"
        root = self.storage.root
        deleted = {"input": 0, "artifact": 0}
        walker = walk_local(root, run.checkpoint)
        while True:
            batch = await asyncio.to_thread(_take, walker, self.batch)
            if not batch:
                break
            now = time.time()
            candidates = [o for o in batch if self._old_enough(o, now, None)]
            if candidates:
                refs = await self.references()  # read after the candidates were listed
                for obj in candidates:
                    kind = "artifact" if obj.job_id else "input"
                    if self._needed(obj, refs, now):
                        continue
                    await self.storage.delete(obj.key)
                    deleted[kind] += 1
                    if self._on_deleted is not None:
                        self._on_deleted(kind, 1)
            await run.save(batch[-1].key)
        return f"deleted {deleted['input']} inputs, {deleted['artifact']} artifacts"

    def _old_enough(self, obj: StoredObject, now: float, tenant: str | None) -> bool:
        if obj.job_id:
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
            age = self.config.inputs_max_age_s
        return now - obj.mtime_s >= age

    def _needed(self, obj: StoredObject, refs: JobRefs, now: float) -> bool:
        if not obj.job_id:
            return obj.key in refs.inputs
        status, tenant = refs.jobs.get(obj.job_id, ("", ""))
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


def _take(walker: Iterator[StoredObject], count: int) -> list[StoredObject]:
    out: list[StoredObject] = []
    for obj in walker:
        out.append(obj)
        if len(out) >= count:
            break
    return out
