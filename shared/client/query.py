"""Request parts the client builds from typed arguments: pure (no I/O, no clock).

`list_query` is the query string of `GET /v1/jobs`; `prefer_wait` the `Prefer: wait=N` header
of a submit. Arguments the gateway would refuse for sure are refused here with `ValueError`
(before any request); the gateway stays the judge of the rest (e.g. a `limit` over its max).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TypedDict

from splatq.shared.engine.states import JobStatus

StatusFilter = str | JobStatus | Iterable[str | JobStatus] | None
TimeBound = datetime | str | None


class JobFilters(TypedDict, total=False):
    """The keywords of `iter_jobs`: what to list and the page size."""

    status: StatusFilter
    created_since: TimeBound
    created_until: TimeBound
    limit: int | None


class PageQuery(JobFilters, total=False):
    """The keywords of `list_jobs`: the filters and the previous page's cursor."""

    cursor: str | None


def list_query(
    status: StatusFilter = None,
    created_since: TimeBound = None,
    created_until: TimeBound = None,
    limit: int | None = None,
    cursor: str | None = None,
) -> list[tuple[str, str]]:
    """The query of `GET /v1/jobs`. `status`: one status, or several (any of them); times: an
    aware `datetime` (sent as UTC, `Z`) or an RFC 3339 string passed as it is."""
    query: list[tuple[str, str]] = []
    statuses = statuses_of(status)
    if statuses:
        query.append(("status", ",".join(statuses)))
    for name, bound in (("created_since", created_since), ("created_until", created_until)):
        if bound is not None:
            query.append((name, rfc3339(bound, name)))
    if limit is not None:
        query.append(("limit", str(int(limit))))
    if cursor:
        query.append(("cursor", cursor))
    return query


def statuses_of(status: StatusFilter) -> list[str]:
    """The status names, validated and deduplicated in order; `ValueError` for an unknown one."""
    if status is None:
        return []
    raw = [status] if isinstance(status, str) else list(status)
    names: list[str] = []
    for item in raw:
        for part in str(item).split(","):
            name = part.strip()
            if not name:
                continue
            try:
                name = JobStatus(name).value
            except ValueError:
                known = ", ".join(s.value for s in JobStatus)
                raise ValueError(f"unknown job status {name!r} (one of {known})") from None
            if name not in names:
                names.append(name)
    return names


def rfc3339(bound: datetime | str, name: str = "time") -> str:
    if isinstance(bound, str):
        return bound
    if bound.tzinfo is None:
        raise ValueError(f"{name} must be an aware datetime (the API needs a time zone)")
    return bound.astimezone(UTC).isoformat().replace("+00:00", "Z")


def prefer_wait(wait_s: int | None) -> dict[str, str]:
    """`Prefer: wait=N` for a submit (none for None). The gateway clamps N to its own bound
    (60 s by default); 0 asks for no wait."""
    if wait_s is None:
        return {}
    if isinstance(wait_s, bool) or not isinstance(wait_s, int) or wait_s < 0:
        raise ValueError(f"wait_s must be a non-negative integer, got {wait_s!r}")
    return {"Prefer": f"wait={wait_s}"}
