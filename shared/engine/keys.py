"""Every Redis key splatq uses is built here, and nowhere else.

Keys that one Lua script touches together share the `{pN}` hash tag of their partition, so
every script stays inside one Redis Cluster slot. Pure string building; no I/O.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from enum import StrEnum

from splatq.shared.engine.ids import partition_of
from splatq.shared.engine.stages import FIRST_STAGE


class StreamName(StrEnum):
    """The two work streams: short interactive jobs and long synthesis jobs."""

    INTERACTIVE = "interactive"
    SYNTHESIS = "synthesis"


STREAMS: tuple[StreamName, ...] = (StreamName.INTERACTIVE, StreamName.SYNTHESIS)


@dataclass(frozen=True, slots=True)
class KeySchema:
    """Key builder for one deployment (`prefix` separates deployments sharing a Redis)."""

    prefix: str = "splatq"
    partitions: int = 1
    # The pipeline stage whose work streams and retry set `stream()` and `delayed()` name:
    # '' for the entry stage (the gateway's streams, read by monolithic and `ingest`
    # workers alike), else a later stage of shared/engine/stages.py.
    stage: str = ""

    def for_stage(self, stage: str) -> KeySchema:
        """The same deployment's keys, with the work streams of `stage` ('' or the first
        pipeline stage: the entry streams)."""
        return replace(self, stage="" if stage == FIRST_STAGE.value else stage)

    def tag(self, partition: int) -> str:
        return f"{self.prefix}:{{p{partition}}}"

    def stream(self, partition: int, stream: StreamName) -> str:
        if self.stage:
            return f"{self.tag(partition)}:stream:{self.stage}:{stream.value}"
        return f"{self.tag(partition)}:stream:{stream.value}"

    def stage_stream(self, partition: int, stage: str, stream: StreamName) -> str:
        """Another stage's work stream (the next stage, for an advance)."""
        return self.for_stage(stage).stream(partition, stream)

    def events(self, partition: int) -> str:
        """The outbox: job events appended by the same script as the state change."""
        return f"{self.tag(partition)}:events"

    def dead_letters(self, partition: int) -> str:
        return f"{self.tag(partition)}:dlq:jobs"

    def delayed(self, partition: int) -> str:
        """Sorted set of job ids waiting for a retry, scored by due time (ms); one for every
        stage (each member names its stage's stream, see queue.delayed_member)."""
        return f"{self.tag(partition)}:delayed"

    def job(self, job_id: str) -> str:
        return f"{self.tag(partition_of(job_id))}:job:{job_id}"

    def job_history(self, job_id: str) -> str:
        """The job's own event history (SSE and `Prefer: wait` replay it): a list of compact
        items written by the outbox helper (`emit` in lua/_preamble.lua)."""
        return f"{self.job(job_id)}:h"

    def job_wake(self, job_id: str) -> str:
        """A stream of one entry that wakes the job's watchers (exists only while watched)."""
        return f"{self.job(job_id)}:wake"

    def job_events(self, job_id: str) -> str:
        """The event history stream releases before the list kept (read until it expires)."""
        return f"{self.job(job_id)}:events"

    def job_deliveries(self, job_id: str) -> str:
        """The job's webhook delivery log (attempts, newest first)."""
        return f"{self.job(job_id)}:deliveries"

    def webhook_message(self, partition: int, message_id: str) -> str:
        """One (event, endpoint) delivery with its own state."""
        return f"{self.tag(partition)}:wh:msg:{message_id}"

    def webhook_due(self, partition: int) -> str:
        """Sorted set of message ids scored by their next attempt time (ms)."""
        return f"{self.tag(partition)}:wh:due"

    def webhook_dead_letters(self, partition: int) -> str:
        return f"{self.tag(partition)}:dlq:webhooks"

    def webhook_dead_letter_index(self, partition: int, tenant: str, target: str) -> str:
        """One (tenant, target)'s webhook dead letters in the partition: a sorted set of
        "<entry id> <message id>" scored by failure time (ms), so `recover` reads only its
        endpoint's entries. `target` is an endpoint id, or "job" for job webhook_urls."""
        return f"{self.tag(partition)}:wh:dlq-index:{tenant}:{target}"

    def webhook_dead_letters_indexed(self, partition: int) -> str:
        """Set once the partition's dead letters from before the index were indexed."""
        return f"{self.tag(partition)}:wh:dlq-indexed"

    def tenant_webhook_secret(self, tenant: str) -> str:
        """The tenant's `whsec_` signing secret: its own hash tag, its own slot."""
        return f"{self.prefix}:{{tenant:{tenant}}}:whsec"

    def tenant_webhook_previous_secret(self, tenant: str) -> str:
        """The secret before the last rotation; expires when the overlap ends."""
        return f"{self.prefix}:{{tenant:{tenant}}}:whsec:previous"

    def webhook_endpoints(self, tenant: str) -> str:
        """Hash of the tenant's endpoints: id -> subscribed event types (comma-separated,
        empty for all). Fan-out reads it in one call; `{wh:<tenant>}` is the tenant's slot."""
        return f"{self.prefix}:{{wh:{tenant}}}:endpoints"

    def webhook_endpoint(self, tenant: str, endpoint_id: str) -> str:
        """One endpoint: url, secrets, and its health (circuit breaker, disabled)."""
        return f"{self.prefix}:{{wh:{tenant}}}:endpoint:{endpoint_id}"

    def tenant_jobs(self, partition: int, tenant: str) -> str:
        """The tenant's jobs created in this partition within the record retention: a sorted
        set of job ids scored by creation time (ms), written by enqueue.lua with the job (the
        listing index of GET /v1/jobs)."""
        return f"{self.tag(partition)}:jobs:{tenant}"

    def webhook_endpoint_attempts(self, tenant: str, endpoint_id: str) -> str:
        """The endpoint's attempt log: a capped stream of attempt records (JSON), in the
        endpoint's slot; wh_ep_delete.lua derives it as `<endpoint key>:attempts`."""
        return f"{self.webhook_endpoint(tenant, endpoint_id)}:attempts"

    def rate_limit(self, tenant: str, bucket: str = "") -> str:
        """A tenant's token bucket: its own hash tag, so its one script has one slot. Each
        `bucket` (submissions: '', listings: 'list') is a budget of its own."""
        suffix = f":{bucket}" if bucket else ""
        return f"{self.prefix}:{{rl:{tenant}}}:bucket{suffix}"

    def lease(self, job_id: str) -> str:
        return f"{self.tag(partition_of(job_id))}:lease:{job_id}"

    def idempotency(self, partition: int, digest: str) -> str:
        return f"{self.tag(partition)}:idem:{digest}"

    def fair_base(self, partition: int, stream: StreamName) -> str:
        """Prefix of a stream's fair-scheduling keys (`fq_base` in lua/_preamble.lua):
        `:ring`, `:waiting`, `:state` and `:q:<tenant>` hang under it. Only the entry
        streams are fed fairly: a later stage's keys name queues that stay empty."""
        if self.stage:
            return f"{self.tag(partition)}:fq:{self.stage}:{stream.value}"
        return f"{self.tag(partition)}:fq:{stream.value}"

    def fair_waiting(self, partition: int, stream: StreamName) -> str:
        """Sorted set of every job waiting in a tenant queue, scored by enqueue time (ms)."""
        return f"{self.fair_base(partition, stream)}:waiting"

    def fair_queue(self, partition: int, stream: StreamName, tenant: str) -> str:
        """One tenant's waiting jobs ('<job id> <cost>', oldest first)."""
        return f"{self.fair_base(partition, stream)}:q:{tenant}"

    def fleet(self, partition: int) -> str:
        """The partition's fleet clock: when a worker last reached Redis, and the total time
        nobody could (outages and stalls; leases are not charged for it)."""
        return f"{self.tag(partition)}:fleet"

    def workers(self, partition: int) -> str:
        """Each worker's last contact with the partition (a sorted set, written by its fleet
        tick): reclaim.lua tells a mass death from a poison job with it."""
        return f"{self.tag(partition)}:workers"

    def worker_card(self, worker: str) -> str:
        """What a worker process says of itself (its stages, slots and jobs running), written
        by its fleet tick with an expiry: the admin API's worker view (a key of its own)."""
        return f"{self.prefix}:worker-card:{worker}"

    def alarm_counter(self, partition: int) -> str:
        """Counts stream entries lost to trimming (XAUTOCLAIM's deleted ids)."""
        return f"{self.tag(partition)}:alarm:lost_entries"

    def partition_for(self, logical_key: str) -> int:
        """Stable partition of a logical key, so its claim and its job share one slot."""
        digest = hashlib.sha256(logical_key.encode()).digest()
        return int.from_bytes(digest[:8], "big") % self.partitions

    @staticmethod
    def digest(logical_key: str) -> str:
        return hashlib.sha256(logical_key.encode()).hexdigest()
