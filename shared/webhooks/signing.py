"""Standard Webhooks signatures: secrets, signing a delivery, verifying one (constant time).

Pure functions over bytes and header mappings; no I/O, no clock except `verify`'s default `now`.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from secrets import token_bytes
from typing import Final, Literal

SECRET_PREFIX: Final = "whsec_"
MIN_KEY_BYTES: Final = 24
MAX_KEY_BYTES: Final = 64
MAX_MSG_ID_LEN: Final = 255
DEFAULT_TOLERANCE_S: Final = 300
SIGNATURE_VERSION: Final = "v1"

HEADER_ID: Final = "webhook-id"
HEADER_TIMESTAMP: Final = "webhook-timestamp"
HEADER_SIGNATURE: Final = "webhook-signature"

SignatureErrorCode = Literal[
    "missing_headers", "bad_timestamp", "timestamp_out_of_tolerance", "no_matching_signature"
]
MISSING_HEADERS: Final = "missing_headers"
BAD_TIMESTAMP: Final = "bad_timestamp"
TIMESTAMP_OUT_OF_TOLERANCE: Final = "timestamp_out_of_tolerance"
NO_MATCHING_SIGNATURE: Final = "no_matching_signature"

# Visible ASCII without "." (the spec's advice: the signed content is "{id}.{timestamp}.{body}",
# so an id ending in ".<digits>" could shift the boundaries) and without spaces, which HTTP
# strips from the ends of header values.
_MSG_ID_RE: Final = re.compile(r"[\x21-\x2d\x2f-\x7e]{1,255}")
_TIMESTAMP_RE: Final = re.compile(r"[0-9]{1,15}")
_BASE64_RE: Final = re.compile(r"[A-Za-z0-9+/]*={0,2}")


class SignatureError(Exception):
    """A delivery failed verification; `code` is stable and safe to show to the sender."""

    def __init__(self, code: SignatureErrorCode, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code: SignatureErrorCode = code
        self.detail = detail


@dataclass(frozen=True, slots=True)
class WebhookHeaders:
    """The three Standard Webhooks headers of one delivery, read but not yet verified."""

    msg_id: str
    timestamp: int
    signature: str


def generate_secret(nbytes: int = 32) -> str:
    """A new `whsec_...` secret with `nbytes` (24-64) random bytes of key."""
    if not MIN_KEY_BYTES <= nbytes <= MAX_KEY_BYTES:
        raise ValueError(f"a secret key has {MIN_KEY_BYTES}-{MAX_KEY_BYTES} bytes, not {nbytes}")
    return SECRET_PREFIX + base64.b64encode(token_bytes(nbytes)).decode("ascii")


def parse_secret(secret: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret (padding optional); ValueError if malformed."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"a webhook secret starts with {SECRET_PREFIX!r}")
    encoded = secret[len(SECRET_PREFIX) :]
    unpadded = encoded.rstrip("=")
    try:
        if not _BASE64_RE.fullmatch(encoded):
            raise ValueError("characters outside the base64 alphabet")
        key = base64.b64decode(unpadded + "=" * (-len(unpadded) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("a webhook secret's key is not valid base64") from exc
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise ValueError(
            f"a webhook secret's key has {MIN_KEY_BYTES}-{MAX_KEY_BYTES} bytes, not {len(key)}"
        )
    return key


def _digest(key: bytes, msg_id: str, timestamp: int, body: bytes) -> bytes:
    # surrogatepass: a received id with odd characters simply fails to match, never raises.
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode("utf-8", "surrogatepass"), hashlib.sha256)
    mac.update(body)
    return mac.digest()


def _check_msg_id(msg_id: str) -> None:
    if not isinstance(msg_id, str) or not _MSG_ID_RE.fullmatch(msg_id):
        raise ValueError(
            f"a webhook id is 1-{MAX_MSG_ID_LEN} visible ASCII characters, no '.': {msg_id!r}"
        )


@functools.lru_cache(maxsize=4096)
def _cached_key(secret: str) -> bytes:
    """parse_secret, remembered: a sender signs many deliveries with few secrets."""
    return parse_secret(secret)


@functools.lru_cache(maxsize=4096)
def _keyed_mac(secret: str) -> hmac.HMAC:
    """An HMAC-SHA256 keyed with the secret, fed nothing: copied for each signature (a copy
    is never updated in place, so the cached one stays fresh)."""
    return hmac.new(_cached_key(secret), digestmod=hashlib.sha256)


def _refused(secret: object) -> hmac.HMAC:
    """A secret that is not a string: parse_secret's ValueError, as before any caching."""
    raise ValueError(f"a webhook secret starts with {SECRET_PREFIX!r}, not {type(secret)}")


def _keys(secrets: str | Sequence[str]) -> list[bytes]:
    items = [secrets] if isinstance(secrets, str) else list(secrets)
    if not items:
        raise ValueError("at least one webhook secret is needed")
    return [_cached_key(s) if isinstance(s, str) else parse_secret(s) for s in items]


def sign(secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value: one `v1,<base64>` per secret, space-separated, in order.

    Several secrets sign at once during rotation, so receivers holding either one accept.
    """
    _check_msg_id(msg_id)
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise ValueError(f"a webhook timestamp is a non-negative integer: {timestamp!r}")
    items = [secrets] if isinstance(secrets, str) else secrets
    if not items:
        raise ValueError("at least one webhook secret is needed")
    head = f"{msg_id}.{timestamp}.".encode("utf-8", "surrogatepass")
    signatures = []
    for secret in items:
        # A copy of the secret's keyed HMAC (made once per secret): on the dispatcher's hot
        # path, where hmac.new would parse the secret and key a new HMAC for every attempt.
        mac = _keyed_mac(secret).copy() if isinstance(secret, str) else _refused(secret)
        mac.update(head)
        mac.update(body)
        signatures.append(f"{SIGNATURE_VERSION},{base64.b64encode(mac.digest()).decode()}")
    return " ".join(signatures)


def signed_headers(
    secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """The three headers of one delivery attempt (`webhook-id`, `-timestamp`, `-signature`)."""
    return {
        HEADER_ID: msg_id,
        HEADER_TIMESTAMP: str(timestamp),
        HEADER_SIGNATURE: sign(secrets, msg_id, timestamp, body),
    }


def read_headers(headers: Mapping[str, str]) -> WebhookHeaders:
    """The three headers, names case-insensitive; SignatureError if one is missing or empty,
    given twice with different values, or the timestamp is not integer seconds."""
    found: dict[str, str] = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower not in (HEADER_ID, HEADER_TIMESTAMP, HEADER_SIGNATURE):
            continue
        if found.setdefault(lower, value) != value:
            raise SignatureError(MISSING_HEADERS, f"conflicting {lower} headers")
    msg_id = found.get(HEADER_ID, "")
    raw_timestamp = found.get(HEADER_TIMESTAMP, "")
    signature = found.get(HEADER_SIGNATURE, "")
    if not (msg_id and raw_timestamp and signature):
        raise SignatureError(
            MISSING_HEADERS, f"{HEADER_ID}, {HEADER_TIMESTAMP} and {HEADER_SIGNATURE} are required"
        )
    if not _TIMESTAMP_RE.fullmatch(raw_timestamp):
        raise SignatureError(BAD_TIMESTAMP, f"{HEADER_TIMESTAMP} is not integer Unix seconds")
    return WebhookHeaders(msg_id=msg_id, timestamp=int(raw_timestamp), signature=signature)


def _v1_signatures(header: str) -> list[bytes]:
    """Decoded `v1` entries; entries of other versions and malformed ones are ignored."""
    found: list[bytes] = []
    for entry in header.split(" "):
        version, sep, encoded = entry.partition(",")
        if not sep or version != SIGNATURE_VERSION:
            continue
        try:
            found.append(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            continue
    return found


def verify(
    secret_or_secrets: str | Sequence[str],
    headers: Mapping[str, str],
    body: bytes,
    now: float | None = None,
    tolerance_s: int = DEFAULT_TOLERANCE_S,
) -> None:
    """Return if any `v1` signature matches any secret over the raw `body`; else SignatureError.

    The timestamp must be within `tolerance_s` of `now` (default: the clock) either way.
    ValueError (not SignatureError) means our own configuration is wrong: a malformed secret.
    """
    if tolerance_s < 0:
        raise ValueError("tolerance_s is not negative")
    keys = _keys(secret_or_secrets)
    read = read_headers(headers)
    current = time.time() if now is None else now
    if abs(current - read.timestamp) > tolerance_s:
        raise SignatureError(
            TIMESTAMP_OUT_OF_TOLERANCE,
            f"{HEADER_TIMESTAMP} is more than {tolerance_s}s from the receiver's clock",
        )
    candidates = _v1_signatures(read.signature)
    matched = False
    for key in keys:
        expected = _digest(key, read.msg_id, read.timestamp, body)
        for candidate in candidates:
            # Every pair is compared (no early exit) so timing does not depend on which matched.
            matched |= hmac.compare_digest(expected, candidate)
    if not matched:
        raise SignatureError(NO_MATCHING_SIGNATURE, "no v1 signature matches a known secret")
