"""Input by URL (`image_url`): fetch the image through the SSRF guard, bounded in size and
time, before it takes the same validation path as an upload.

Every hop is checked twice, as webhook deliveries are (shared/webhooks/ssrf.py): the URL when
it is read (http or https, a host that is not an IP literal or local-only name of a private
network), and every address at connect time (the guarded resolver and socket factory; a DNS
answer that points inside is refused too). Redirects are followed by hand, at most
MAX_REDIRECTS, each target checked the same way. Every failure is an `ApiError` with its own
code:

- 400 `invalid_request`: not an http(s) URL, or malformed;
- 422 `image_url_forbidden`: the host is (or resolves to) a loopback, private, link-local or
  otherwise non-public address (SPLATQ_IMAGE_URL_ALLOW_PRIVATE=1 admits them: development);
  what a name resolved to, and why that address is refused, go to the log, never into the
  answer (it would be a DNS oracle for internal names);
- 422 `image_url_unreachable`: DNS, connect or TLS failure, a timeout
  (SPLATQ_IMAGE_URL_TIMEOUT_S for the whole fetch), a non-2xx answer, too many redirects
  (named by kind, never by the addresses involved);
- 422 `image_url_too_large`: more than SPLATQ_MAX_UPLOAD_BYTES, declared or streamed;
- 429 `too_many_fetches` (with Retry-After): the API key already has
  SPLATQ_IMAGE_URL_FETCHES_PER_TENANT fetches in flight in this gateway process. Across
  tenants, the session's connection pool (FETCH_CONNECTIONS) bounds the process; a fetch
  waiting for a connection spends its own time limit.
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urljoin

import aiohttp
import structlog
from aiohttp import web
from aiohttp.abc import AbstractResolver

from splatq.services.gateway.problems import ApiError, invalid_request
from splatq.shared.settings import Settings
from splatq.shared.webhooks.ssrf import BlockedAddress, UrlRejected, check_url, guarded_connector

log = structlog.get_logger("splatq.gateway")

MAX_REDIRECTS = 3
FETCH_CONNECTIONS = 64
FETCH_RETRY_AFTER_S = 1
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 64 * 1024
# No compression: a compressed body could expand past the size cap after it was checked.
_HEADERS = {"Accept": "image/*", "Accept-Encoding": "identity"}


@dataclass(frozen=True, slots=True)
class FetchLimits:
    max_bytes: int
    timeout_s: float
    allow_private: bool
    per_tenant: int = 4


def forbidden(detail: str) -> ApiError:
    return ApiError(422, "image_url_forbidden", f"image_url refused by the SSRF guard: {detail}")


def unreachable(detail: str) -> ApiError:
    return ApiError(422, "image_url_unreachable", f"image_url could not be fetched: {detail}")


def too_large(max_bytes: int) -> ApiError:
    return ApiError(422, "image_url_too_large", f"the image at image_url exceeds {max_bytes} bytes")


def check_image_url(url: object, allow_private: bool) -> str:
    """The URL checks before any connection: 400 when it is no usable URL, 422
    `image_url_forbidden` when it names a non-public host."""
    if not isinstance(url, str) or not url:
        raise invalid_request("image_url must be a non-empty string")
    try:
        check_url(url, allow_private=True, require_https=False)
    except UrlRejected as exc:
        raise invalid_request(f"image_url rejected: {exc.message}") from None
    if not allow_private:
        try:
            check_url(url, allow_private=False, require_https=False)
        except UrlRejected as exc:
            raise forbidden(exc.message) from None
    return url


class ImageFetcher:
    """One HTTP client session per gateway process, guarded at connect time."""

    def __init__(self, session: aiohttp.ClientSession, limits: FetchLimits) -> None:
        self._session = session
        self.limits = limits
        self._in_flight: Counter[str] = Counter()

    async def fetch(self, tenant: str, url: str) -> bytes:
        if self._in_flight[tenant] >= self.limits.per_tenant:
            raise ApiError(
                429,
                "too_many_fetches",
                f"this API key already has {self.limits.per_tenant} image_url fetches in"
                " flight; retry when one has finished",
                {"Retry-After": str(FETCH_RETRY_AFTER_S)},
            )
        self._in_flight[tenant] += 1
        try:
            async with asyncio.timeout(self.limits.timeout_s):
                return await self._follow(url)
        except TimeoutError:
            raise unreachable(f"no complete answer within {self.limits.timeout_s:g} s") from None
        finally:
            self._in_flight[tenant] -= 1
            if self._in_flight[tenant] <= 0:
                del self._in_flight[tenant]

    async def _follow(self, url: str) -> bytes:
        for hop in range(MAX_REDIRECTS + 1):
            try:
                check_image_url(url, self.limits.allow_private)
            except ApiError as exc:
                if hop and exc.status == 400:  # the server's redirect, not the client's URL
                    raise unreachable(f"redirected to an unusable URL: {exc.detail}") from None
                raise
            try:
                async with self._session.get(url, allow_redirects=False, headers=_HEADERS) as resp:
                    if resp.status in _REDIRECTS and "Location" in resp.headers:
                        url = urljoin(url, resp.headers["Location"])
                        continue
                    if not 200 <= resp.status < 300:
                        raise unreachable(f"the server answered {resp.status}")
                    return await self._read(resp)
            except aiohttp.ClientConnectorError as exc:
                blocked = exc.os_error
                if isinstance(blocked, BlockedAddress):
                    log.warning("image_url.blocked", host=blocked.host, address=blocked.address,
                                reason=blocked.reason)  # fmt: skip
                    raise forbidden(
                        "its host is, or resolves to, an address that is not publicly routable"
                    ) from None
                raise unreachable(_connect_failure(exc)) from None
            except aiohttp.ClientError as exc:
                # The class only: some messages name the address connected to.
                raise unreachable(type(exc).__name__) from None
        raise unreachable(f"more than {MAX_REDIRECTS} redirects")

    async def _read(self, resp: aiohttp.ClientResponse) -> bytes:
        limit = self.limits.max_bytes
        if resp.content_length is not None and resp.content_length > limit:
            raise too_large(limit)
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.content.iter_chunked(_CHUNK):
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            chunks.append(chunk)
        return b"".join(chunks)


def _connect_failure(exc: aiohttp.ClientConnectorError) -> str:
    """What went wrong connecting, by kind: aiohttp's own messages name the address."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return "the server's TLS certificate is not valid for its host"
    if isinstance(exc, aiohttp.ClientSSLError):
        return "the TLS handshake failed"
    if isinstance(exc.os_error, socket.gaierror):
        return "its host name does not resolve"
    if isinstance(exc.os_error, ConnectionRefusedError):
        return "the connection was refused"
    return "cannot connect to its host"


IMAGE_FETCHER = web.AppKey("image_fetcher", ImageFetcher)
# The DNS resolver under the SSRF guard, when the app was given one before it started (tests:
# a fixed answer for a name); else aiohttp's default resolver.
IMAGE_URL_RESOLVER = web.AppKey("image_url_resolver", AbstractResolver)


def install(app: web.Application, settings: Settings) -> None:
    """Open the fetcher's session with the app and close it with the app."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        connector = guarded_connector(
            settings.image_url_allow_private,
            inner_resolver=app.get(IMAGE_URL_RESOLVER),
            limit=FETCH_CONNECTIONS,
            limit_per_host=8,
        )
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=settings.image_url_timeout_s),
            auto_decompress=False,  # a compressed body could expand past the size cap
            trust_env=False,  # no proxy: the guard must see the real target
        )
        app[IMAGE_FETCHER] = ImageFetcher(
            session,
            FetchLimits(
                settings.max_upload_bytes,
                settings.image_url_timeout_s,
                settings.image_url_allow_private,
                settings.image_url_fetches_per_tenant,
            ),
        )
        yield
        await session.close()

    app.cleanup_ctx.append(ctx)
