"""The OpenAPI document against the running gateway: every route is described and every
described operation is routed; every operation has a summary and a declared tag; request
schemas name exactly what the parsers accept; examples, the webhook payloads and real answers
(a job, a page of jobs, delivery attempts) validate against their schemas; and /docs renders
it as a self-contained page, checked in a real headless Chromium."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from jsonschema import Draft202012Validator

from splatq.services.gateway import listing
from splatq.services.gateway.endpoints import CREATE_FIELDS, UPDATE_FIELDS
from splatq.services.gateway.openapi import openapi_document
from splatq.services.gateway.submission import FORM_PARTS, PARAMS
from splatq.shared.engine.events import EventType
from splatq.shared.webhooks.store import TEST_EVENT
from tests.gateway.conftest import AUTH_A
from tests.gateway.test_api import form

Client = TestClient[Any, Any]
DOC = openapi_document("http://gateway.test")
METHODS = ("get", "post", "put", "patch", "delete")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, item[method])
        for path, item in DOC["paths"].items()
        for method in METHODS
        if method in item
    ]


def _check(instance: Any, ref: str) -> None:
    """Validate against `#/components/schemas/<ref>` with every $ref of the document."""
    schema = {"$ref": f"#/components/schemas/{ref}", "components": DOC["components"]}
    Draft202012Validator(schema).validate(instance)


async def test_every_route_is_described_and_every_operation_routed(client: Client) -> None:
    routed = {
        (r.method.lower(), r.resource.canonical)  # type: ignore[union-attr]
        for r in client.app.router.routes()  # type: ignore[union-attr]
        if r.method != "HEAD"
    }
    described = {(method, path) for path, method, _ in _operations()}
    assert routed == described


def test_every_operation_has_a_summary_a_declared_tag_and_a_unique_id() -> None:
    declared = {t["name"] for t in DOC["tags"]}
    ids = [op["operationId"] for _, _, op in _operations()]
    assert len(ids) == len(set(ids))
    for path, method, op in _operations():
        assert op["summary"].strip(), (method, path)
        assert op["tags"], (method, path)
        assert set(op["tags"]) <= declared, (method, path)


def _component(ref: dict[str, str]) -> dict[str, Any]:
    schema: dict[str, Any] = DOC["components"]["schemas"][ref["$ref"].rsplit("/", 1)[-1]]
    return schema


def test_request_schemas_name_exactly_what_the_parsers_accept() -> None:
    submit = DOC["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]
    json_schema = _component(submit["application/json"]["schema"])
    assert set(json_schema["properties"]) == PARAMS | {"image", "image_url"}
    form_schema = _component(submit["multipart/form-data"]["schema"])
    assert set(form_schema["properties"]) == FORM_PARTS
    assert set(_component(form_schema["properties"]["params"])["properties"]) == PARAMS
    assert submit["multipart/form-data"]["encoding"] == {
        "params": {"contentType": "application/json"}
    }
    endpoints = DOC["paths"]["/v1/webhook-endpoints"]["post"]["requestBody"]["content"]
    assert set(endpoints["application/json"]["schema"]["properties"]) == CREATE_FIELDS
    patch = DOC["paths"]["/v1/webhook-endpoints/{endpoint_id}"]["patch"]["requestBody"]
    assert set(patch["content"]["application/json"]["schema"]["properties"]) == UPDATE_FIELDS
    list_params = DOC["paths"]["/v1/jobs"]["get"]["parameters"]
    assert {p["name"] for p in list_params} == listing.QUERY_PARAMS


def test_the_webhooks_section_describes_every_event_payload() -> None:
    assert set(DOC["webhooks"]) == {e.value for e in EventType} | {TEST_EVENT}
    for name, item in DOC["webhooks"].items():
        op = item["post"]
        assert op["summary"]
        assert {"webhook-id", "webhook-timestamp", "webhook-signature"} <= {
            p["name"] for p in op["parameters"]
        }
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        schema = DOC["components"]["schemas"][ref.rsplit("/", 1)[-1]]
        assert schema["properties"]["event"]["const"] == name


def test_examples_validate_against_their_schemas() -> None:
    schemas = DOC["components"]["schemas"]
    checked = 0
    for name, schema in schemas.items():
        for example in schema.get("examples", []):
            _check(example, name)
            checked += 1
    assert checked >= 3  # Job, DeliveryAttempt, CompletedEvent
    submit = DOC["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
    for example in submit["examples"].values():
        _check(example["value"], "SubmitJobJson")


async def test_real_answers_validate_against_the_schemas(client: Client) -> None:
    resp = await client.post("/v1/jobs", data=form(), headers=AUTH_A)
    job = await resp.json()
    _check(job, "Job")
    _check(await (await client.get("/v1/jobs", headers=AUTH_A)).json(), "JobPage")
    attempt = {
        "message_id": "evt_x:job", "event_id": "evt_x", "event": "3d_reconstruction.queued",
        "target": "job", "url": "https://h.example/x", "attempt": 1, "at": 1764581403,
        "status_code": None, "latency_ms": 3.5, "outcome": "retry",
        "error": "connect error", "response": None,
    }  # fmt: skip
    _check(attempt, "DeliveryAttempt")  # the dispatcher's record shape, field for field


async def test_docs_page_is_self_contained_html(client: Client) -> None:
    resp = await client.get("/docs")
    assert resp.status == 200
    assert resp.content_type == "text/html"
    assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
    page = await resp.text()
    assert "<script" not in page
    assert "http://" not in page.replace("http://gateway.test", "")  # nothing from outside
    for path, _, op in _operations():
        assert op["summary"].replace("'", "&#x27;") in page, path
    for name in DOC["webhooks"]:
        assert name in page


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
async def test_docs_page_in_a_real_browser(client: Client, tmp_path: Path) -> None:
    """Headless Chromium loads /docs: every operation and event is a visible section, the
    page makes no other request, logs no console error, and a screenshot is taken."""
    from playwright.async_api import async_playwright  # noqa: PLC0415

    url = str(client.make_url("/docs"))
    requests: list[str] = []
    errors: list[str] = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = await browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            resp = await page.goto(url)
            assert resp is not None
            assert resp.status == 200
            assert "API reference" in await page.title()
            sections = page.locator("section.op")
            assert await sections.count() == len(_operations()) + len(DOC["webhooks"])
            assert await page.locator("#listjobs").is_visible()
            assert await page.locator("#webhook-events").is_visible()
            heading = await page.locator("#submitjob h3").inner_text()
            assert heading.split() == ["POST", "/v1/jobs"]
            await page.screenshot(path=str(tmp_path / "docs.png"), full_page=False)
        finally:
            await browser.close()
    assert requests == [url]
    assert errors == []
    assert (tmp_path / "docs.png").stat().st_size > 10_000
