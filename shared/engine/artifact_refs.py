"""How a job record keeps its artifacts' URLs. Pure.

A worker's outcome names each artifact by its URL, and nearly always that URL is the
gateway's own, `<base>/v1/jobs/<job id>/artifacts/<name>` (services/gpu_worker/handler.py's
`artifact_url`): the record then keeps the base once and the names (`artifact_base`,
`artifact_names`: ~50 bytes where the URLs took ~500 for four artifacts, for the record's
whole retention). Any other outcome (a handler's own URLs, a name that a comma would split)
is kept whole as a JSON object in `artifacts`, as every record before this did. Both forms
are read back to the same mapping; each write clears the other form, so a job committed
again (a redrive) never shows a stale mix.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

ARTIFACTS = "artifacts"  # JSON object name -> URL (the general form)
ARTIFACT_BASE = "artifact_base"  # the URLs' common base (the compact form)
ARTIFACT_NAMES = "artifact_names"  # the names, comma-separated (the compact form)


def job_artifact_path(job_id: str) -> str:
    """The path under the gateway's base URL of a job's artifacts, up to the name."""
    return f"/v1/jobs/{job_id}/artifacts/"


def record_fields(job_id: str, artifacts: Mapping[str, str]) -> dict[str, str]:
    """The record fields that keep `artifacts` (name -> URL) of job `job_id`."""
    path = job_artifact_path(job_id)
    base: str | None = None
    for name, url in artifacts.items():
        tail = path + name
        if not name or "," in name or not url.endswith(tail):
            base = None
            break
        here = url[: -len(tail)]
        if base is None:
            base = here
        elif here != base:
            base = None
            break
    if base is None:
        return {
            ARTIFACTS: orjson.dumps(dict(artifacts)).decode(),
            ARTIFACT_BASE: "",
            ARTIFACT_NAMES: "",
        }
    return {ARTIFACTS: "", ARTIFACT_BASE: base, ARTIFACT_NAMES: ",".join(artifacts)}


def from_record(raw: Mapping[str, str], job_id: str) -> dict[str, str] | None:
    """The artifacts (name -> URL) a record keeps, or None when it keeps none (a job not
    completed). Raises ValueError on an `artifacts` field that is not a JSON object."""
    names = raw.get(ARTIFACT_NAMES, "")
    if names:
        prefix = raw.get(ARTIFACT_BASE, "") + job_artifact_path(job_id)
        return {name: prefix + name for name in names.split(",")}
    encoded = raw.get(ARTIFACTS, "")
    if not encoded:
        return None
    value = orjson.loads(encoded)
    if not isinstance(value, dict):
        raise ValueError("the record's artifacts are not a JSON object")
    return value
