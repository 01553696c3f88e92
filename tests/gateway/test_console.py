"""The console's files over HTTP: `/` leads to `/console`; every file is served from the package
under a strict Content-Security-Policy (no inline script or style, this origin only); nothing
else is served; no file carries a key, an inline handler or an HTML parser sink."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from splatq.services.gateway.console import content_security_policy, load_assets
from splatq.services.stack import dev_api_key, up_banner
from splatq.shared.settings import Settings
from tests.gateway.conftest import KEY_A, ClientFactory
from tests.gateway.test_api import problem

Client = TestClient[Any, Any]
ADMIN_KEY = "admin-console-key-0123456789-abcdefghijk"


async def test_root_leads_to_the_console(client: Client) -> None:
    resp = await client.get("/", allow_redirects=False)
    assert resp.status == 302
    assert resp.headers["Location"] == "/console"
    page = await client.get("/")  # followed
    assert str(page.url).endswith("/console")
    assert page.content_type == "text/html"


async def test_every_file_is_served_under_a_strict_policy(make_client: ClientFactory) -> None:
    client = await make_client(admin_api_key=ADMIN_KEY)
    files = load_assets()
    assert {"index.html", "console.css", "js/app.js", "viewer/splat-viewer.js"} <= set(files)
    for name, (body, content_type) in files.items():
        resp = await client.get(f"/console/{name}")
        assert resp.status == 200, name
        assert resp.content_type == content_type
        assert await resp.read() == body
        policy = resp.headers["Content-Security-Policy"]
        assert "script-src 'self';" in policy
        assert "style-src 'self';" in policy
        assert "unsafe-inline" not in policy
        assert "unsafe-eval" not in policy
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        text = body.decode()
        # no key of any kind is in what the server sends
        assert ADMIN_KEY not in text
        assert KEY_A not in text
        if name.endswith(".html"):
            assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text), name  # no inline script
            assert "<style" not in text
            assert " style=" not in text
            assert not re.search(r"\son[a-z]+=", text), name  # no inline handlers
        if name.endswith(".js"):
            for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
                assert sink not in text, (name, sink)
    page = await client.get("/console")
    assert await page.read() == files["index.html"][0]


async def test_nothing_else_is_served(client: Client) -> None:
    for path in ("/console/nope.js", "/console/../app.py", "/console/js/../../console.py",
                 "/console/%2e%2e/console.py", "/console/app.py", "/console/js/"):  # fmt: skip
        resp = await client.get(path)
        assert resp.status == 404, path
        if resp.content_type == "application/problem+json":
            await problem(resp, 404, "not_found")


def test_an_object_store_s3_origin_is_the_only_other_connect_source(settings: Settings) -> None:
    local = content_security_policy(settings)
    assert "connect-src 'self';" in local
    s3 = settings.with_overrides(
        storage_url="s3://bucket/x", s3_endpoint_url="https://s3.example:9000/"
    )
    assert "connect-src 'self' https://s3.example:9000;" in content_security_policy(s3)
    aws = settings.with_overrides(storage_url="s3://bucket/x")
    assert "connect-src 'self' https://*.amazonaws.com;" in content_security_policy(aws)


def test_the_up_banner_leads_to_the_console(settings: Settings, tmp_path: Path) -> None:
    local = settings.with_overrides(data_dir=tmp_path, public_url="http://127.0.0.1:8080")
    banner = up_banner(local, "sq_dev_x", "redis://127.0.0.1:6390/0")
    assert "Console: http://127.0.0.1:8080/console" in banner
    assert f"the admin key in {tmp_path / 'dev-admin-key'}" in banner
    key = dev_api_key(tmp_path, "dev-admin-key")
    assert key == dev_api_key(tmp_path, "dev-admin-key")  # made once, then reused
    assert key not in banner
    assert (tmp_path / "dev-admin-key").stat().st_mode & 0o777 == 0o600
