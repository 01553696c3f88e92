"""Identifiers: job ids that carry their partition, event ids, trace ids.

Pure functions; no I/O. Ids are ULID-like (time-ordered, 80 random bits) so they sort by creation.
"""

from __future__ import annotations

import base64
import os
import re
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_TO_CROCKFORD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", _CROCKFORD.encode())
JOB_ID_RE = re.compile(r"job_(\d{3})([0-9A-HJKMNP-TV-Z]{26})")  # use fullmatch


def ulid(now_ms: int | None = None) -> str:
    """26 Crockford base32 chars: 48-bit millisecond timestamp then 80 random bits.

    base32 of the 16 big-endian bytes, mapped onto Crockford's alphabet (which keeps the
    order), so ids sort by creation time.
    """
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    raw = ms.to_bytes(6, "big") + os.urandom(10)
    return base64.b32encode(raw)[:26].translate(_TO_CROCKFORD).decode()


def new_job_id(partition: int) -> str:
    """`job_` + three-digit partition + ULID, e.g. `job_000 01JD…`; the partition picks the slot."""
    if not 0 <= partition <= 999:
        raise ValueError(f"partition out of range: {partition}")
    return f"job_{partition:03d}{ulid()}"


def partition_of(job_id: str) -> int:
    """The partition encoded in a job id; `ValueError` for anything that is not a job id."""
    match = JOB_ID_RE.fullmatch(job_id)
    if match is None:
        raise ValueError(f"not a job id: {job_id!r}")
    return int(match.group(1))


def is_job_id(value: str) -> bool:
    return JOB_ID_RE.fullmatch(value) is not None


def new_event_id() -> str:
    return f"evt_{ulid()}"


def new_trace_id() -> str:
    """W3C trace-context sized (16 bytes, lowercase hex)."""
    return os.urandom(16).hex()
