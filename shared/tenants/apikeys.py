"""API keys: generated with 256 bits of entropy, stored only as their SHA-256. Pure.

A plain (unsalted, fast) hash is enough here: the key is random and long, so a stolen hash
table cannot be reversed by guessing, and lookup by hash needs no constant-time compare (the
hash of the presented key is the lookup key; nothing about a stored key leaks by timing).
"""

from __future__ import annotations

import hashlib
import secrets

from splatq.shared.engine.ids import ulid

KEY_PREFIX = "sq_live_"


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


# What `new_key_id` makes: the admin API refuses any other `rotate`, and the OpenAPI document
# declares the same pattern.
KEY_ID_PATTERN = "key_[0-9A-Z]{26}"


def new_key_id() -> str:
    return f"key_{ulid()}"


def key_hash(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def key_hint(api_key: str) -> str:
    """What may be shown of a key later (lists, logs): its prefix and last four characters."""
    return f"{api_key[: len(KEY_PREFIX)]}…{api_key[-4:]}"
