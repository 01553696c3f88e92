"""Input by URL over real loopback HTTP: the gateway fetches `image_url` from a real local HTTP
server through the SSRF guard (loopback admitted only because the test setting says so, as the
webhook tests do), with size and time limits, then validates it like an upload; every failure
has its own 4xx code and leaves nothing behind."""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import FormData, web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from splatq.services.gateway.app import create_app
from splatq.services.gateway.image_fetch import IMAGE_URL_RESOLVER
from splatq.shared.settings import Settings
from splatq.shared.storage.store import LocalFileStorage, input_key
from splatq.shared.testing import eventually
from tests.gateway import corpus
from tests.gateway.conftest import AUTH_A, AUTH_B, KEY_A, ClientFactory, GatewayTestServer
from tests.gateway.test_api import nothing_left_behind, problem
from tests.shared.test_ssrf import FakeResolver

Client = TestClient[Any, Any]
PNG = corpus.valid_png(40, 30)
LIMIT = 64 * 1024


class Origin:
    """A real HTTP server on loopback serving the test's images and failures."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.slow_waiting = 0
        self.server: TestServer | None = None

    def url(self, path: str) -> str:
        assert self.server is not None
        return str(self.server.make_url(path))

    def app(self) -> web.Application:
        async def image(_: web.Request) -> web.Response:
            return web.Response(body=PNG, content_type="image/png")

        async def text(_: web.Request) -> web.Response:
            return web.Response(text="<html>not an image</html>", content_type="text/html")

        async def big(_: web.Request) -> web.Response:
            return web.Response(body=b"\x89PNG" + b"\0" * LIMIT, content_type="image/png")

        async def big_chunked(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for _ in range(LIMIT // 4096 + 2):
                await resp.write(b"\0" * 4096)
            await resp.write_eof()
            return resp

        async def slow(_: web.Request) -> web.Response:
            self.slow_waiting += 1
            await self.release.wait()
            return web.Response(body=b"late")

        async def redirect(request: web.Request) -> web.Response:
            raise web.HTTPFound(request.query.get("to", "/image.png"))

        async def loop(_: web.Request) -> web.Response:
            raise web.HTTPFound("/loop")

        app = web.Application()
        app.router.add_get("/image.png", image)
        app.router.add_get("/page.html", text)
        app.router.add_get("/big.png", big)
        app.router.add_get("/chunked.png", big_chunked)
        app.router.add_get("/slow.png", slow)
        app.router.add_get("/redirect", redirect)
        app.router.add_get("/loop", loop)
        return app


@pytest.fixture
async def origin() -> AsyncIterator[Origin]:
    o = Origin()
    o.server = TestServer(o.app(), host="127.0.0.1")
    await o.server.start_server()
    yield o
    o.release.set()
    await o.server.close()


@pytest.fixture
async def client(make_client: ClientFactory) -> Client:
    return await make_client(
        image_url_allow_private=True, max_upload_bytes=LIMIT, image_url_timeout_s=1.0
    )


def _form(url: str) -> FormData:
    data = FormData(default_to_multipart=True)  # as `curl -F image_url=...` sends it
    data.add_field("image_url", url)
    data.add_field("params", orjson.dumps({"quality": "preview"}).decode())
    return data


async def test_a_json_image_url_is_fetched_stored_and_queued(
    client: Client, origin: Origin, storage: LocalFileStorage
) -> None:
    resp = await client.post(
        "/v1/jobs", json={"image_url": origin.url("/image.png"), "quality": "preview"},
        headers=AUTH_A,
    )  # fmt: skip
    assert resp.status == 202, await resp.text()
    digest = hashlib.sha256(PNG).hexdigest()
    assert await storage.get_bytes(input_key(digest, "png")) == PNG


async def test_a_form_field_image_url_and_redirects_are_followed(
    client: Client, origin: Origin
) -> None:
    resp = await client.post("/v1/jobs", data=_form(origin.url("/redirect")), headers=AUTH_A)
    assert resp.status == 202, await resp.text()


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/missing.png", 422, "image_url_unreachable"),
        ("/loop", 422, "image_url_unreachable"),
        ("/slow.png", 422, "image_url_unreachable"),  # the time limit
        ("/big.png", 422, "image_url_too_large"),  # declared length
        ("/chunked.png", 422, "image_url_too_large"),  # streamed past the limit
        ("/page.html", 422, "invalid_image"),  # not an image: the upload path's verdict
    ],
)
async def test_fetch_failures_get_their_codes_and_leave_nothing(
    client: Client,
    origin: Origin,
    redis: Redis,
    storage: LocalFileStorage,
    path: str,
    status: int,
    code: str,
) -> None:
    resp = await client.post("/v1/jobs", data=_form(origin.url(path)), headers=AUTH_A)
    await problem(resp, status, code)
    await nothing_left_behind(redis, storage)


async def test_a_tenant_past_its_fetches_gets_429_and_others_still_fetch(
    make_client: ClientFactory, origin: Origin
) -> None:
    client = await make_client(
        image_url_allow_private=True, image_url_fetches_per_tenant=1, image_url_timeout_s=30.0
    )
    slow = asyncio.create_task(
        client.post("/v1/jobs", json={"image_url": origin.url("/slow.png")}, headers=AUTH_A)
    )

    async def holding() -> bool:  # the slow fetch has reached the origin
        return origin.slow_waiting > 0

    await eventually(holding)
    resp = await client.post(
        "/v1/jobs", json={"image_url": origin.url("/image.png")}, headers=AUTH_A
    )
    await problem(resp, 429, "too_many_fetches")
    assert resp.headers["Retry-After"] == "1"
    other = await client.post(
        "/v1/jobs", json={"image_url": origin.url("/image.png")}, headers=AUTH_B
    )
    assert other.status == 202, await other.text()
    origin.release.set()
    assert (await slow).status == 422  # the late answer is no image
    resp = await client.post(
        "/v1/jobs", json={"image_url": origin.url("/image.png")}, headers=AUTH_A
    )
    assert resp.status in {200, 202}  # the slot was given back


async def test_a_closed_port_is_unreachable(client: Client) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connect is refused
        resp = await client.post(
            "/v1/jobs", json={"image_url": f"http://127.0.0.1:{port}/x.png"}, headers=AUTH_A
        )
    await problem(resp, 422, "image_url_unreachable")


async def test_private_addresses_are_refused_by_default(
    make_client: ClientFactory, origin: Origin
) -> None:
    client = await make_client()  # the production default: no private addresses
    for url, status, code in (
        (origin.url("/image.png"), 422, "image_url_forbidden"),  # 127.0.0.1
        (origin.url("/redirect"), 422, "image_url_forbidden"),
        ("http://localhost/image.png", 422, "image_url_forbidden"),
        ("http://169.254.169.254/latest/meta-data/", 422, "image_url_forbidden"),
        ("http://10.0.0.1/x.png", 422, "image_url_forbidden"),
        ("http://[::1]/x.png", 422, "image_url_forbidden"),
        ("http://[::ffff:127.0.0.1]/x.png", 422, "image_url_forbidden"),
        # 127.0.0.1 spelled as one number: refused as a malformed URL before anything else
        ("http://2130706433/x.png", 400, "invalid_request"),
    ):
        resp = await client.post("/v1/jobs", json={"image_url": url}, headers=AUTH_A)
        await problem(resp, status, code)


async def test_every_redirect_target_is_checked_again(client: Client, origin: Origin) -> None:
    """A hop the URL checks refuse ends the fetch: the server's fault, so 422, not 400."""
    target = origin.url("/redirect?to=ftp://example.com/x.png")
    resp = await client.post("/v1/jobs", json={"image_url": target}, headers=AUTH_A)
    await problem(resp, 422, "image_url_unreachable")


@pytest.mark.parametrize(
    "body",
    [
        {"image_url": "ftp://example.com/x.png"},
        {"image_url": "not a url"},
        {"image_url": ""},
        {"image_url": 7},
        {"image_url": "https://example.com/x.png", "image": "aGVsbG8="},
    ],
)
async def test_unusable_image_urls_get_400(client: Client, body: dict[str, Any]) -> None:
    await problem(await client.post("/v1/jobs", json=body, headers=AUTH_A), 400, "invalid_request")


async def test_an_image_part_and_an_image_url_part_together_get_400(client: Client) -> None:
    data = _form("https://example.com/x.png")
    data.add_field("image", PNG, filename="a.png", content_type="image/png")
    await problem(await client.post("/v1/jobs", data=data, headers=AUTH_A), 400, "invalid_request")


async def test_a_refusal_names_no_address_an_internal_name_resolves_to(
    settings: Settings, storage: LocalFileStorage, origin: Origin
) -> None:
    """`image_url` naming hosts that resolve inside (a DNS answer the test fixes: loopback,
    where a real server listens, and a private address) is refused 422 image_url_forbidden,
    and the answer names neither the addresses nor their kind: echoed, they would make the
    guard a DNS oracle for internal names. Nothing is fetched."""
    fake = FakeResolver({"db.internal.example.com": [["127.0.0.1"]],
                         "cache.corp.example.com": [["10.1.2.3"]]})  # fmt: skip
    app = create_app(
        settings.with_overrides(api_keys={KEY_A: "acme"}, max_upload_bytes=LIMIT),
        storage=storage,
        registry=CollectorRegistry(),
    )
    app[IMAGE_URL_RESOLVER] = fake
    assert origin.server is not None
    async with TestClient(GatewayTestServer(app)) as client:
        for host, address in (
            (f"db.internal.example.com:{origin.server.port}", "127.0.0.1"),
            ("cache.corp.example.com", "10.1.2.3"),
        ):
            resp = await client.post(
                "/v1/jobs", json={"image_url": f"http://{host}/image.png"}, headers=AUTH_A
            )
            body = await problem(resp, 422, "image_url_forbidden")
            for leak in (address, "loopback", "private"):
                assert leak not in body["detail"], body["detail"]
    assert fake.calls == ["db.internal.example.com", "cache.corp.example.com"]
