"""Hostile images posted to a real gateway over loopback HTTP: each gets its precise 4xx and
code at a bounded CPU cost and leaves nothing behind; a tenant past its decodes gets 429.

The gateway runs in this process (aiohttp TestServer), so process CPU time is its cost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from splatq.shared.storage.store import LocalFileStorage
from tests import hostile_inputs as hostile
from tests.gateway.conftest import AUTH_A, ClientFactory
from tests.gateway.test_api import form, nothing_left_behind, problem

Client = TestClient[Any, Any]

HOSTILE: list[tuple[str, Callable[[], bytes], int, str]] = [
    ("jpeg_scan_bomb", lambda: hostile.jpeg_scan_bomb(1000), 422, "image_too_complex"),
    ("png_flood_8900", hostile.png_flood, 422, "image_too_large"),
    ("png_header_flood", hostile.png_header_flood, 422, "image_too_large"),
    ("jpeg_header_flood", hostile.jpeg_header_flood, 422, "image_too_large"),
    ("png_short_data", hostile.png_size_disagrees_with_data, 422, "invalid_image"),
    *(
        (name, lambda d=data: d, 422, "invalid_image")
        for name, data in hostile.truncated_headers().items()
    ),
    ("png_body_jpeg_magic", lambda: hostile.wrong_magic()["png_body_jpeg_magic"], 422,
     "invalid_image"),
    ("jpeg_body_png_magic", lambda: hostile.wrong_magic()["jpeg_body_png_magic"], 422,
     "invalid_image"),
    ("png_signature_corrupted", lambda: hostile.wrong_magic()["png_signature_corrupted"], 415,
     "unsupported_media_type"),
    ("jpeg_without_soi", lambda: hostile.wrong_magic()["jpeg_without_soi"], 415,
     "unsupported_media_type"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("factory", "status", "code"),
    [pytest.param(f, s, c, id=name) for name, f, s, c in HOSTILE],
)
async def test_hostile_upload_gets_its_code_at_bounded_cpu_cost(
    client: Client,
    redis: Redis,
    storage: LocalFileStorage,
    factory: Callable[[], bytes],
    status: int,
    code: str,
) -> None:
    """Each hostile image is refused with its status and code for under 0.2 s of the
    process's CPU (client, multipart and gateway together); the scan bomb cost ~10 s."""
    body = form(factory())
    started = time.process_time()
    resp = await client.post("/v1/jobs", data=body, headers=AUTH_A)
    await problem(resp, status, code)
    assert time.process_time() - started < 0.2
    await nothing_left_behind(redis, storage)


async def test_the_gateway_answers_429_when_a_tenant_exceeds_its_decodes(
    make_client: ClientFactory,
) -> None:
    """Over HTTP: with a per-tenant limit of 1 and no wait, two heavy uploads at once from
    one key give one 202 and one 429 too_many_decodes."""
    client = await make_client(decode_concurrency_per_tenant=1, decode_wait_s=0.0)
    image = hostile.jpeg_scan_bomb(22)  # 32 scans of 4000x4000: a quarter second to decode
    responses = await asyncio.gather(
        *(client.post("/v1/jobs", data=form(image), headers=AUTH_A) for _ in range(2))
    )
    statuses = sorted(r.status for r in responses)
    assert statuses == [202, 429]
    refused = next(r for r in responses if r.status == 429)
    await problem(refused, 429, "too_many_decodes")
