"""`SettingsError`, and the admin key's strength rule (checked at start and by the admin API)."""

from __future__ import annotations


class SettingsError(ValueError):
    """An environment variable holds a value that cannot be used."""


# The admin API's key: long and varied enough that guessing it is hopeless even unthrottled.
MIN_ADMIN_KEY_CHARS = 32
MIN_ADMIN_KEY_DISTINCT = 10


def check_admin_key(key: str) -> None:
    """SettingsError unless `key` is a strong admin key (never echoed in the message)."""
    if (
        len(key) < MIN_ADMIN_KEY_CHARS
        or len(set(key)) < MIN_ADMIN_KEY_DISTINCT
        or not (key.isascii() and key.isprintable())
        or " " in key
    ):
        raise SettingsError(
            f"SPLATQ_ADMIN_API_KEY is too weak: it must be at least {MIN_ADMIN_KEY_CHARS}"
            f" visible ASCII characters, at least {MIN_ADMIN_KEY_DISTINCT} of them different"
            " (generate one: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
