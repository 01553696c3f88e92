"""The OpenAPI document and the server agree (issue #28): each constraint the document states
is enforced, each one the server enforces is stated, the document's own examples are
accepted, the shapes generators choke on are gone, the event stream's items validate against
`JobStreamEvent`, and even aiohttp's own parser errors are problem+json."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient
from jsonschema import Draft202012Validator
from prometheus_client import CollectorRegistry

from splatq.services.gateway.app import create_app
from splatq.services.gateway.openapi import openapi_document
from splatq.services.gateway.openapi_jobs import PNG_1X1_DATA_URL
from splatq.services.gateway.server import GatewayRunner
from splatq.shared.redis.server import free_port
from splatq.shared.settings import Settings
from splatq.shared.storage.store import LocalFileStorage
from tests.gateway.conftest import AUTH_A, KEY_A, ClientFactory
from tests.gateway.test_api import form, problem

Client = TestClient[Any, Any]
DOC = openapi_document("http://gateway.test")
SCHEMAS = DOC["components"]["schemas"]
ADMIN_KEY = "admin-key-0123456789-0123456789-abcdefghijkl"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(
        {"$ref": f"#/components/schemas/{name}", "components": DOC["components"]}
    )


def test_no_request_body_is_an_untyped_union() -> None:
    """Every request body is one object schema: a top-level `oneOf` made generated clients
    test `isinstance(body, Any)` and fail before sending."""
    for path, item in DOC["paths"].items():
        for method, op in item.items():
            for media, content in op.get("requestBody", {}).get("content", {}).items():
                schema = content["schema"]
                if "$ref" in schema:
                    schema = SCHEMAS[schema["$ref"].rsplit("/", 1)[-1]]
                assert schema.get("type") == "object", (method, path, media)
                assert "oneOf" not in schema, (method, path, media)
                assert "anyOf" not in schema, (method, path, media)


def test_exactly_one_of_image_and_image_url_is_stated_for_validators() -> None:
    validator = _validator("SubmitJobJson")
    assert validator.is_valid({"image": "aGk="})
    assert validator.is_valid({"image_url": "https://h.example/a.png"})
    assert not validator.is_valid({})
    assert not validator.is_valid({"image": "aGk=", "image_url": "https://h.example/a.png"})
    for name in ("SubmitJobJson", "SubmitJobForm"):  # and in words, for people and generators
        assert "exactly one of `image` and `image_url`" in SCHEMAS[name]["description"]


def test_open_ended_codes_and_one_class_per_enum() -> None:
    code = SCHEMAS["Problem"]["properties"]["code"]
    assert code["type"] == "string"
    assert "enum" not in code
    assert "quota_exceeded" in code["description"]
    job = SCHEMAS["Job"]["properties"]
    assert job["current_stage"]["anyOf"] == [
        {"$ref": "#/components/schemas/PipelineStage"},
        {"type": "null"},
    ]
    assert job["status"] == {"$ref": "#/components/schemas/JobStatus"}
    listed = DOC["paths"]["/v1/jobs"]["get"]["parameters"]
    status = next(p for p in listed if p["name"] == "status")
    assert status["schema"] == {
        "type": "array",
        "items": {"$ref": "#/components/schemas/JobStatus"},
    }
    assert status["explode"] is True


async def test_the_documents_submit_examples_are_accepted(client: Client) -> None:
    """The inline example is a real image: replayed as is (minus its webhook, which the SSRF
    guard would check), it is a job."""
    content = DOC["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
    example = dict(content["examples"]["base64"]["value"])
    assert example["image"] == PNG_1X1_DATA_URL
    resp = await client.post("/v1/jobs", json=example, headers=AUTH_A)
    assert resp.status == 202, await resp.text()


async def test_header_constraints_are_enforced(client: Client) -> None:
    empty_key = {**AUTH_A, "Idempotency-Key": ""}
    await problem(await client.post("/v1/jobs", data=form(), headers=empty_key), 400,
                  "invalid_request")  # fmt: skip
    long_prefer = {**AUTH_A, "Prefer": "wait=1, " + "x" * 64}
    await problem(await client.post("/v1/jobs", data=form(), headers=long_prefer), 400,
                  "invalid_request")  # fmt: skip
    ok = await client.post("/v1/jobs", data=form(), headers={**AUTH_A, "Prefer": "wait=0"})
    assert ok.status == 202


async def test_json_image_rules_match_the_schema(client: Client) -> None:
    both = {"image": None, "image_url": "https://images.example.com/a.png"}
    await problem(await client.post("/v1/jobs", json=both, headers=AUTH_A), 400,
                  "invalid_request")  # fmt: skip
    unpadded = {"image": base64.b64encode(b"abcd").decode().rstrip("=")}
    await problem(await client.post("/v1/jobs", json=unpadded, headers=AUTH_A), 400,
                  "invalid_request")  # fmt: skip
    assert not _validator("SubmitJobJson").is_valid(unpadded)


async def test_query_constraints_are_enforced(client: Client) -> None:
    for query in ("cursor=", "status=", "status=queued,", "status=queued&status="):
        await problem(await client.get(f"/v1/jobs?{query}", headers=AUTH_A), 400,
                      "invalid_request")  # fmt: skip
    ok = await client.get("/v1/jobs?status=queued&status=failed,completed", headers=AUTH_A)
    assert ok.status == 200
    job = await (await client.post("/v1/jobs", data=form(), headers=AUTH_A)).json()
    stream = f"/v1/jobs/{job['id']}/events"
    events = f"{stream}?last_event_id={'1' * 20}-0"  # 20 digits: not an id
    await problem(await client.get(events, headers=AUTH_A), 400, "invalid_request")
    empty = {**AUTH_A, "Last-Event-ID": ""}
    await problem(await client.get(stream, headers=empty), 400,
                  "invalid_request")  # fmt: skip
    both = {**AUTH_A, "Last-Event-ID": "1-0"}  # the header wins, but the query is checked too
    await problem(await client.get(f"{stream}?last_event_id=x", headers=both), 400,
                  "invalid_request")  # fmt: skip


async def test_admin_constraints_and_paging(make_client: ClientFactory) -> None:
    client = await make_client(admin_api_key=ADMIN_KEY)
    created = await client.post("/v1/admin/tenants", json={"tenant": "zeta", "weight": 2.0},
                                headers=ADMIN)  # fmt: skip
    assert created.status == 201, await created.text()
    assert (await created.json())["weight"] == 2
    keys = "/v1/admin/tenants/zeta/keys"
    for rotate in ("", "nope", "key_short"):
        await problem(await client.post(keys, json={"rotate": rotate}, headers=ADMIN), 400,
                      "invalid_request")  # fmt: skip
    missing = {"rotate": "key_" + "0" * 26}
    await problem(await client.post(keys, json=missing, headers=ADMIN), 404, "not_found")
    # Configured tenants (SPLATQ_API_KEYS: acme, beta) are listed like created ones, paged.
    seen: list[dict[str, Any]] = []
    url: str | None = "/v1/admin/tenants?limit=2"
    while url is not None:
        resp = await client.get(url, headers=ADMIN)
        page = await resp.json()
        _validator_for(DOC["paths"]["/v1/admin/tenants"]["get"]).validate(page)
        assert len(page["tenants"]) <= 2
        seen.extend(page["tenants"])
        url = page["next"].removeprefix("http://gateway.test") if page["next"] else None
    names = [t["tenant"] for t in seen]
    assert names == sorted(names)
    assert {"acme", "beta", "zeta"} <= set(names)
    by_name = {t["tenant"]: t for t in seen}
    assert by_name["acme"]["configured"] is True
    assert by_name["zeta"]["configured"] is False
    assert by_name["zeta"]["created_at"] is not None
    await problem(await client.get("/v1/admin/tenants?cursor=", headers=ADMIN), 400,
                  "invalid_request")  # fmt: skip
    await problem(await client.get("/v1/admin/tenants?cursor=%21", headers=ADMIN), 400,
                  "invalid_request")  # fmt: skip


def _validator_for(operation: dict[str, Any]) -> Draft202012Validator:
    schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    return Draft202012Validator({**schema, "components": DOC["components"]})


async def test_stream_events_validate_against_their_item_schema(client: Client) -> None:
    """Each SSE event of a real (then canceled) job is a `JobStreamEvent` whose `data` is
    the named event payload."""
    job = await (await client.post("/v1/jobs", data=form(), headers=AUTH_A)).json()
    assert (await client.post(f"/v1/jobs/{job['id']}/cancel", headers=AUTH_A)).status == 202
    resp = await client.get(f"/v1/jobs/{job['id']}/events", headers=AUTH_A)
    text = await resp.text()
    events = [_sse_fields(block) for block in text.split("\n\n") if block.startswith("id:")]
    assert [e["event"] for e in events][-1] == "3d_reconstruction.canceled"
    item = _validator("JobStreamEvent")
    content_schema = SCHEMAS["JobStreamEvent"]["properties"]["data"]["contentSchema"]
    payload = Draft202012Validator({**content_schema, "components": DOC["components"]})
    for event in events:
        item.validate(event)
        payload.validate(orjson.loads(event["data"]))
    media = DOC["paths"]["/v1/jobs/{job_id}/events"]["get"]["responses"]["200"]["content"]
    assert media["text/event-stream"] == {
        "itemSchema": {"$ref": "#/components/schemas/JobStreamEvent"}
    }


def _sse_fields(block: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))


async def test_parser_errors_are_problem_json(
    settings: Settings, storage: LocalFileStorage
) -> None:
    """A request aiohttp's parser refuses (Content-Length with Transfer-Encoding) is answered
    by the served runner as a 400 problem, not aiohttp's text/plain."""
    app = create_app(
        settings.with_overrides(api_keys={KEY_A: "acme"}),
        storage=storage,
        registry=CollectorRegistry(),
    )
    runner = GatewayRunner(app, header_timeout_s=0, access_log=None)
    await runner.setup()
    port = free_port()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        )
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout=10)
        writer.close()
    finally:
        await runner.cleanup()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") or head.startswith(b"HTTP/1.0 400"), head
    assert b"Content-Type: application/problem+json" in head
    doc = orjson.loads(body)
    assert doc["code"] == "invalid_request"
    assert doc["status"] == 400
    assert "Transfer-Encoding" in doc["detail"]
    _validator("Problem").validate(doc)


async def test_webhook_url_empty_is_refused_as_declared(client: Client) -> None:
    body = DOC["paths"]["/v1/webhook-endpoints"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"]["properties"]["url"]["minLength"] == 1
    resp = await client.post("/v1/webhook-endpoints", json={"url": ""}, headers=AUTH_A)
    await problem(resp, 400, "invalid_request")


async def test_a_quota_as_large_as_the_schema_allows_still_admits(
    make_client: ClientFactory,
) -> None:
    """gpu_seconds up to 1e12 is valid: a submission under it is a job, not a 500 (the
    reserve script wrote the limit as "9e+14")."""
    client = await make_client(admin_api_key=ADMIN_KEY)
    quota = {"gpu_seconds": 9.1e11, "period": "day"}
    resp = await client.put("/v1/admin/tenants/acme/quota", json=quota, headers=ADMIN)
    assert resp.status == 200, await resp.text()
    submitted = await client.post("/v1/jobs", data=form(), headers=AUTH_A)
    assert submitted.status == 202, await submitted.text()
    usage = await (await client.get("/v1/usage", headers=AUTH_A)).json()
    assert usage["quota_gpu_seconds"] == 9.1e11


async def test_endpoint_and_params_constraints_are_enforced(client: Client) -> None:
    """webhook_url of another type is refused (an empty object was taken for none); an empty
    attempts cursor is refused (it was taken for none); header values are visible ASCII."""
    body = {"image": PNG_1X1_DATA_URL, "webhook_url": {}}
    await problem(await client.post("/v1/jobs", json=body, headers=AUTH_A), 400,
                  "invalid_request")  # fmt: skip
    created = await client.post(
        "/v1/webhook-endpoints", json={"url": "https://hooks.example.com/x"}, headers=AUTH_A
    )
    assert created.status == 201, await created.text()
    endpoint = (await created.json())["id"]
    attempts = f"/v1/webhook-endpoints/{endpoint}/attempts?cursor="
    await problem(await client.get(attempts, headers=AUTH_A), 400, "invalid_request")
    create = DOC["paths"]["/v1/webhook-endpoints"]["post"]["requestBody"]["content"]
    headers_schema = create["application/json"]["schema"]["properties"]["headers"]
    value_validator = Draft202012Validator(headers_schema["additionalProperties"])
    assert not value_validator.is_valid("a\x0bb")
    bad = {"url": "https://hooks.example.com/x", "headers": {"X-A": "a\x0bb"}}
    resp = await client.post("/v1/webhook-endpoints", json=bad, headers=AUTH_A)
    await problem(resp, 400, "invalid_request")


async def test_non_ascii_digits_are_refused_not_a_500(make_client: ClientFactory) -> None:
    """`"¹".isdigit()` is true and `int("¹")` raises: a limit or a Prefer wait of it was a
    500. Now a limit of it is a 400 and such a wait an ignored preference (RFC 7240)."""
    client = await make_client(admin_api_key=ADMIN_KEY)
    created = await client.post(
        "/v1/webhook-endpoints", json={"url": "https://hooks.example.com/x"}, headers=AUTH_A
    )
    endpoint = (await created.json())["id"]
    for url, headers in (
        ("/v1/jobs?limit=%C2%B9", AUTH_A),
        (f"/v1/webhook-endpoints/{endpoint}/attempts?limit=%C2%B9", AUTH_A),
        ("/v1/admin/tenants?limit=%C2%B9", ADMIN),
    ):
        await problem(await client.get(url, headers=headers), 400, "invalid_request")
    resp = await client.post("/v1/jobs", data=form(), headers={**AUTH_A, "Prefer": "wait=¹"})
    assert resp.status == 202, await resp.text()
