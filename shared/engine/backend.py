"""The job store's handle: one Redis client, the deployment's settings, its key schema and its
script runner (`Backend`), and `Role`, the base every caller's view of the store builds on
(producers, runs, recovery, stream reads): a role holds the backend and nothing else, so a
caller takes the one role it needs instead of the whole queue."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from splatq.shared.engine.jobs import JobRecord
from splatq.shared.engine.keys import STREAMS, KeySchema, StreamName
from splatq.shared.engine.queue_types import StreamEntry
from splatq.shared.engine.scripts import ScriptRunner
from splatq.shared.engine.stages import FIRST_STAGE, PipelineStage
from splatq.shared.settings import Settings


@dataclass(frozen=True, slots=True)
class Backend:
    """Redis, settings, keys and scripts of one deployment, read by every role; `stage`: the
    pipeline stage whose work streams it reads (None: the entry streams, whole jobs)."""

    redis: Redis
    settings: Settings
    keys: KeySchema
    scripts: ScriptRunner
    stage: PipelineStage | None = None

    @classmethod
    def open(cls, redis: Redis, settings: Settings) -> Backend:
        return cls(
            redis,
            settings,
            KeySchema(partitions=settings.partitions),
            ScriptRunner(redis, settings.script_replay_ttl_ms, settings.job_retention_ms),
        )

    def for_stage(self, stage: PipelineStage) -> Backend:
        """The same connection and scripts, reading the work streams of `stage`."""
        return dataclasses.replace(self, keys=self.keys.for_stage(stage.value), stage=stage)

    async def setup(self) -> None:
        """Load scripts and create every consumer group (idempotent; safe on every start)."""
        await self.scripts.load()
        for partition in range(self.settings.partitions):
            for stream in STREAMS:
                try:
                    await self.redis.xgroup_create(
                        self.keys.stream(partition, stream),
                        self.settings.consumer_group,
                        id="0",
                        mkstream=True,
                    )
                except ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):
                        raise


class Role:
    """One caller's view of the job store, over a shared `Backend`."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    @property
    def redis(self) -> Redis:
        return self.backend.redis

    @property
    def settings(self) -> Settings:
        return self.backend.settings

    @property
    def keys(self) -> KeySchema:
        return self.backend.keys

    @property
    def scripts(self) -> ScriptRunner:
        return self.backend.scripts

    @property
    def stage(self) -> PipelineStage | None:
        return self.backend.stage

    @property
    def group(self) -> str:
        return self.backend.settings.consumer_group

    @property
    def _claim_ttl_ms(self) -> int:
        return self.backend.settings.idempotency_ttl_s * 1000

    def _entry_claim_keys(self, entry: StreamEntry) -> list[str]:
        claim = entry.fields.get("claim", "")
        # Only a key of this entry's own slot is accepted; anything else is ignored.
        return [claim] if claim.startswith(self.keys.tag(entry.partition) + ":idem:") else []

    def _entries(self, partition: int, reply: Any) -> list[StreamEntry]:
        entries: list[StreamEntry] = []
        if not reply:
            return entries
        items = reply.items() if isinstance(reply, dict) else reply
        for key, messages in items:
            stream = StreamName(str(key).rsplit(":", 1)[1])
            for entry_id, fields in messages:
                entries.append(StreamEntry(partition, stream, entry_id, fields or {}))
        return entries

    async def get(self, job_id: str) -> JobRecord | None:
        raw: dict[str, str] = await self.redis.hgetall(self.keys.job(job_id))  # type: ignore[misc]
        return JobRecord.from_hash(raw) if raw else None

    @staticmethod
    def _stage_key_of(current_stage: str) -> str:
        """The stage part of keys for a job in `current_stage` ('' = the entry streams)."""
        return "" if current_stage in ("", FIRST_STAGE.value) else current_stage
