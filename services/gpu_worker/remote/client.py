"""HTTP to the vendor: create a prediction, read it, cancel it, fetch its output. Each call
answers an `Answer` or a `Verdict` (shared/vendor/policy.py: what the failure means, with a
stable code and the vendor's message sanitised); nothing here decides what to do about it.

The API token (shared/vendor/credentials.py) is only ever put in the auth header: never in a
log, a job record or an exception message (every vendor message is sanitised with it).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
import orjson

from splatq.shared.vendor.config import VendorConfig, VendorConfigError
from splatq.shared.vendor.credentials import Credential
from splatq.shared.vendor.policy import (
    UPSTREAM_OUTPUT_TOO_LARGE,
    Kind,
    Verdict,
    classify_status,
    parse_retry_after,
    sanitize,
    transport_verdict,
)
from splatq.shared.vendor.shape import (
    IMAGE_TYPES,
    create_body,
    error_message,
    form_fields,
)

# The most of a JSON answer (create, get, cancel) read; a prediction object is a few KB.
MAX_ANSWER_BYTES = 4 * 1024 * 1024
USER_AGENT = "splatq-remote-backend"


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    latency_ms: int
    request_id: str
    content_type: str

    def json(self) -> object:
        return orjson.loads(self.body)


class VendorClient:
    def __init__(self, config: VendorConfig, credential: Credential) -> None:
        self.config = config
        self.credential = credential
        self._session: aiohttp.ClientSession | None = None
        self._host = urlsplit(config.base_url).netloc

    async def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers={"User-Agent": USER_AGENT},
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=60),
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _url(self, path: str, prediction_id: str = "") -> str:
        return self.config.base_url + path.replace("{id}", prediction_id)

    def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        name, value = self.credential.header()
        return {**self.config.request.headers, name: value, **(extra or {})}

    async def create(
        self, image: bytes, image_ref: str, idempotency_key: str, webhook_url: str
    ) -> Answer | Verdict:
        """POST the create request: JSON with `image_ref` (a URL or a data URI), or multipart
        with the image bytes as a file part."""
        req = self.config.request
        extra = {req.idempotency_header: idempotency_key} if req.idempotency_header else {}
        if req.shape == "json":
            body = orjson.dumps(create_body(self.config, image_ref, webhook_url))
            headers = self._headers({**extra, "Content-Type": "application/json"})
            return await self._call("POST", self._url(req.path), headers, body)
        form = aiohttp.FormData()
        for name, value in form_fields(self.config, webhook_url):
            form.add_field(name, value)
        form.add_field(
            req.image_field,
            image,
            filename=f"input.{req.image_format}",
            content_type=IMAGE_TYPES[req.image_format],
        )
        return await self._call("POST", self._url(req.path), self._headers(extra), form)

    async def get(self, prediction_id: str) -> Answer | Verdict:
        return await self._call(
            "GET", self._url(self.config.response.get_path, prediction_id), self._headers()
        )

    async def cancel(self, prediction_id: str) -> Answer | Verdict | None:
        """Forward a cancel (None: the vendor has no cancel endpoint)."""
        path = self.config.response.cancel_path
        if not path:
            return None
        return await self._call("POST", self._url(path, prediction_id), self._headers())

    async def fetch(self, url: str) -> bytes | Verdict:
        """The output file, bounded by `output.max_bytes` and `output.timeout_s`."""
        out = self.config.output
        if urlsplit(url).scheme not in ("https", "http"):
            return Verdict(Kind.PERMANENT, "UPSTREAM_BAD_RESPONSE", "the output URL is not http(s)")
        headers = self._headers() if out.send_auth and urlsplit(url).netloc == self._host else {}
        answer = await self._call("GET", url, headers, None, out.timeout_s, out.max_bytes)
        return answer.body if isinstance(answer, Answer) else answer

    async def _call(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        data: bytes | aiohttp.FormData | None = None,
        timeout_s: float | None = None,
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> Answer | Verdict:
        if self._session is None:
            await self.start()
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.config.request.timeout_s)
        started = time.monotonic()
        try:
            async with self._session.request(
                method, url, headers=headers, data=data, timeout=timeout
            ) as resp:
                body = await _read_bounded(resp, max_bytes)
                if body is None:
                    return Verdict(
                        Kind.PERMANENT,
                        UPSTREAM_OUTPUT_TOO_LARGE,
                        f"the vendor's answer is larger than {max_bytes} bytes",
                    )
                latency = round((time.monotonic() - started) * 1000)
                rid_header = self.config.response.request_id_header
                request_id = resp.headers.get(rid_header, "") if rid_header else ""
                if resp.status >= 300:
                    retry_after = parse_retry_after(resp.headers.get("Retry-After"), time.time())
                    message = self._clean(error_message(self.config.response, body))
                    return classify_status(resp.status, retry_after, message)
                return Answer(
                    resp.status, body, latency, self._clean(request_id)[:128], resp.content_type
                )
        except TimeoutError:
            return transport_verdict("timeout", f"{method} {_where(url)}: no answer in time")
        except (aiohttp.ClientError, OSError) as exc:
            detail = self._clean(f"{method} {_where(url)}: {type(exc).__name__}: {exc}")
            return transport_verdict("connection", detail)

    def _clean(self, text: str) -> str:
        try:
            secret = self.credential.value()
        except VendorConfigError:
            secret = ""
        return sanitize(text, [secret])


def _where(url: str) -> str:
    """A URL for a message: scheme, host and path (a presigned query holds a signature)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


async def _read_bounded(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes | None:
    """The body, or None past `max_bytes` (read no further: a hostile answer costs nothing)."""
    declared = resp.content_length
    if declared is not None and declared > max_bytes:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(256 * 1024):
        size += len(chunk)
        if size > max_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
