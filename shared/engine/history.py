"""A job's own event history as SSE and `Prefer: wait` read it. Pure: the Redis side is
lua/history.lua (`Producers.job_history` runs it).

The history is a list of compact items, `<ms>\\t<name>\\t<event id>\\t<extra>`, one per
event (`emit` in lua/_preamble.lua writes them; the name without the namespace every event
shares), not the payloads: the payload's other parts -- the job id and its metadata -- are in
the record, so an item is a few dozen bytes where a payload repeats the metadata. `payload`
rebuilds the very bytes `emit` sent to the outbox (the webhook body), and a test holds the
two to that.
"""

from __future__ import annotations

from dataclasses import dataclass

from splatq.shared.engine.artifact_refs import job_artifact_path
from splatq.shared.engine.events import EVENT_NAMESPACE

# The SSE id of the start of a history (nothing read yet).
START = "0-0"

# An item's extra keeps the members every staged progress event repeats as one control
# character each: JSON text never holds a raw control character (a string escapes it), so
# each stands for its text alone and `expand` is exact. `emit` (lua/_preamble.lua) replaces
# them in this order, in progress events only (a no-op job's events pay nothing); the longer
# members first, so the generic one takes only what they left. ~70 of a progress item's
# ~130 bytes, nine progress events in a staged preview.
PROGRESS_TOKENS: tuple[tuple[str, str], ...] = (
    ("\x02", '"progress":'),
    ("\x03", ',"stage":"'),
    ("\x04", '","stage_status":"running","attempt":'),
    ("\x05", '","stage_status":"succeeded","next_stage":"'),
    ("\x06", '","stage_status":"'),
)
# ... and the job's own artifact path (`/v1/jobs/<job id>/artifacts/`) in any event that
# names its artifacts (`completed`, `preview_ready`): ~48 bytes an artifact.
ARTIFACT_PATH_TOKEN = "\x01"


def lua_constants() -> str:
    """The tokens as the Lua helpers use them (generated into every script, like the
    transition table): each member's text and its character."""
    rows = [f"  {{'{_lua_quote(text)}', '\\{ord(char)}'}}," for char, text in PROGRESS_TOKENS]
    return (
        "-- History item tokens (generated from shared/engine/history.py).\n"
        "local HISTORY_TOKENS = {\n" + "\n".join(rows) + "\n}\n"
        f"local ARTIFACT_PATH_TOKEN = '\\{ord(ARTIFACT_PATH_TOKEN)}'\n"
    )


def _lua_quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def expand(extra: str, job_id: str) -> str:
    """An item's extra as `emit` sent it to the outbox (the tokens given back their text)."""
    if not extra or min(extra) >= " ":
        return extra  # no token: an event without any (or an item from before them)
    extra = extra.replace(ARTIFACT_PATH_TOKEN, job_artifact_path(job_id))
    for char, text in PROGRESS_TOKENS:
        extra = extra.replace(char, text)
    return extra


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One event of a job's history: its SSE id, its name and its payload (JSON text)."""

    id: str
    type: str
    payload: str


def split_id(event_id: str) -> tuple[int, int]:
    """`<ms>-<seq>` -> (ms, seq); the caller validated the form (views.valid_stream_id)."""
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


def payload(name: str, event_id: str, ms: int, job_id: str, metadata: str, extra: str) -> str:
    """The event's payload exactly as `emit` built it for the outbox."""
    meta = metadata or "{}"
    body = (
        f'{{"event":"{name}","id":"{event_id}","timestamp":{ms // 1000},'
        f'"data":{{"job_id":"{job_id}","metadata":{meta}'
    )
    if extra:
        body += "," + extra
    return body + "}}"


def decode(reply: list[object]) -> list[HistoryEvent]:
    """history.lua's items (after the job id, metadata and wake id) as events."""
    job_id, metadata = str(reply[0]), str(reply[1])
    out: list[HistoryEvent] = []
    for item in reply[3:]:
        assert isinstance(item, list)
        if len(item) == 3:  # the legacy stream: the payload itself
            out.append(HistoryEvent(str(item[0]), str(item[1]), str(item[2])))
            continue
        sse_id, compact = str(item[0]), str(item[1])
        ms, name, event_id, extra = compact.split("\t", 3)
        if "." not in name:  # stored without the namespace every event shares
            name = f"{EVENT_NAMESPACE}.{name}"
        extra = expand(extra, job_id)
        out.append(
            HistoryEvent(sse_id, name, payload(name, event_id, int(ms), job_id, metadata, extra))
        )
    return out
