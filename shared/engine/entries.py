"""Validation of raw stream entries before a worker trusts them.

Pure: returns a reason code for a malformed entry (dead-lettered by the caller), else None.
"""

from __future__ import annotations

from collections.abc import Mapping

from splatq.shared.engine.ids import JOB_ID_RE
from splatq.shared.engine.jobs import JOB_FORMAT_VERSION

MISSING_FIELDS = "missing_fields"
BAD_JOB_ID = "bad_job_id"
WRONG_PARTITION = "wrong_partition"
UNSUPPORTED_VERSION = "unsupported_version"
UNKNOWN_JOB = "unknown_job"


def entry_problem(fields: Mapping[str, str], partition: int) -> tuple[str, str] | None:
    """(reason code, detail) when an entry cannot be processed, else None."""
    if "job" not in fields or "v" not in fields:
        return MISSING_FIELDS, f"entry lacks 'job' or 'v' (has {sorted(fields)[:10]})"
    if fields["v"] != JOB_FORMAT_VERSION:
        return UNSUPPORTED_VERSION, (
            f"entry format version {fields['v']!r}; this worker reads {JOB_FORMAT_VERSION!r}"
        )
    match = JOB_ID_RE.fullmatch(fields["job"])
    if match is None:
        return BAD_JOB_ID, f"{fields['job'][:100]!r} is not a job id"
    if int(match.group(1)) != partition:
        return WRONG_PARTITION, f"job of partition {match.group(1)} in partition {partition}"
    return None
