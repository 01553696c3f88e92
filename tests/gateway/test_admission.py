"""Admission without HTTP: `Admission.admit` on a real Redis and real files decides a
submission (Created, Joined, Cached, Refused) with no aiohttp request anywhere -- what the
routes translate, tested on its own."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from splatq.services.gateway import admission as admission_module
from splatq.services.gateway.admission import Admission, Ask, Created, Joined, Refused
from splatq.services.gateway.images import validate_image
from splatq.services.gateway.metrics import GatewayMetrics
from splatq.services.gateway.result_cache import ResultCache
from splatq.services.gateway.submission import Params, Submission
from splatq.services.gateway.tenant_policies import TenantPolicies
from splatq.shared.engine.fairness import fairness_of
from splatq.shared.engine.producers import Producers
from splatq.shared.engine.queue import JobQueue
from splatq.shared.redis.replica_wait import ReplicaWait
from splatq.shared.settings import Settings
from splatq.shared.storage.store import LocalFileStorage
from splatq.shared.tenants.periods import Period
from splatq.shared.tenants.quota import QuotaBook
from splatq.shared.tenants.store import TenantStore
from tests.gateway.corpus import valid_png


def _admission(redis: Redis, queue: JobQueue, settings: Settings, root: Path) -> Admission:
    metrics = GatewayMetrics.create(CollectorRegistry())
    return Admission(
        settings,
        Producers(queue.backend),  # the producer role alone: no JobQueue needed
        LocalFileStorage(root),
        QuotaBook(redis),
        ResultCache(settings, metrics.cache_lookups),
        TenantPolicies(TenantStore(redis), fairness_of(settings), 1.0, 100),
        ReplicaWait(redis, 0, 100),
        metrics.submissions,
    )


def _ask(params: Params, key: str = "", width: int = 32) -> Ask:
    data = valid_png(width, 24)
    image = validate_image(data, max_pixels=10**7, max_decode_bytes=10**9, max_jpeg_scans=100)
    return Ask(
        tenant="acme",
        image=image,
        data=data,
        params=params,
        fingerprint=Submission(data, params).request_fingerprint(image.sha256),
        idempotency_key=key,
    )


async def test_a_submission_is_created_then_joined_by_its_twin(
    redis: Redis, queue: JobQueue, settings: Settings, tmp_path: Path
) -> None:
    admission = _admission(redis, queue, settings, tmp_path)
    first = await admission.admit(_ask(Params(quality="preview")))
    assert isinstance(first, Created)
    again = await admission.admit(_ask(Params(quality="preview")))
    assert isinstance(again, Joined)
    assert again.job.id == first.job.id
    assert not again.keyed
    other = await admission.admit(_ask(Params(quality="preview"), width=33))
    assert isinstance(other, Created)
    assert other.job.id != first.job.id
    stored = list((tmp_path / "inputs").rglob("*.png"))
    assert len(stored) == 2  # the input is stored before its job exists


async def test_a_key_reused_for_another_request_is_refused(
    redis: Redis, queue: JobQueue, settings: Settings, tmp_path: Path
) -> None:
    admission = _admission(redis, queue, settings, tmp_path)
    first = await admission.admit(_ask(Params(quality="preview"), key="K"))
    assert isinstance(first, Created)
    same = await admission.admit(_ask(Params(quality="preview"), key="K"))
    assert isinstance(same, Joined)
    assert same.keyed
    assert same.job.id == first.job.id
    different = await admission.admit(_ask(Params(quality="preview"), key="K", width=40))
    assert isinstance(different, Refused)
    assert (different.error.status, different.error.code) == (422, "idempotency_key_reused")


async def test_a_tenant_over_its_quota_is_refused_and_keeps_no_reservation(
    redis: Redis, queue: JobQueue, settings: Settings, tmp_path: Path
) -> None:
    admission = _admission(redis, queue, settings, tmp_path)
    await TenantStore(redis).set_quota("acme", 0.001, Period.DAY)
    refused = await admission.admit(_ask(Params(quality="preview")))
    assert isinstance(refused, Refused)
    assert (refused.error.status, refused.error.code) == (429, "quota_exceeded")
    assert await QuotaBook(redis).open_reservations("acme") == {}
    jobs = [k async for k in redis.scan_iter(match=f"{queue.keys.prefix}:*:job:*")]
    assert jobs == []  # no job without a reservation


def test_admission_speaks_no_http() -> None:
    tree = ast.parse(inspect.getsource(admission_module))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert "aiohttp" not in imported
    assert "web.Request" not in inspect.getsource(admission_module)
