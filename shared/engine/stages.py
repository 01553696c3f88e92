"""The staged pipeline's vocabulary: stage names and order, the stage ledger, and what the API
shows of them. Pure: no I/O.

A staged job moves through `PIPELINE` one stage at a time. Each stage has its own streams per
class (keys.KeySchema.for_stage), consumer group, retry budget and concurrency; a stage's
worker ends its run with an *advance* (advance.lua): in one step the stage's ledger record is
written, the job is queued on the next stage's stream and a `progress` event goes out. The
last job stage, `publish`, ends with the ordinary fenced `completed` commit; `cleanup` runs
after the terminal exit (it is not part of the job's life: its entry is added by the terminal
commit itself).

The ledger record of a stage (`ps.<stage>` in the job hash) holds the digest of the stage's
inputs (the previous stage's output digest, the model, the profile) and the keys of its
outputs: a stage run that finds a succeeded record with the digest it would compute skips its
work, and a stage's output is stored content-addressed by that digest, so a retried stage
reuses what an earlier run of it finished writing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

from splatq.shared.config.vocabulary import parse_stage_names


class PipelineStage(StrEnum):
    INGEST = "ingest"
    RECONSTRUCT = "reconstruct"
    EXPORT = "export"
    RENDER = "render"
    PUBLISH = "publish"
    CLEANUP = "cleanup"


# The stages a job passes through, in order; cleanup follows the terminal exit.
PIPELINE: tuple[PipelineStage, ...] = (
    PipelineStage.INGEST,
    PipelineStage.RECONSTRUCT,
    PipelineStage.EXPORT,
    PipelineStage.RENDER,
    PipelineStage.PUBLISH,
)
ALL_STAGES: tuple[PipelineStage, ...] = (*PIPELINE, PipelineStage.CLEANUP)
FIRST_STAGE = PIPELINE[0]
# The stages that need the accelerator (a GPU pod runs these; a CPU pod the rest).
DEVICE_STAGES: frozenset[PipelineStage] = frozenset({PipelineStage.RECONSTRUCT})

LEDGER_PREFIX = "ps."


class StageStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"


def next_stage(stage: PipelineStage) -> PipelineStage | None:
    """The stage after `stage` in the job's life, or None after the last (publish)."""
    if stage not in PIPELINE:
        return None
    i = PIPELINE.index(stage)
    return PIPELINE[i + 1] if i + 1 < len(PIPELINE) else None


def stages_from(stage: PipelineStage) -> tuple[PipelineStage, ...]:
    """`stage` and every job stage after it (what a redrive from `stage` runs again)."""
    return PIPELINE[PIPELINE.index(stage) :]


def parse_stage_list(raw: str) -> tuple[PipelineStage, ...]:
    """`--stages` / SPLATQ_STAGES: comma-separated names, or `all`. Raises ValueError on an
    unknown name; keeps pipeline order and drops repeats."""
    return tuple(PipelineStage(name) for name in parse_stage_names(raw))


def stage_digest(*parts: str) -> str:
    """Digest of a stage's inputs: its upstream output digest, model, profile..."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\x00")
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class StageRecord:
    """One stage's ledger record (`ps.<stage>` in the job hash, JSON)."""

    status: StageStatus
    attempts: int = 0
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    digest: str = ""
    # What the stage produced: object keys by name (the next stage's inputs).
    outputs: Mapping[str, str] = field(default_factory=dict)
    # The run found a succeeded record for the same digest and did no work.
    skipped: bool = False
    # How long the stage's own work took (ms), for the stage latency metrics.
    work_ms: int | None = None
    # Small facts later stages need besides the outputs (e.g. the Gaussian count).
    facts: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        body: dict[str, Any] = {"status": self.status.value, "attempts": self.attempts}
        if self.started_at_ms is not None:
            body["started_at_ms"] = self.started_at_ms
        if self.finished_at_ms is not None:
            body["finished_at_ms"] = self.finished_at_ms
        if self.digest:
            body["digest"] = self.digest
        if self.outputs:
            body["outputs"] = dict(self.outputs)
        if self.skipped:
            body["skipped"] = True
        if self.work_ms is not None:
            body["work_ms"] = self.work_ms
        if self.facts:
            body["facts"] = dict(self.facts)
        return orjson.dumps(body).decode()

    @classmethod
    def from_json(cls, raw: str) -> StageRecord | None:
        """The record, or None for an empty or unreadable one (a redrive clears a stage's
        record by writing ''; an unreadable one is treated as never run)."""
        if not raw:
            return None
        try:
            body = orjson.loads(raw)
            return cls(
                status=StageStatus(body["status"]),
                attempts=int(body.get("attempts", 0)),
                started_at_ms=_opt_int(body.get("started_at_ms")),
                finished_at_ms=_opt_int(body.get("finished_at_ms")),
                digest=str(body.get("digest", "")),
                outputs={str(k): str(v) for k, v in dict(body.get("outputs", {})).items()},
                skipped=bool(body.get("skipped", False)),
                work_ms=_opt_int(body.get("work_ms")),
                facts={str(k): str(v) for k, v in dict(body.get("facts", {})).items()},
            )
        except (ValueError, TypeError, KeyError, orjson.JSONDecodeError):
            return None


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def ledger_of(raw: Mapping[str, str]) -> dict[PipelineStage, StageRecord]:
    """The ledger records in a job hash, by stage."""
    out: dict[PipelineStage, StageRecord] = {}
    for stage in ALL_STAGES:
        value = raw.get(LEDGER_PREFIX + stage.value)
        record = StageRecord.from_json(value) if value else None
        if record is not None:
            out[stage] = record
    return out


def cleared_ledger_fields(stages: Iterable[PipelineStage]) -> list[str]:
    """Field/value pairs that clear the ledger records of `stages` (a redrive from a stage)."""
    pairs: list[str] = []
    for stage in stages:
        pairs += [LEDGER_PREFIX + stage.value, ""]
    return pairs


# Formats a Unix-millisecond time the way the API shows its other times (the gateway passes
# its own RFC 3339 formatter, so a stage's times read exactly like the job's).
TimeFormat = Callable[[int | None], str | None]


@dataclass(frozen=True, slots=True)
class StageContext:
    """What the stage view needs of the job besides its ledger."""

    current_stage: str
    status: str  # the job's status
    attempts: int
    started_at_ms: int | None
    completed_at_ms: int | None
    # The job's error as the job view renders it (None unless the job is failed or retrying).
    error: Mapping[str, Any] | None
    # The job's `stage` is `dead_lettered` (finish.lua with a dead-letter reason, reclaim.lua
    # past the delivery limit, a corrupt record).
    dead_lettered: bool


def stage_views(
    ledger: Mapping[PipelineStage, StageRecord], ctx: StageContext, time_format: TimeFormat
) -> dict[str, dict[str, Any]]:
    """The API's `stages` object (api-contract "v1.1 additions"): every stage by name, with
    status, attempts, started_at, finished_at (formatted by `time_format`) and error. Empty
    for a job that never entered the staged pipeline (a monolithic worker ran it whole, or
    no staged worker has taken it yet).

    A stage with a ledger record shows the record. The job's current stage, unless its
    record says it succeeded, shows the job's own run: `running` while the job is processing
    or retrying (with the error of the failed attempt while retrying), `failed` or
    `dead_lettered` with the job's error once the job failed there, `succeeded` for publish
    (which ends with the job's `completed` commit, not with a ledger record). Every other
    stage is `pending`: not reached yet, or never to run (a canceled or failed job)."""
    if not ctx.current_stage and not ledger:
        return {}
    views: dict[str, dict[str, Any]] = {}
    for stage in ALL_STAGES:
        record = ledger.get(stage)
        view: dict[str, Any] = {
            "status": StageStatus.PENDING.value,
            "attempts": 0,
            "started_at": None,
            "finished_at": None,
            "error": None,
        }
        if record is not None:
            view.update(
                status=record.status.value,
                attempts=record.attempts,
                started_at=time_format(record.started_at_ms),
                finished_at=time_format(record.finished_at_ms),
            )
        if stage.value == ctx.current_stage and (
            record is None or record.status != StageStatus.SUCCEEDED
        ):
            view["attempts"] = ctx.attempts
            error = dict(ctx.error) if ctx.error else None
            if ctx.status in {"processing", "retrying"}:
                view["status"] = StageStatus.RUNNING.value
                view["started_at"] = time_format(ctx.started_at_ms)
                view["error"] = error if ctx.status == "retrying" else None
            elif ctx.status == "failed":
                view["status"] = (
                    StageStatus.DEAD_LETTERED.value
                    if ctx.dead_lettered
                    else StageStatus.FAILED.value
                )
                view["started_at"] = time_format(ctx.started_at_ms)
                view["finished_at"] = time_format(ctx.completed_at_ms)
                view["error"] = error
            elif ctx.status == "completed" and stage == PipelineStage.PUBLISH:
                view["status"] = StageStatus.SUCCEEDED.value
                view["started_at"] = time_format(ctx.started_at_ms)
                view["finished_at"] = time_format(ctx.completed_at_ms)
        views[stage.value] = view
    return views
