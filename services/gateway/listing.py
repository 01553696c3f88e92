"""GET /v1/jobs: the caller's jobs, newest first, filtered and paged by an opaque cursor.

Query: `status` (one or more, comma-separated or repeated), `created_since` and
`created_until` (RFC 3339; since inclusive, until exclusive), `limit` (1..MAX_LIMIT),
`cursor` (the previous page's `next_cursor`; it is bound to the filters it was made for).
The engine read is shared/engine/listing.py; this module is the HTTP side of it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlencode

import orjson
from aiohttp import web
from multidict import MultiMapping

from splatq.services.gateway.digits import is_digits
from splatq.services.gateway.problems import invalid_request
from splatq.shared.engine.listing import JobFilter, Position
from splatq.shared.engine.states import JobStatus

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
QUERY_PARAMS = frozenset({"status", "created_since", "created_until", "limit", "cursor"})
_STATUSES = frozenset(s.value for s in JobStatus)
_CURSOR_VERSION = 1
_SPACED_OFFSET_RE = re.compile(r" ([0-9]{2}:[0-9]{2})$")


@dataclass(frozen=True, slots=True)
class ListQuery:
    job_filter: JobFilter
    limit: int
    after: Position | None

    def filter_digest(self) -> str:
        return _filter_digest(self.job_filter)


def parse_query(query: MultiMapping[str]) -> ListQuery:
    """The query string of GET /v1/jobs; 400 `invalid_request` naming what is wrong."""
    unknown = sorted(set(query) - QUERY_PARAMS)
    if unknown:
        raise invalid_request(f"unknown query parameter {unknown[0]!r}")
    statuses = frozenset(s.strip() for raw in query.getall("status", []) for s in raw.split(","))
    bad = sorted(statuses - _STATUSES)
    if bad:
        raise invalid_request(f"status {bad[0]!r} is not one of {sorted(_STATUSES)}")
    job_filter = JobFilter(
        statuses=statuses,
        since_ms=_time_ms(query, "created_since"),
        until_ms=_time_ms(query, "created_until"),
    )
    raw_limit = query.get("limit", str(DEFAULT_LIMIT))
    if not is_digits(raw_limit) or not 1 <= int(raw_limit) <= MAX_LIMIT:
        raise invalid_request(f"limit must be an integer within [1, {MAX_LIMIT}]")
    # Present but empty is refused like any value this API did not return.
    cursor = query.get("cursor")
    after = decode_cursor(cursor, _filter_digest(job_filter)) if cursor is not None else None
    return ListQuery(job_filter, int(raw_limit), after)


def _time_ms(query: MultiMapping[str], name: str) -> int | None:
    raw = query.get(name)
    if raw is None:
        return None
    # An unencoded "+hh:mm" offset arrives as " hh:mm" (a query string's "+" is a space).
    raw = _SPACED_OFFSET_RE.sub(r"+\1", raw)
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise invalid_request(f"{name} must be an RFC 3339 time, got {raw[:64]!r}") from None
    if moment.tzinfo is None:
        raise invalid_request(f"{name} must carry a time zone (e.g. Z)")
    return int(moment.timestamp() * 1000)


def _filter_digest(job_filter: JobFilter) -> str:
    canonical = orjson.dumps(
        [sorted(job_filter.statuses), job_filter.since_ms, job_filter.until_ms]
    )
    return hashlib.sha256(canonical).hexdigest()[:12]


def encode_cursor(position: Position, filter_digest: str) -> str:
    raw = orjson.dumps([_CURSOR_VERSION, position.created_ms, position.job_id, filter_digest])
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(cursor: str, filter_digest: str) -> Position:
    """The position a cursor holds; 400 for anything this gateway did not make, or a cursor
    made for other filters (the page after it would not be the next page)."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        version, created_ms, job_id, digest = orjson.loads(base64.urlsafe_b64decode(padded))
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise invalid_request("cursor is not a cursor this API returned") from None
    if (
        version != _CURSOR_VERSION
        or not isinstance(created_ms, int)
        or not isinstance(job_id, str)
        or not isinstance(digest, str)
    ):
        raise invalid_request("cursor is not a cursor this API returned")
    if digest != filter_digest:
        raise invalid_request("cursor was made for other filters; send the same filters")
    return Position(created_ms, job_id)


def next_url(request: web.Request, base_url: str, cursor: str) -> str:
    """The next page's URL: this request's query with `cursor` replaced."""
    params = [(k, v) for k, v in request.query.items() if k != "cursor"]
    params.append(("cursor", cursor))
    return f"{base_url}{request.path}?{urlencode(params)}"
