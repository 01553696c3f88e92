"""Tenants over real loopback HTTP: the admin API's auth codes, keys created, rotated and
revoked without a restart, the GPU quota at submission (429 with its reset), no double
reservation for a repeat, compensation for a refused submission, and GET /v1/usage."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from splatq.shared.storage.store import LocalFileStorage
from splatq.shared.tenants.quota import QuotaBook
from splatq.shared.testing import eventually
from tests.gateway import corpus
from tests.gateway.conftest import ADMIN, ADMIN_KEY, AUTH_A, ClientFactory
from tests.gateway.test_api import form, nothing_left_behind, problem

Client = TestClient[Any, Any]
PREVIEW = {"quality": "preview"}


async def _admin_client(make_client: ClientFactory, **overrides: Any) -> Client:
    return await make_client(admin_api_key=ADMIN_KEY, **overrides)


async def test_admin_api_auth_codes(make_client: ClientFactory) -> None:
    off = await make_client(admin_api_key="")
    await problem(await off.get("/v1/admin/tenants", headers=ADMIN), 403, "admin_disabled")
    client = await _admin_client(make_client)
    await problem(await client.get("/v1/admin/tenants"), 401, "unauthorized")
    bad = {"Authorization": "Bearer not-a-key"}
    await problem(await client.get("/v1/admin/tenants", headers=bad), 401, "unauthorized")
    await problem(await client.get("/v1/admin/tenants", headers=AUTH_A), 403, "forbidden")
    assert (await client.get("/v1/admin/tenants", headers=ADMIN)).status == 200
    # the admin key is no tenant's key
    await problem(await client.get("/v1/usage", headers=ADMIN), 401, "unauthorized")


async def test_tenant_lifecycle_and_revoke_within_the_cache_ttl(make_client: ClientFactory) -> None:
    client = await _admin_client(make_client, api_key_cache_s=0.3)
    created = await client.post(
        "/v1/admin/tenants",
        json={"tenant": "zeta", "weight": 4, "running_caps": {"synthesis": 2}},
        headers=ADMIN,
    )
    assert created.status == 201, await created.text()
    body = await created.json()
    assert (body["weight"], body["running_caps"]["synthesis"]) == (4, 2)
    await problem(
        await client.post("/v1/admin/tenants", json={"tenant": "zeta"}, headers=ADMIN),
        409,
        "tenant_exists",
    )
    await problem(
        await client.post("/v1/admin/tenants", json={"tenant": "a:b"}, headers=ADMIN),
        400,
        "invalid_request",
    )
    resp = await client.post("/v1/admin/tenants/zeta/keys", json={"label": "ci"}, headers=ADMIN)
    assert resp.status == 201
    key = (await resp.json())["api_key"]
    auth = {"Authorization": f"Bearer {key}"}
    submitted = await client.post("/v1/jobs", data=form(params=PREVIEW), headers=auth)
    assert submitted.status == 202
    job = await submitted.json()
    assert (await client.get(f"/v1/jobs/{job['id']}", headers=auth)).status == 200
    listed = await (await client.get("/v1/admin/tenants/zeta/keys", headers=ADMIN)).json()
    (info,) = listed["keys"]
    assert key not in str(listed)
    assert info["hint"].endswith(key[-4:])
    revoked = await client.delete(f"/v1/admin/tenants/zeta/keys/{info['key_id']}", headers=ADMIN)
    assert revoked.status == 204

    async def refused() -> bool:
        return (await client.get("/v1/usage", headers=auth)).status == 401

    await eventually(refused, timeout=10)
    await problem(
        await client.delete(f"/v1/admin/tenants/zeta/keys/{info['key_id']}", headers=ADMIN),
        404,
        "not_found",
    )
    await problem(await client.get("/v1/admin/tenants/nope", headers=ADMIN), 404, "not_found")


async def test_rotation_keeps_the_old_key_for_its_grace(make_client: ClientFactory) -> None:
    client = await _admin_client(make_client, api_key_cache_s=0.0)
    await client.post("/v1/admin/tenants", json={"tenant": "rot"}, headers=ADMIN)
    old = await (await client.post("/v1/admin/tenants/rot/keys", json={}, headers=ADMIN)).json()
    new = await (
        await client.post(
            "/v1/admin/tenants/rot/keys",
            json={"rotate": old["key_id"], "grace_seconds": 3600},
            headers=ADMIN,
        )
    ).json()
    for key in (old["api_key"], new["api_key"]):
        resp = await client.get("/v1/usage", headers={"Authorization": f"Bearer {key}"})
        assert resp.status == 200
    keys = (await (await client.get("/v1/admin/tenants/rot", headers=ADMIN)).json())["keys"]
    assert [k["expires_at"] is not None for k in keys] == [True, False]


async def test_revocation_and_rotation_take_effect_at_once_on_every_gateway(
    make_client: ClientFactory,
) -> None:
    """Two gateways on one Redis, each caching key lookups for a minute: a key revoked through
    one, or retired through it by a rotation with no grace, is refused by the other at the
    very next request (the key registry's version is read per request)."""
    one = await _admin_client(make_client, api_key_cache_s=60.0)
    two = await _admin_client(make_client, api_key_cache_s=60.0)
    await one.post("/v1/admin/tenants", json={"tenant": "ops"}, headers=ADMIN)
    first = await (await one.post("/v1/admin/tenants/ops/keys", json={}, headers=ADMIN)).json()
    second = await (await one.post("/v1/admin/tenants/ops/keys", json={}, headers=ADMIN)).json()
    auth1 = {"Authorization": f"Bearer {first['api_key']}"}
    auth2 = {"Authorization": f"Bearer {second['api_key']}"}
    for auth in (auth1, auth2):
        assert (await two.get("/v1/usage", headers=auth)).status == 200  # cached on `two`
    revoked = await one.delete(f"/v1/admin/tenants/ops/keys/{first['key_id']}", headers=ADMIN)
    assert revoked.status == 204
    await problem(await two.get("/v1/usage", headers=auth1), 401, "unauthorized")
    assert (await two.get("/v1/usage", headers=auth2)).status == 200
    rotated = await one.post(
        "/v1/admin/tenants/ops/keys",
        json={"rotate": second["key_id"], "grace_seconds": 0},
        headers=ADMIN,
    )
    assert rotated.status == 201
    await problem(await two.get("/v1/usage", headers=auth2), 401, "unauthorized")
    auth3 = {"Authorization": f"Bearer {(await rotated.json())['api_key']}"}
    assert (await two.get("/v1/usage", headers=auth3)).status == 200


async def test_quota_exceeded_is_429_with_the_reset_and_leaves_no_job(
    make_client: ClientFactory, redis: Redis, storage: LocalFileStorage
) -> None:
    client = await _admin_client(make_client, quota_estimates_ms={"preview": 4000, "full": 60000})
    resp = await client.put(
        "/v1/admin/tenants/acme/quota", json={"gpu_seconds": 3, "period": "day"}, headers=ADMIN
    )
    assert resp.status == 200, await resp.text()
    refused = await client.post("/v1/jobs", data=form(params=PREVIEW), headers=AUTH_A)
    body = await problem(refused, 429, "quota_exceeded")
    assert body["resets_at"].endswith("T00:00:00.000Z")
    assert (body["quota_gpu_seconds"], body["requested_gpu_seconds"]) == (3, 4)
    assert 1 <= int(refused.headers["Retry-After"]) <= 86400
    await nothing_left_behind(redis, storage, inputs=1)  # the input stays for retention
    usage = await (await client.get("/v1/usage", headers=AUTH_A)).json()
    assert (usage["reserved_gpu_seconds"], usage["used_gpu_seconds"]) == (0, 0)
    await problem(
        await client.put("/v1/admin/tenants/acme/quota", json={"gpu_seconds": -1}, headers=ADMIN),
        400,
        "invalid_request",
    )


async def test_a_repeat_does_not_reserve_twice_and_a_refusal_releases(
    make_client: ClientFactory, redis: Redis
) -> None:
    client = await _admin_client(
        make_client, quota_estimates_ms={"preview": 4000, "full": 60000}, max_backlog_interactive=1
    )
    await client.put("/v1/admin/tenants/acme/quota", json={"gpu_seconds": 9}, headers=ADMIN)
    first, again = await asyncio.gather(
        *(client.post("/v1/jobs", data=form(params=PREVIEW), headers=AUTH_A) for _ in range(2))
    )
    assert {first.status, again.status} == {202}
    assert (await first.json())["id"] == (await again.json())["id"]
    book = QuotaBook(redis)
    assert (await book.usage("acme")).reserved_ms == 4000
    # another image: the tenant's share of the queue is full, so its reservation is given back
    other = corpus.valid_png(40, 40)
    await problem(
        await client.post("/v1/jobs", data=form(other, PREVIEW), headers=AUTH_A),
        429,
        "tenant_backlog_full",
    )
    usage = await (await client.get("/v1/usage", headers=AUTH_A)).json()
    assert (usage["quota_gpu_seconds"], usage["reserved_gpu_seconds"]) == (9, 4)
    assert usage["remaining_gpu_seconds"] == 5
    assert len(await book.open_reservations("acme")) == 1


async def test_a_tenants_own_cap_and_weight_reach_the_scheduler(
    make_client: ClientFactory, redis: Redis
) -> None:
    """A running cap set through the admin API governs the tenant's next submissions: its jobs
    go to its home partition and carry its cap and weight into the fair queue."""
    from splatq.shared.engine.fairness import home_partition  # noqa: PLC0415
    from splatq.shared.engine.ids import partition_of  # noqa: PLC0415

    client = await _admin_client(make_client, partitions=4)
    await client.patch(
        "/v1/admin/tenants/acme",
        json={"weight": 5, "running_caps": {"interactive": 3}},
        headers=ADMIN,
    )
    settings_resp = await client.get("/v1/admin/tenants/acme", headers=ADMIN)
    assert (await settings_resp.json())["running_caps"]["interactive"] == 3
    home = home_partition("acme", 4)
    for i in range(3):
        png = corpus.valid_png(20 + i, 20)
        resp = await client.post("/v1/jobs", data=form(png, PREVIEW), headers=AUTH_A)
        assert resp.status == 202, await resp.text()
        assert partition_of((await resp.json())["id"]) == home
    state = await redis.hgetall(f"splatq:{{p{home}}}:fq:interactive:state")
    assert (state.get("w:acme"), state.get("c:acme")) == ("5", "3")
