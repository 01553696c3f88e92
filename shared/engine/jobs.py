"""Job records as they cross the wire: what a producer submits and what a job hash holds.

Pure parsing and formatting; the Redis reads and writes live in `splatq.shared.engine.queue`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from splatq.shared.engine import artifact_refs
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.metering import metered_unit
from splatq.shared.engine.stages import PipelineStage, StageRecord, ledger_of
from splatq.shared.engine.states import JobStatus

JOB_FORMAT_VERSION = "1"

QUALITY_STREAMS: Mapping[str, StreamName] = {
    "preview": StreamName.INTERACTIVE,
    "full": StreamName.SYNTHESIS,
}


@dataclass(frozen=True, slots=True)
class JobSpec:
    """Everything a producer (the gateway) decides about a new job."""

    tenant: str
    quality: str = "full"
    params: Mapping[str, Any] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    input_ref: str = ""
    input_sha256: str = ""
    model: str = ""
    webhook_url: str = ""
    webhook_events: tuple[str, ...] = ()
    trace_id: str = ""
    # A logical key (e.g. sha256 of the normalised input + output-affecting params, or a
    # tenant's Idempotency-Key); identical keys yield one job while the claim lives.
    idempotency_key: str = ""
    # Digest of the whole request (image + every param): tells a repeat with the same
    # Idempotency-Key apart from a different request reusing the key.
    request_fingerprint: str = ""

    @property
    def stream(self) -> StreamName:
        try:
            return QUALITY_STREAMS[self.quality]
        except KeyError:
            raise ValueError(f"unknown quality {self.quality!r}") from None

    def hash_fields(self) -> dict[str, str]:
        """The record's fields from the spec. The optional ones are left out when empty
        (every reader takes a missing one as empty: `from_hash`, the dispatcher's and the
        retention sweep's HMGETs), so a record holds no empty strings; `trace_id` is always
        there (the producer fills an empty one in)."""
        fields = {
            "v": JOB_FORMAT_VERSION,
            "tenant": self.tenant,
            "quality": self.quality,
            "stream": self.stream.value,
            "params": orjson.dumps(dict(self.params)).decode(),
            "metadata": orjson.dumps(dict(self.metadata)).decode(),
            "trace_id": self.trace_id,
        }
        optional = {
            "input_ref": self.input_ref,
            "input_sha256": self.input_sha256,
            "model": self.model,
            "webhook_url": self.webhook_url,
            "webhook_events": ",".join(self.webhook_events),
            "request_fingerprint": self.request_fingerprint,
        }
        fields.update((name, value) for name, value in optional.items() if value)
        return fields


def _int(raw: Mapping[str, str], name: str) -> int:
    value = raw.get(name, "")
    return int(value) if value not in ("", None) else 0


def _opt_int(raw: Mapping[str, str], name: str) -> int | None:
    value = raw.get(name, "")
    return int(value) if value not in ("", None, "0") else None


def _json(raw: Mapping[str, str], name: str, default: Any) -> Any:
    value = raw.get(name, "")
    return orjson.loads(value) if value else default


@dataclass(frozen=True, slots=True)
class JobError:
    code: str
    message: str
    retryable: bool


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job hash, typed. Timestamps are Unix milliseconds (Redis server clock)."""

    id: str
    tenant: str
    status: JobStatus
    quality: str
    stream: StreamName
    attempts: int
    deliveries: int
    progress: float
    stage: str
    created_at_ms: int
    started_at_ms: int | None
    completed_at_ms: int | None
    lease_until_ms: int | None
    params: Mapping[str, Any]
    metadata: Mapping[str, Any]
    artifacts: Mapping[str, str] | None
    compute_time_ms: int | None
    error: JobError | None
    input_ref: str
    input_sha256: str
    model: str
    trace_id: str
    webhook_url: str
    webhook_events: tuple[str, ...]
    cancel_requested: bool
    entry_id: str
    claim_key: str
    version: str
    request_fingerprint: str = ""
    # The run folder holding the committed artifacts ('' = directly under the job).
    artifact_run: str = ""
    # The folder of a progressive job's quick result, written when it was announced.
    quick_run: str = ""
    # Where the 3DGS worker's stage 0 took the object's mask from (alpha, segmented, learned).
    foreground: str = ""
    # Worker deaths charged to this job (1/k each, k = jobs sharing the worker).
    delivery_charge: float = 0.0
    # Fields `hint_<name>` a redrive policy set (e.g. batch_max_size), by name.
    hints: Mapping[str, str] = field(default_factory=dict)
    # The pipeline stage the job is in ('' = never staged: a monolithic worker runs it whole)
    # and the ledger records of the stages it finished (shared/engine/stages.py).
    current_stage: str = ""
    ledger: Mapping[PipelineStage, StageRecord] = field(default_factory=dict)
    redrives: int = 0
    # Stages a redrive asked to run again (`rerun.<stage>` = a nonce that enters the stage's
    # input digest, so neither its ledger record nor its stored outputs are reused).
    reruns: Mapping[str, str] = field(default_factory=dict)
    # The units of work its runs finished, with their measured ms (shared/engine/metering.py).
    metered: Mapping[str, int] = field(default_factory=dict)
    # Its runs' own notes (`note.<name>` fields, note.lua), by name: e.g. a remote backend's
    # prediction id, which a run taking the job over resumes instead of creating another.
    notes: Mapping[str, str] = field(default_factory=dict)
    # Times a run deferred it (errors.Deferred: not now, and no attempt counted).
    deferrals: int = 0

    @classmethod
    def from_hash(cls, raw: Mapping[str, str]) -> JobRecord:
        """Parse HGETALL output; raises `ValueError`/`KeyError` on a record we cannot read."""
        code = raw.get("error_code", "")
        error = (
            JobError(code, raw.get("error_message", ""), raw.get("error_retryable") == "1")
            if code
            else None
        )
        events = raw.get("webhook_events", "")
        groups = _Groups.of(raw)
        return cls(
            id=raw["id"],
            tenant=raw.get("tenant", ""),
            status=JobStatus(raw["status"]),
            quality=raw.get("quality", ""),
            stream=StreamName(raw["stream"]),
            attempts=_int(raw, "attempts"),
            deliveries=_int(raw, "deliveries"),
            progress=float(raw.get("progress") or 0.0),
            stage=raw.get("stage") or "queued",  # left implicit in a new record
            created_at_ms=_int(raw, "created_at_ms"),
            started_at_ms=_opt_int(raw, "started_at_ms"),
            completed_at_ms=_opt_int(raw, "completed_at_ms"),
            lease_until_ms=_opt_int(raw, "lease_until_ms"),
            params=_json(raw, "params", {}),
            metadata=_json(raw, "metadata", {}),
            artifacts=artifact_refs.from_record(raw, raw["id"]),
            compute_time_ms=_opt_int(raw, "compute_time_ms"),
            error=error,
            input_ref=raw.get("input_ref", ""),
            input_sha256=raw.get("input_sha256", ""),
            model=raw.get("model", ""),
            trace_id=raw.get("trace_id", ""),
            webhook_url=raw.get("webhook_url", ""),
            webhook_events=tuple(e for e in events.split(",") if e),
            cancel_requested=raw.get("cancel_requested") == "1",
            entry_id=raw.get("entry_id", ""),
            claim_key=raw.get("claim_key", ""),
            version=raw.get("v", ""),
            request_fingerprint=raw.get("request_fingerprint", ""),
            artifact_run=raw.get("artifact_run", ""),
            quick_run=raw.get("quick_run", ""),
            foreground=raw.get("foreground", ""),
            delivery_charge=float(raw.get("delivery_charge") or 0.0),
            hints=groups.hints,
            current_stage=raw.get("current_stage", ""),
            ledger=ledger_of(raw),
            redrives=_int(raw, "redrives"),
            reruns=groups.reruns,
            metered=groups.metered,
            notes=groups.notes,
            deferrals=_int(raw, "deferrals"),
        )


@dataclass(slots=True)
class _Groups:
    """A record's fields named by a prefix, gathered in one pass over the record (four
    scans of every field were a third of `from_hash`: it runs for every started job)."""

    hints: dict[str, str] = field(default_factory=dict)  # hint_<name>
    reruns: dict[str, str] = field(default_factory=dict)  # rerun.<stage>, set ones only
    metered: dict[str, int] = field(default_factory=dict)  # m.<unit> (metering.metered_unit)
    notes: dict[str, str] = field(default_factory=dict)  # note.<name>

    @classmethod
    def of(cls, raw: Mapping[str, str]) -> _Groups:
        g = cls()
        for name, value in raw.items():
            first = name[:1]
            if first == "h" and name.startswith("hint_"):
                g.hints[name[5:]] = value
            elif first == "r" and name.startswith("rerun.") and value:
                g.reruns[name[6:]] = value
            elif first == "m" and (unit := metered_unit(name, value)):
                g.metered[unit[0]] = unit[1]
            elif first == "n" and name.startswith("note."):
                g.notes[name[5:]] = value
        return g


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What a handler returns for a finished job; committed atomically with `completed`."""

    artifacts: Mapping[str, str] = field(default_factory=dict)
    compute_time_ms: int | None = None
    model: str = ""
    extra_fields: Mapping[str, str] = field(default_factory=dict)

    def problem(self) -> str | None:  # noqa: PLR0911 - one answer per kind of bad outcome
        """Why this outcome cannot be committed, or None. Checked at the worker's edge so a
        bad outcome fails its own job instead of the commit batch it would travel in (handlers
        are user code: the annotations are promises, not facts)."""
        artifacts: object = self.artifacts
        extra: object = self.extra_fields
        compute: object = self.compute_time_ms
        if (
            type(artifacts) is dict
            and type(extra) is dict
            and type(self.model) is str
            and (compute is None or type(compute) is int)
            and all(type(k) is str and type(v) is str for k, v in artifacts.items())
            and all(type(k) is str and type(v) is str for k, v in extra.items())
            and RESERVED_FIELDS.isdisjoint(extra)
        ):
            return None  # the common case, without ABC isinstance checks (a hot path)
        mappings: tuple[tuple[str, object], ...] = (
            ("artifacts", self.artifacts),
            ("extra_fields", self.extra_fields),
        )
        for kind, mapping in mappings:
            if not isinstance(mapping, Mapping):
                return f"{kind} is {type(mapping).__name__}, not a mapping"
            for name, value in mapping.items():
                if not isinstance(name, str) or not isinstance(value, str):
                    return (
                        f"{kind}[{name!r}] is {type(value).__name__}; names and values must be"
                        " strings"
                    )
                if kind == "extra_fields" and name in RESERVED_FIELDS:
                    return f"extra_fields may not set the engine's own field {name!r}"
        if compute is not None and (not isinstance(compute, int) or isinstance(compute, bool)):
            return f"compute_time_ms is {type(compute).__name__}, not int"
        model: object = self.model
        if not isinstance(model, str):
            return f"model is {type(model).__name__}, not str"
        return None


# Job hash fields only the engine's scripts write: a handler's extra fields may not touch them.
RESERVED_FIELDS = frozenset({
    "id", "status", "attempts", "deliveries", "entry_id", "claim_key", "lease_token",
    "tenant", "worker", "stream", "cancel_requested", "v", "current_stage", "last_commit",
    "fq", "fq_flow", "fq_cost", "deferrals",
    artifact_refs.ARTIFACTS, artifact_refs.ARTIFACT_BASE, artifact_refs.ARTIFACT_NAMES,
})  # fmt: skip


@dataclass(frozen=True, slots=True)
class StageDone:
    """What a pipeline stage's handler returns when its stage succeeded (any stage but the
    last, which returns a `JobOutcome`): the digest of the stage's inputs and the keys of
    its outputs, for the ledger and the next stage. The worker commits it with advance.lua."""

    digest: str
    outputs: Mapping[str, str] = field(default_factory=dict)
    # True when nothing ran: the ledger already held a success for this digest, or (also
    # `reused`) an earlier run of the stage had stored its outputs.
    skipped: bool = False
    # The work's measured time: this run's, or (reused) the time of the run that made it.
    work_ms: int | None = None
    reused: bool = False
    facts: Mapping[str, str] = field(default_factory=dict)
    # A second event to emit with the advance (e.g. preview_ready) and its JSON members.
    also_event: str = ""
    also_extra: str = ""


def pairs_to_dict(flat: list[str]) -> dict[str, str]:
    """Redis flat `[k1, v1, k2, v2]` replies (HGETALL inside Lua) to a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))
