"""The staged pipeline in the OpenAPI document: the stage members of the `progress` event
(shared/engine/events.py `stage_fields`, and the stage start in shared/engine/lua/
_preamble.lua `start_entry`) and what a receiver should know of the staged events. The job's
`current_stage` and `stages` (one `JobStage` per stage) are in the Job shape
(services/gateway/shapes.py).

Names come from shared/engine/stages.py, so the document and the engine cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from splatq.services.gateway.shape_schema import ref
from splatq.shared.engine.stages import StageStatus

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
