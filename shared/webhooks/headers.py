"""Custom headers of a webhook endpoint (sent with every delivery to it): validation, and the
stored form. Pure.

A receiver behind an API gateway often wants a static header (an API key of its own, a
routing hint), as Svix and Stripe users set. What is refused, so a custom header can never
change how a delivery is framed, signed or routed:
- hop-by-hop and framing headers (RFC 9110 section 7.6.1, and Host, Content-Length,
  Transfer-Encoding, Content-Encoding, Content-Type, Expect, TE, Trailer, Upgrade);
- the Standard Webhooks signature headers (`webhook-id`, `webhook-timestamp`,
  `webhook-signature`) and anything else under `webhook-`; User-Agent (it names splatq);
  the W3C trace context (`traceparent`, `tracestate`: the dispatcher's own span);
- names that are not HTTP tokens, values with control characters or outside visible
  ASCII/space (no header injection), more than MAX_HEADERS, a name over MAX_NAME, a value
  over MAX_VALUE, or more than MAX_TOTAL bytes in all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

MAX_HEADERS = 20
MAX_NAME = 64
MAX_VALUE = 1024
MAX_TOTAL = 4096
RESERVED = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
    "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host",
    "content-length", "content-encoding", "content-type", "expect", "user-agent",
    "traceparent", "tracestate",
})  # fmt: skip
RESERVED_PREFIXES = ("webhook-", "proxy-")
_TOKEN_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE_RE = re.compile(r"[\x20-\x7e]*")


class HeadersRejected(ValueError):
    """The custom headers cannot be used; the message names the header and why."""


def validate_headers(raw: Any) -> dict[str, str]:
    """The custom headers of a request body (`{"Name": "value", ...}`, null or {} for none),
    names kept as written; HeadersRejected names what is wrong."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise HeadersRejected("headers must be an object of header names to string values")
    if len(raw) > MAX_HEADERS:
        raise HeadersRejected(f"headers may hold at most {MAX_HEADERS} headers")
    seen: set[str] = set()
    total = 0
    out: dict[str, str] = {}
    for name, value in raw.items():
        if not _TOKEN_RE.fullmatch(name) or len(name) > MAX_NAME:
            raise HeadersRejected(
                f"header name {name[:80]!r} is not an HTTP token of at most {MAX_NAME} characters"
            )
        lowered = name.lower()
        if lowered in RESERVED or lowered.startswith(RESERVED_PREFIXES):
            raise HeadersRejected(
                f"header {name!r} is set by splatq (framing, hop-by-hop or signature headers)"
            )
        if lowered in seen:
            raise HeadersRejected(f"header {name!r} is given twice (names are case-insensitive)")
        seen.add(lowered)
        if not isinstance(value, str):
            raise HeadersRejected(f"header {name!r} must have a string value")
        if len(value) > MAX_VALUE or not _VALUE_RE.fullmatch(value):
            raise HeadersRejected(
                f"header {name!r}: the value must be at most {MAX_VALUE} visible ASCII"
                " characters or spaces (no control characters)"
            )
        total += len(name) + len(value)
        out[name] = value.strip(" ")
    if total > MAX_TOTAL:
        raise HeadersRejected(f"headers may hold at most {MAX_TOTAL} bytes in all")
    return out


def encode_headers(headers: Mapping[str, str]) -> str:
    """The stored form (the endpoint hash's `headers` field): JSON, '' for none."""
    return orjson.dumps(dict(headers)).decode() if headers else ""


def decode_headers(stored: str) -> dict[str, str]:
    """The stored form back; anything unreadable (a hand-edited hash) counts as none."""
    if not stored:
        return {}
    try:
        doc = orjson.loads(stored)
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return {str(k): str(v) for k, v in doc.items()}
