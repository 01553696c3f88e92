"""The staged pipeline in the OpenAPI document: the job's `current_stage` and `stages`
(one `JobStage` per stage, as services/gateway/views.py `stages_view` renders it) and the
stage members of the `progress` event (shared/engine/events.py `stage_fields`, and the stage
start in shared/engine/lua/_preamble.lua `start_entry`).

Names come from shared/engine/stages.py, so the document and the engine cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from splatq.services.gateway.openapi_common import nullable, ref
from splatq.shared.engine.stages import ALL_STAGES, StageStatus

STAGE_NAMES = [s.value for s in ALL_STAGES]
STAGE_STATUSES = [s.value for s in StageStatus]
_TIME_OR_NULL = {"type": ["string", "null"], "format": "date-time"}

JOB_STAGE: dict[str, Any] = {
    "type": "object",
    "description": "One stage of a staged job. `pending`: not reached (or never to run: a "
    "canceled or failed job's later stages); `running`: the job is in this stage, being "
    "processed or waiting for its retry (then `error` is the failed attempt's); `succeeded`; "
    "`failed` or `dead_lettered`: the job failed in this stage (`error` says why).",
    "required": ["status", "attempts", "started_at", "finished_at", "error"],
    "properties": {
        "status": {"type": "string", "enum": STAGE_STATUSES},
        "attempts": {"type": "integer", "minimum": 0},
        "started_at": _TIME_OR_NULL,
        "finished_at": _TIME_OR_NULL,
        "error": nullable("JobError", "the failed attempt's error, or null"),
    },
}

# The Job schema's members for the staged pipeline.
JOB_PROPERTIES: dict[str, Any] = {
    "current_stage": nullable(
        "PipelineStage",
        "the pipeline stage the job is in (or ended in); null for a job no staged worker has "
        "taken (yet)",
    ),
    "stages": {
        "type": "object",
        "description": "every pipeline stage by name, in pipeline order: "
        + ", ".join(STAGE_NAMES)
        + " (cleanup runs after a completed or canceled job ended); `{}` for a job no "
        "staged worker has taken (yet)",
        "properties": {name: ref("JobStage") for name in STAGE_NAMES},
        "additionalProperties": False,
    },
}

# The `progress` event's members besides `progress` and `stage`, sent by the staged pipeline.
PROGRESS_STAGE_MEMBERS: dict[str, Any] = {
    "stage_status": {
        "type": "string",
        "enum": [StageStatus.RUNNING.value, StageStatus.SUCCEEDED.value],
        "description": "staged pipeline: `stage` (a pipeline stage) started (`running`) or "
        "finished (`succeeded`); absent on a whole-job worker's progress, whose `stage` is a "
        "free-form step",
    },
    "next_stage": {
        **ref("PipelineStage"),
        "description": "with `succeeded`: the stage the job moves on to",
    },
    "attempt": {
        "type": "integer",
        "minimum": 1,
        "description": "with `running`: the stage's attempt",
    },
}

PREVIEW_READY_DESCRIPTION = (
    "A progressive full job's quick result is available: the image reconstructed at the "
    "preview resolution (`resolution`), encoded and rendered like the full result; "
    "`data.artifacts` as in `completed`, each URL with `?variant=quick`. Sent once per job "
    "(again only after a redrive that runs reconstruct again), only for a full job "
    "submitted with `progressive: true` and run by the staged pipeline, the moment the quick "
    "files are committed (while the full pass may still run), so before `completed`. Not a "
    "terminal event: the full result follows as usual (`completed`, or `failed`/`canceled`; "
    "the quick result stays downloadable either way)."
)
PROGRESSIVE_DESCRIPTION = (
    "A full job first gets a quick preview-resolution result, announced by "
    "`3d_reconstruction.preview_ready`, then the full result as usual. It costs an extra "
    "preview-resolution forward pass (reserved and charged as GPU time with the job). "
    "Accepted and ignored on a preview job. Identical submissions share a job (the cache) "
    "only with the same `progressive`."
)
QUICK_VARIANT_DESCRIPTION = (
    "`quick`: the artifact of a progressive job's quick result (the URLs of its "
    "`preview_ready` event), available from that event on, whatever the job's status; "
    "absent: the job's result (completed jobs only)"
)
PROGRESS_DESCRIPTION = (
    "The job's progress. A staged job sends one when a stage after the first starts "
    "(`stage_status: running`) and one when a stage before the last succeeds "
    "(`stage_status: succeeded`, with `next_stage`); the first stage's start is the "
    "`started` event and the last stage's success the `completed` event."
)
