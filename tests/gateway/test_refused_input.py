"""The refused-submission input race (issue #12): a refused submission must not delete the
input that a concurrent identical submission -- here another tenant's, accepted -- found
stored and named in its job. Retention, not the request, removes inputs nobody needs."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from splatq.services.gateway.app import create_app
from splatq.shared.engine.queue import JobQueue
from splatq.shared.maintenance.config import RetentionConfig
from splatq.shared.settings import Settings
from splatq.shared.storage.store import LocalFileStorage, input_key
from tests.gateway import corpus
from tests.gateway.conftest import AUTH_A, AUTH_B, KEY_A, KEY_B
from tests.gateway.test_api import form, problem
from tests.maintenance.helpers import retention_scheduler, run_task

HOUR = 3600.0


class HoldAfterFirstWrite(LocalFileStorage):
    """Once armed, the first put_if_absent stores its object and then waits for `release`:
    the moment a submission has stored its input and not yet heard its enqueue's answer."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, group_commit=False)
        self.armed = False
        self.stored = asyncio.Event()
        self.release = asyncio.Event()

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        wrote = await super().put_if_absent(key, data)
        if self.armed:
            self.armed = False
            self.stored.set()
            await self.release.wait()
        return wrote


@pytest.fixture
async def gateway(
    settings: Settings, tmp_path: Path
) -> AsyncIterator[tuple[TestClient[Any, Any], HoldAfterFirstWrite]]:
    storage = HoldAfterFirstWrite(tmp_path / "objects")
    s = settings.with_overrides(
        api_keys={KEY_A: "acme", KEY_B: "beta"},
        rate_limit_per_s=1000.0,
        rate_limit_burst=1000,
        max_backlog_interactive=8,
        tenant_backlog_share=0.25,  # 2 unfinished jobs per tenant
    )
    client = TestClient(TestServer(create_app(s, storage=storage, registry=CollectorRegistry())))
    await client.start_server()
    yield client, storage
    await client.close()


def _age(storage: LocalFileStorage, key: str, seconds: float) -> None:
    at = time.time() - seconds
    os.utime(storage.path_of(key), (at, at))


async def test_a_refused_twin_leaves_the_input_of_the_accepted_one(
    gateway: tuple[TestClient[Any, Any], HoldAfterFirstWrite], queue: JobQueue
) -> None:
    client, storage = gateway
    for i in range(2):  # acme's share of the queue is full
        resp = await client.post("/v1/jobs", data=form(corpus.valid_png(8 + i, 8),
                                 {"quality": "preview"}), headers=AUTH_A)  # fmt: skip
        assert resp.status == 202
    image = corpus.valid_png(40, 8)
    storage.armed = True
    refused = asyncio.create_task(
        client.post("/v1/jobs", data=form(image, {"quality": "preview"}), headers=AUTH_A)
    )
    await asyncio.wait_for(storage.stored.wait(), 30)  # acme's request stored the input ...
    # ... and beta's identical submission finds it stored and names it in its job.
    resp = await client.post("/v1/jobs", data=form(image, {"quality": "preview"}), headers=AUTH_B)
    assert resp.status == 202
    job = await queue.get((await resp.json())["id"])
    assert job is not None
    storage.release.set()
    await problem(await refused, 429, "tenant_backlog_full")
    assert await storage.exists(job.input_ref)  # the refusal deleted nothing

    # Retention, hours later: the queued job's input stays, an input nobody needs goes.
    orphan = input_key("0" * 64, "png")
    await storage.put_bytes(orphan, b"unreferenced")
    _age(storage, job.input_ref, 2 * HOUR)
    _age(storage, orphan, 2 * HOUR)
    config = RetentionConfig(inputs_max_age_s=int(HOUR), inputs_grace_s=600)
    summary = await run_task(retention_scheduler(queue, storage, config))
    assert summary == "deleted 1 inputs, 0 artifacts, 0 intermediates"
    assert await storage.exists(job.input_ref)
    assert not await storage.exists(orphan)
