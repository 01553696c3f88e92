"""GET /v1/admin/tenants: every tenant the gateway knows, by name, a page at a time.

A tenant is known when it was created in Redis (the admin API, `splatq tenants create`) or is
named in SPLATQ_API_KEYS (configured); GET /v1/admin/tenants/{tenant} answers for both, so the
list shows both. The cursor is the last name of the page, base64url-encoded: the next page
starts after it, so a tenant created between two pages is listed when its name sorts later.
Pure: the handler reads the names and renders the page.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from multidict import MultiMapping

from splatq.services.gateway.digits import is_digits
from splatq.services.gateway.problems import invalid_request
from splatq.services.gateway.views import rfc3339

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
QUERY_PARAMS = frozenset({"limit", "cursor"})
CURSOR_PATTERN = "^[A-Za-z0-9_-]+$"


@dataclass(frozen=True, slots=True)
class TenantQuery:
    limit: int
    after: str | None


def parse_query(query: MultiMapping[str]) -> TenantQuery:
    unknown = sorted(set(query) - QUERY_PARAMS)
    if unknown:
        raise invalid_request(f"unknown query parameter {unknown[0]!r}")
    raw_limit = query.get("limit", str(DEFAULT_LIMIT))
    if not is_digits(raw_limit) or not 1 <= int(raw_limit) <= MAX_LIMIT:
        raise invalid_request(f"limit must be an integer within [1, {MAX_LIMIT}]")
    after = decode_cursor(query["cursor"]) if "cursor" in query else None
    return TenantQuery(int(raw_limit), after)


def encode_cursor(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).rstrip(b"=").decode()


def decode_cursor(cursor: str) -> str:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        name = base64.urlsafe_b64decode(padded.encode("ascii")).decode()
    except (ValueError, UnicodeError, binascii.Error):
        raise invalid_request("cursor is not a cursor this API returned") from None
    if not name or not cursor or encode_cursor(name) != cursor:
        raise invalid_request("cursor is not a cursor this API returned")
    return name


def page(
    created: Mapping[str, int], configured: Set[str], query: TenantQuery
) -> tuple[list[tuple[str, int | None, bool]], str | None]:
    """(name, created_ms or None, configured) for the page's tenants, and the next cursor."""
    names = sorted(set(created) | set(configured))
    if query.after is not None:
        names = [n for n in names if n > query.after]
    chosen = names[: query.limit]
    rows = [(n, created.get(n), n in configured) for n in chosen]
    more = len(names) > query.limit
    return rows, encode_cursor(chosen[-1]) if more and chosen else None


def next_url(base_url: str, path: str, query: TenantQuery, cursor: str | None) -> str | None:
    if cursor is None:
        return None
    return f"{base_url}{path}?{urlencode({'limit': query.limit, 'cursor': cursor})}"


def view(rows: list[tuple[str, int | None, bool]]) -> list[dict[str, Any]]:
    return [
        {"tenant": name, "created_at": rfc3339(ms), "configured": configured}
        for name, ms, configured in rows
    ]
