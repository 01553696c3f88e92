"""Settings without their secrets, for `Settings.__repr__` and URLs that reach logs."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

_SECRET_NAME_PARTS = ("key", "secret", "password", "token")
REDACTED = "<redacted>"


def redacted(name: str, value: Any) -> Any:
    """A field's value as `Settings.__repr__` shows it."""
    if name == "api_keys":
        # {key: tenant}: the tenants are no secret, the keys are.
        return f"{REDACTED} ({len(value)} keys of {sorted(set(value.values()))})"
    if isinstance(value, str) and value and any(p in name for p in _SECRET_NAME_PARTS):
        return REDACTED
    if isinstance(value, str) and "://" in value:
        return redact_url(value)
    return value


def redact_url(url: str) -> str:
    """`url` without its credentials: the user-info part (`user:password@`) and the values of
    query parameters that name a secret (`?password=…`) become `<redacted>`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED  # unparsable: it could hide a credential anywhere
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    params = []
    for item in parts.query.split("&") if parts.query else []:
        name, eq, _ = item.partition("=")
        secret = eq and any(p in name.lower() for p in _SECRET_NAME_PARTS)
        params.append(f"{name}={REDACTED}" if secret else item)
    return urlunsplit(parts._replace(netloc=netloc, query="&".join(params)))
