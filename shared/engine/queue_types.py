"""The values the job store's operations take and answer (shared/engine/queue.py and its
roles): stream entries, enqueue/claim/start/finish/advance requests and results, dead
letters, stream statistics, and the parsers of what the scripts return."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from splatq.shared.engine.jobs import JobRecord, pairs_to_dict
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.scripts import new_request_id

# Parking consumer for released entries: they stay pending (keeping their place) until a
# reaper pass hands them to a worker with free slots.
PARKING_CONSUMER = "splatq-parking"
# renew_many's answer for a lease whose renewal got an error reply (neither kept nor lost).
RENEW_UNKNOWN = -1


@dataclass(frozen=True, slots=True)
class StreamEntry:
    partition: int
    stream: StreamName
    entry_id: str
    fields: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    job_id: str
    created: bool
    # For a duplicate: the claim's status (PENDING/PROCESSING/COMPLETED) of the existing job.
    claim_status: str = "PENDING"
    # Refused because the stream partition already holds `max_backlog` entries (scope
    # 'stream'), or the tenant already has `max_tenant_backlog` unfinished jobs in it
    # (scope 'tenant').
    overloaded: bool = False
    backlog: int = 0
    overload_scope: str = ""
    # The new job's record (created only), read in the same script.
    job: JobRecord | None = None
    # join_only, and the key's claim was no longer live: nothing was created.
    not_joined: bool = False


@dataclass(frozen=True, slots=True)
class ClaimResult:
    won: bool
    status: str
    job_id: str


@dataclass(frozen=True, slots=True)
class StartResult:
    """Outcome of start.lua: `started` carries the job; the others say why not."""

    outcome: str  # started | corrupt | dead_lettered | error | unknown | skip | stale | busy
    job: JobRecord | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Taken:
    """One entry read by take.lua: started (with its job and lease token), raw (unparsed:
    for the caller to validate and dead-letter), or skip/stale/busy."""

    entry: StreamEntry
    outcome: str  # started | corrupt | raw | dead_lettered | skip | stale | busy
    job: JobRecord | None = None
    token: str = ""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Finish:
    """A worker's request to leave `processing` (see finish.lua)."""

    job_id: str
    stream: StreamName
    entry_id: str
    token: str
    target: str
    claim_key: str = ""
    event: str = ""
    event_extra: str = ""
    retry_delay_ms: int = 0
    claim_status: str = ""
    handoff: bool = False
    fields: Mapping[str, str] | None = None
    # Fixed when the outcome is decided: every resend of this commit is the same call.
    request_id: str = field(default_factory=new_request_id)
    # A `failed` exit also dead-lettered under this reason (a redrive policy acts on it).
    dead_letter: str = ""


@dataclass(frozen=True, slots=True)
class Advance:
    """A stage run's request to move its job on to the next stage (see advance.lua)."""

    job_id: str
    stream: StreamName
    entry_id: str
    token: str
    stage: str
    next_stage: str
    record: str  # the finished stage's ledger record (JSON)
    progress: float
    event_extra: str
    fields: Mapping[str, str] | None = None
    also_event: str = ""
    also_extra: str = ""
    request_id: str = field(default_factory=new_request_id)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One entry of a partition's job dead-letter stream."""

    partition: int
    entry_id: str
    fields: Mapping[str, str]

    @property
    def id(self) -> str:
        """Operator-facing id: `<partition>/<entry id>`."""
        return f"{self.partition}/{self.entry_id}"

    @property
    def reason(self) -> str:
        return self.fields.get("reason", "")

    @property
    def job_id(self) -> str:
        return self.fields.get("job") or self.fields.get("raw_job", "")

    @property
    def at_ms(self) -> int:
        raw = self.fields.get("at_ms", "")
        return int(raw) if raw.isdigit() else int(self.entry_id.split("-", 1)[0])


@dataclass(frozen=True, slots=True)
class StreamStats:
    partition: int
    stream: StreamName
    length: int
    pending: int
    lag: int | None
    oldest_pending_age_s: float
    consumers: int
    # The oldest entry no worker has been handed yet (0.0 when none waits).
    oldest_waiting_age_s: float = 0.0


@dataclass(frozen=True, slots=True)
class WaitingStats:
    """Jobs in line in one stream of a partition: waiting in the tenants' fair queues, and
    in the stream itself (ready or running)."""

    waiting: int
    in_stream: int
    oldest_waiting_age_s: float  # 0.0 when nothing waits

    @property
    def in_line(self) -> int:
        return self.waiting + self.in_stream


def delayed_member(stream: StreamName, job_id: str, stage: str = "") -> str:
    """The retry set's member of a job: '<class>|<id>' for the entry stage, and
    '<stage>:<class>|<id>' for a later pipeline stage (promote_due puts it back there)."""
    if stage:
        return f"{stage}:{stream.value}|{job_id}"
    return f"{stream.value}|{job_id}"


def parse_delayed_member(member: str) -> tuple[str, StreamName, str]:
    """(stage, class, job id) of a retry set member; raises ValueError on a foreign one."""
    lane, _, job_id = member.partition("|")
    stage, _, name = lane.rpartition(":")
    return stage, StreamName(name), job_id


def entry_age_s(entry_id: str, now_ms: int) -> float:
    return max(0.0, (now_ms - int(entry_id.split("-", 1)[0])) / 1000.0)


def parse_dead_letter_id(dlq_id: str) -> tuple[int, str]:
    """`<partition>/<entry id>` -> (partition, entry id); ValueError otherwise."""
    partition, sep, entry_id = dlq_id.partition("/")
    ms, dash, seq = entry_id.partition("-")
    if not (sep and dash and partition.isdigit() and ms.isdigit() and seq.isdigit()):
        raise ValueError(f"not a dead-letter id (expected <partition>/<entry id>): {dlq_id!r}")
    return int(partition), entry_id


def parse_job_reply(flat: list[str]) -> tuple[JobRecord | None, str]:
    """A job's hash as a script's flat reply (numbers may come as integers), or why it
    cannot be read."""
    return parse_job_reply_dict(pairs_to_dict([str(v) for v in flat]))


@dataclass(frozen=True, slots=True)
class StartedRecord:
    """A just-started job's record as its worker read it (Runs.read_started): outcome
    `started` (with the job), `corrupt` (unreadable: detail says why), `busy` (the record's
    lease token is no longer the run's) or `error` (the read's error reply)."""

    outcome: str
    job: JobRecord | None = None
    detail: str = ""
    raw: Mapping[str, str] = field(default_factory=dict)


def started_record(job_id: str, token: str, reply: Any) -> StartedRecord:
    """`reply` (an HGETALL's, or its error) read after the start of `job_id` under `token`."""
    if isinstance(reply, Exception):
        return StartedRecord("error", detail=f"{type(reply).__name__}: {reply}"[:500])
    raw: dict[str, str] = reply
    if raw and raw.get("lease_token") != token:
        return StartedRecord("busy", detail="another run holds the job now", raw=raw)
    job, problem = parse_job_reply_dict(raw)
    if job is None:
        return StartedRecord("corrupt", detail=problem, raw=raw)
    return StartedRecord("started", job, raw=raw)


def parse_job_reply_dict(raw: Mapping[str, str]) -> tuple[JobRecord | None, str]:
    """A job's hash (HGETALL), or why it cannot be read (the worker then fails that job
    alone)."""
    try:
        return JobRecord.from_hash(raw), ""
    except (KeyError, ValueError, TypeError) as exc:
        return None, f"unreadable job record: {type(exc).__name__}: {exc}"[:500]


def raise_on_error(reply: Any) -> None:
    if isinstance(reply, Exception):
        raise reply
