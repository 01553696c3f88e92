"""What a remote call writes into its job (the engine's notes, `note.<name>`): the names, and
the job view's `upstream` object made from them. Pure.

Per call (`call` = the quality it ran for; a progressive job makes a preview call too):
`up.<call>.vendor`, `.pred` (the prediction id, recorded before waiting on it), `.digest`
(the input it was made for), `.seq` (predictions of this call that failed: the next one gets
a new idempotency key), `.rid` (the vendor's request id), `.lat` (upstream latency, ms),
`.status`, `.charge` and `.basis` (what the quota is charged, and from what), `.since` (when
the call first met a paused lane or an open circuit: the bounded wait runs from there).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def note_name(call: str, field: str) -> str:
    return f"up.{call}.{field}"


def call_notes(notes: Mapping[str, str], call: str) -> dict[str, str]:
    """The notes of one call, by field name."""
    prefix = f"up.{call}."
    return {k[len(prefix) :]: v for k, v in notes.items() if k.startswith(prefix)}


def _int_or_none(value: str) -> int | None:
    return int(value) if value.isdigit() else None


def upstream_view(notes: Mapping[str, str], quality: str) -> dict[str, Any] | None:
    """The contract's `upstream` object of a job: null unless a remote backend ran it."""
    mine = call_notes(notes, quality)
    if not mine.get("vendor"):
        return None
    return {
        "vendor": mine["vendor"],
        "request_id": mine.get("rid") or mine.get("pred") or None,
        "latency_ms": _int_or_none(mine.get("lat", "")),
        "prediction_id": mine.get("pred") or None,
    }
