"""Parsing a job submission: multipart or JSON/base64 body, and the params schema.

Pure translation of request bytes into a typed `Submission`; every problem becomes an
`ApiError` naming the field. Image *content* checks live in `images`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from typing import Any, get_args

import orjson
from aiohttp import web

from splatq.services.gateway.multipart import MultipartError, boundary_of, parse_form
from splatq.services.gateway.problems import ApiError, invalid_request
from splatq.services.gateway.shapes import Quality
from splatq.shared.engine.events import EventType
from splatq.shared.webhooks.ssrf import UrlRejected, check_url

PARAMS = frozenset({"quality", "webhook_url", "webhook_events", "metadata", "cache", "progressive"})
FORM_PARTS = frozenset({"image", "image_url", "params"})
QUALITIES: tuple[str, ...] = get_args(Quality)  # the shapes' Quality (services/gateway/shapes.py)
MAX_METADATA_BYTES = 4096
MAX_URL_LENGTH = 2048
MAX_IDEMPOTENCY_KEY = 255
MAX_PREFER_LENGTH = 64
_IDEMPOTENCY_KEY_RE = re.compile(r"[\x21-\x7e]{1,255}")  # visible ASCII, no spaces
_DATA_URL = r"data:([A-Za-z0-9_.+-]+/[A-Za-z0-9_.+-]+)?(;[A-Za-z0-9_-]+=[A-Za-z0-9_.-]+)*;base64,"
_BASE64 = r"([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"
# The JSON `image`: padded standard base64, optionally behind a data: URL. The OpenAPI
# document declares this very pattern; the parser checks it before decoding.
BASE64_IMAGE_PATTERN = f"^({_DATA_URL})?{_BASE64}$"
_BASE64_IMAGE_RE = re.compile(BASE64_IMAGE_PATTERN)
_DATA_URL_RE = re.compile(_DATA_URL)


@dataclass(frozen=True, slots=True)
class Params:
    quality: str = "full"
    webhook_url: str = ""
    webhook_events: tuple[str, ...] = ()
    metadata: dict[str, Any] | None = None
    cache: bool = True
    # A full job's quick preview-resolution result first (`preview_ready`); always False on
    # a preview job (accepted there and ignored: a preview job is the quick result).
    progressive: bool = False

    def canonical(self) -> dict[str, Any]:
        """The params as stored with the job (the job hash's `params`) and fingerprinted.
        `progressive` appears only when on, so a request without it fingerprints as it did
        before the param existed (an Idempotency-Key retry across an upgrade still matches)."""
        out: dict[str, Any] = {
            "quality": self.quality,
            "webhook_url": self.webhook_url,
            "webhook_events": sorted(self.webhook_events),
            "metadata": self.metadata or {},
            "cache": self.cache,
        }
        if self.progressive:
            out["progressive"] = True
        return out


@dataclass(frozen=True, slots=True)
class Submission:
    """The image bytes, or (input by URL) the `image_url` to fetch them from."""

    image: bytes
    params: Params
    image_url: str = ""

    def request_fingerprint(self, image_sha256: str) -> str:
        """Digest of everything the client asked for (Idempotency-Key reuse detection)."""
        payload = orjson.dumps(
            {"image": image_sha256, "params": self.params.canonical()},
            option=orjson.OPT_SORT_KEYS,
        )
        return hashlib.sha256(payload).hexdigest()


def parse_params(raw: Any, allow_private_webhooks: bool = False) -> Params:
    """Validate the params object; 400 `invalid_request` naming the offending field."""
    if not isinstance(raw, dict):
        raise invalid_request("params must be a JSON object")
    unknown = sorted(set(raw) - PARAMS)
    if unknown:
        raise invalid_request(f"unknown param {unknown[0]!r} (allowed: {sorted(PARAMS)})")
    quality = raw.get("quality", "full")
    if quality not in QUALITIES:
        raise invalid_request(f"quality must be one of {list(QUALITIES)}, got {quality!r}")
    webhook_url = _webhook_url(raw.get("webhook_url"), allow_private_webhooks)
    events = raw.get("webhook_events", [])
    names = {e.value for e in EventType}
    if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
        raise invalid_request("webhook_events must be a list of event names")
    bad = [e for e in events if e not in names]
    if bad:
        raise invalid_request(f"webhook_events has unknown event {bad[0]!r}")
    metadata = raw.get("metadata", {})
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise invalid_request("metadata must be a JSON object")
    if len(orjson.dumps(metadata)) > MAX_METADATA_BYTES:
        raise invalid_request(f"metadata must be at most {MAX_METADATA_BYTES} bytes as JSON")
    cache = raw.get("cache", True)
    if not isinstance(cache, bool):
        raise invalid_request("cache must be true or false")
    progressive = raw.get("progressive", False)
    if not isinstance(progressive, bool):
        raise invalid_request("progressive must be true or false")
    return Params(
        quality,
        webhook_url,
        tuple(dict.fromkeys(events)),
        metadata,
        cache,
        progressive=progressive and quality == "full",
    )


def _webhook_url(raw: Any, allow_private: bool) -> str:
    """The params' webhook_url: null, "" or absent is none; a string is checked."""
    if raw is None or raw == "":
        return ""
    if not isinstance(raw, str):
        raise invalid_request("webhook_url must be a string (or null)")
    return check_webhook_url(raw, allow_private)


def check_webhook_url(url: Any, allow_private: bool, field: str = "webhook_url") -> str:
    """The SSRF guard's registration-time check (https only, public hosts only, unless
    SPLATQ_WEBHOOK_ALLOW_PRIVATE); the dispatcher checks every address again at connect."""
    if not isinstance(url, str):
        raise invalid_request(f"{field} must be a string")
    try:
        check_url(url, allow_private=allow_private, require_https=not allow_private)
    except UrlRejected as exc:
        raise invalid_request(f"{field} rejected ({exc.code}): {exc.message}") from None
    return url


def idempotency_key(request: web.Request) -> str:
    """The Idempotency-Key header, "" when absent; present but empty (or not visible ASCII)
    is a 400, as the OpenAPI document declares (minLength 1)."""
    if "Idempotency-Key" not in request.headers:
        return ""
    key = request.headers["Idempotency-Key"]
    if not _IDEMPOTENCY_KEY_RE.fullmatch(key):
        raise invalid_request(
            f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY} visible ASCII characters"
        )
    return key


def prefer_headers(request: web.Request) -> list[str]:
    """The Prefer header values; one longer than MAX_PREFER_LENGTH is a 400 (the document's
    maxLength), not a preference silently ignored."""
    values = request.headers.getall("Prefer", [])
    if any(len(v) > MAX_PREFER_LENGTH for v in values):
        raise invalid_request(f"Prefer must be at most {MAX_PREFER_LENGTH} characters")
    return values


async def read_submission(
    request: web.Request,
    max_bytes: int,
    allow_private_webhooks: bool = False,
    *,
    body_timeout_s: float,
) -> Submission:
    """Read a multipart or JSON submission, never more than `max_bytes` of body, all of it
    within `body_timeout_s` (else 408)."""
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise _too_large(max_bytes)
    ctype = request.content_type
    if ctype == "multipart/form-data":
        return await _read_multipart(request, max_bytes, allow_private_webhooks, body_timeout_s)
    if ctype == "application/json":
        body = await read_capped(request, max_bytes, body_timeout_s)
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise invalid_request(f"body is not valid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise invalid_request("body must be a JSON object")
        if "image" in doc and "image_url" in doc:
            raise invalid_request("send either image or image_url, not both")
        image = doc.pop("image", None)
        if "image_url" in doc:
            image_url = doc.pop("image_url")
            if not isinstance(image_url, str) or not image_url:
                raise invalid_request("image_url must be a non-empty string")
            return Submission(b"", parse_params(doc, allow_private_webhooks), image_url)
        if not isinstance(image, str) or not image:
            raise invalid_request("image must be base64 or a data: URL (or send image_url)")
        return Submission(_decode_base64_image(image), parse_params(doc, allow_private_webhooks))
    raise ApiError(
        415, "unsupported_media_type",
        f"Content-Type must be multipart/form-data or application/json, got {ctype!r}",
    )  # fmt: skip


async def read_capped(request: web.Request, max_bytes: int, timeout_s: float) -> bytes:
    """The whole body: 413 past `max_bytes`, 408 `request_timeout` unless all of it arrived
    within `timeout_s` (a slow upload holds a connection and a handler: SPLATQ_BODY_TIMEOUT_S).
    The 408 closes the connection (`app.observe`)."""
    content = request.content
    if content.is_eof():
        # The whole body is already here (a small upload arrives with its headers): no wait,
        # so no deadline to arm.
        body = content.read_nowait(-1)
        if len(body) > max_bytes:
            raise _too_large(max_bytes)
        return body
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in content.iter_chunked(64 * 1024):
                size += len(chunk)
                if size > max_bytes:
                    raise _too_large(max_bytes)
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(
            408,
            "request_timeout",
            f"the request body did not arrive within {timeout_s:g} s ({size} bytes came)",
        ) from None
    return b"".join(chunks)


async def _read_multipart(
    request: web.Request, max_bytes: int, allow_private_webhooks: bool, body_timeout_s: float
) -> Submission:
    try:
        boundary = boundary_of(request.headers.get("Content-Type", ""))
    except MultipartError as exc:
        raise invalid_request(f"malformed multipart body: {exc}") from None
    body = await read_capped(request, max_bytes, body_timeout_s)
    try:
        parts = parse_form(body, boundary)
    except MultipartError as exc:
        raise invalid_request(f"malformed multipart body: {exc}") from None
    named: dict[str, bytes] = {}
    for part in parts:
        if part.name not in FORM_PARTS:
            raise invalid_request(
                f"unknown multipart part {part.name!r} (expected image or image_url, params)"
            )
        if part.name in named:
            raise invalid_request(f"more than one {part.name} part")
        named[part.name] = part.data
    params = _form_params(named.get("params"), allow_private_webhooks)
    image, url = named.get("image"), named.get("image_url")
    if image is not None and url is not None:
        raise invalid_request("send either an image part or an image_url part, not both")
    if url is not None:
        return Submission(b"", params, _form_text(url, "image_url"))
    if image is None:
        raise invalid_request("missing multipart part 'image' (or 'image_url')")
    return Submission(image, params)


def _form_params(data: bytes | None, allow_private_webhooks: bool) -> Params:
    if data is None:
        return Params()
    try:
        raw = orjson.loads(data) if data else {}
    except orjson.JSONDecodeError as exc:
        raise invalid_request(f"params part is not valid JSON: {exc}") from None
    return parse_params(raw, allow_private_webhooks)


def _form_text(data: bytes, name: str) -> str:
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise invalid_request(f"{name} is not UTF-8 text") from None
    if not text:
        raise invalid_request(f"{name} must be a non-empty string")
    return text


def _decode_base64_image(value: str) -> bytes:
    if not _BASE64_IMAGE_RE.fullmatch(value):
        raise invalid_request("image is not valid base64 (padded, standard alphabet)")
    match = _DATA_URL_RE.match(value)
    payload = value[match.end() :] if match else value
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise invalid_request("image is not valid base64") from None


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(413, "payload_too_large", f"the request body exceeds {max_bytes} bytes")
