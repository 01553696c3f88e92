"""SPLATQ_MODEL=remote end to end in one process: the engine's worker and the GPU worker's
handler against the fake vendor over loopback HTTP and a real redis-server -- request shapes,
sync and async predictions, what each kind of answer does to the job, cancel forwarding, the
vendor's webhook through the gateway, and quota metering on the vendor's reported time."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import structlog
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from splatq.services.gateway.views import job_view
from splatq.services.gpu_worker.handler import GpuJobHandler
from splatq.services.gpu_worker.metrics import GpuMetrics
from splatq.services.gpu_worker.remote.backend import RemoteModel
from splatq.shared.engine.ids import partition_of
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.stages import PipelineStage
from splatq.shared.maintenance.deadletters import DeadLetterBook
from splatq.shared.maintenance.keys import DeadLetterKind
from splatq.shared.maintenance.policy import Verdict, decide, default_policies
from splatq.shared.settings import Settings
from splatq.shared.storage.store import LocalFileStorage
from splatq.shared.testing import WorkerFactory, eventually, wait_for_status
from splatq.shared.vendor.config import VendorConfig
from splatq.shared.vendor.credentials import Credential
from splatq.shared.vendor.limiter import VendorLane, new_permit_id
from splatq.shared.webhooks.signing import generate_secret
from tests.gateway.test_spec_agreement import _validator
from tests.gpu_worker.conftest import sample_png, stored_spec
from tests.vendor.conftest import VendorFactory, vendor_config, write_config
from tests.vendor.fake_vendor import TOKEN, FakeVendor

HandlerFactory = Callable[..., Awaitable[GpuJobHandler]]


@pytest.fixture
async def remote_handler(
    settings: Settings, storage: LocalFileStorage, vendor_token: str
) -> AsyncIterator[HandlerFactory]:
    """GPU-worker handlers whose model is the remote backend for a vendor configuration."""
    made: list[GpuJobHandler] = []

    async def make(config: VendorConfig, **overrides: Any) -> GpuJobHandler:
        s = settings.with_overrides(device="cpu", model="remote", **overrides)
        model = RemoteModel(s, config, Credential(config.auth), storage, CollectorRegistry())
        handler = GpuJobHandler(s, model, storage, GpuMetrics.create(CollectorRegistry()))
        await handler.startup()
        made.append(handler)
        return handler

    yield make
    for handler in made:
        await handler.shutdown()


async def _run(
    vendor: FakeVendor,
    remote_handler: HandlerFactory,
    start_worker: WorkerFactory,
    queue: JobQueue,
    storage: LocalFileStorage,
    statuses: frozenset[str] = frozenset({"completed", "failed", "canceled"}),
    worker: dict[str, Any] | None = None,
    **sections: dict[str, Any],
) -> Any:
    config = vendor_config(vendor.url, **sections)
    handler = await remote_handler(config)
    await start_worker(handler, **(worker or {}))
    result = await queue.enqueue(await stored_spec(storage, sample_png(3)))
    return await wait_for_status(queue, result.job_id, set(statuses), timeout=30)


async def test_a_job_completes_through_the_vendor_and_shows_its_upstream(
    fake_vendor: VendorFactory,
    remote_handler: HandlerFactory,
    start_worker: WorkerFactory,
    queue: JobQueue,
    redis: Redis,
    storage: LocalFileStorage,
) -> None:
    """One prediction (created under the job's idempotency key, the image as a data URI),
    polled to its end; the output .ply converted and committed as the job's artifacts; the
    job's model is the backend's version; `upstream` in the view and in a progress event;
    the quota is metered with the vendor's reported predict_time (1.25 s), not the wall time."""
    vendor = await fake_vendor(duration_s=0.4)
    job = await _run(vendor, remote_handler, start_worker, queue, storage)
    assert job.status == "completed", job.error
    assert vendor.created == 1
    assert list(vendor.created_per_key.values()) == [1]
    assert next(iter(vendor.created_per_key)).startswith("splatq-")
    assert [p.input_kind for p in vendor.predictions.values()] == ["data_uri"]
    assert job.model == "remote:fake:trellis@abc"
    assert job.metered == {"job": 1250}
    assert job.compute_time_ms == 1250
    for name in ("gaussian_ply", "splat", "spz", "rendered_preview"):
        assert name in (job.artifacts or {})
    view = job_view(job, "http://gw")
    upstream = view["upstream"]
    assert upstream["vendor"] == "fake"
    assert upstream["request_id"] == "req-p00001"
    assert upstream["prediction_id"] == "p00001"
    assert isinstance(upstream["latency_ms"], int)
    assert upstream["latency_ms"] >= 400
    events = await redis.xrange(queue.keys.events(partition_of(job.id)))
    carried = [
        orjson.loads(f["payload"])["data"]["upstream"]
        for _, f in events
        if f["type"].endswith(".progress") and "upstream" in f["payload"]
    ]
    assert carried[0]["prediction_id"] == "p00001"
    assert carried[-1]["latency_ms"] is not None
    # both as the OpenAPI document declares them
    _validator("Job").validate(orjson.loads(orjson.dumps(view)))
    for _, f in events:
        if f["type"].endswith(".progress"):
            _validator("ProgressEvent").validate(orjson.loads(f["payload"]))


@pytest.mark.parametrize("mode", ["multipart", "sync"])
async def test_multipart_and_synchronous_vendors(
    mode: str,
    fake_vendor: VendorFactory,
    remote_handler: HandlerFactory,
    start_worker: WorkerFactory,
    queue: JobQueue,
    storage: LocalFileStorage,
) -> None:
    """The image as a multipart file part; a vendor that answers the create only when done
    (its answer holds the output): both complete with one prediction."""
    vendor = await fake_vendor(duration_s=0.3, mode="sync" if mode == "sync" else "async")
    sections: dict[str, Any] = (
        {"request": {"shape": "multipart", "image_field": "image"}}
        if mode == "multipart"
        else {"response": {"mode": "sync"}}
    )
    job = await _run(vendor, remote_handler, start_worker, queue, storage, **sections)
    assert job.status == "completed", job.error
    assert vendor.created == 1
    kinds = [p.input_kind for p in vendor.predictions.values()]
    assert kinds == (["multipart"] if mode == "multipart" else ["data_uri"])
    if mode == "multipart":
        assert vendor.bodies[0]["_image_bytes"] > 1000
        assert vendor.bodies[0]["version"] == "abc123"
    else:
        assert not [r for r in vendor.requests if r[0] == "get"]


async def test_a_rejected_input_fails_at_once_with_a_sanitised_message(
    fake_vendor: VendorFactory,
    remote_handler: HandlerFactory,
    start_worker: WorkerFactory,
    queue: JobQueue,
    storage: LocalFileStorage,
) -> None:
    """A 400 is permanent: failed after one attempt, UPSTREAM_REJECTED, the vendor's message
    without control characters, without our token (a vendor echoing it back), bounded."""
    nasty = "bad image\x1b[31m\nFAKE LOG LINE " + TOKEN + " " + "x" * 1000
    vendor = await fake_vendor(script=[("400", nasty)])
    job = await _run(vendor, remote_handler, start_worker, queue, storage)
    assert job.status == "failed"
    assert job.error is not None
    assert (job.error.code, job.error.retryable, job.attempts) == ("UPSTREAM_REJECTED", False, 1)
    assert TOKEN not in job.error.message
    assert "\x1b" not in job.error.message
    assert "\n" not in job.error.message
    assert len(job.error.message) <= 320
    assert vendor.created == 0


async def test_wrong_credentials_are_permanent_and_never_logged(
    fake_vendor: VendorFactory,
    remote_handler: HandlerFactory,
    start_worker: WorkerFactory,
    queue: JobQueue,
    storage: LocalFileStorage,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 401 fails the job with UPSTREAM_AUTH; no log line carries the token we sent."""
    secret = "r8_wrong_" + "s3cr3t" * 6
    monkeypatch.setenv("SPLATQ_TEST_VENDOR_TOKEN", secret)
    vendor = await fake_vendor()
    with structlog.testing.capture_logs() as logs:
        job = await _run(vendor, remote_handler, start_worker, queue, storage)
    assert job.error is not None
    assert job.error.code == "UPSTREAM_AUTH"
    assert logs, "nothing was logged"
    assert secret not in repr(logs)


async def test_server_errors_are_retried_with_the_same_idempotency_key(
    fake_vendor: VendorFactory,
    remote_handler: HandlerFactory,
    start_worker: WorkerFactory,
    queue: JobQueue,
    storage: LocalFileStorage,
) -> None:
    """Two 500s then success: transient, retried by the engine (attempt 3 completes), each
    create under the same key, and one prediction in all."""
    vendor = await fake_vendor(script=[("500",), ("slow", 0.3)], duration_s=0.2)
    job = await _run(vendor, remote_handler, start_worker, queue, storage)
    assert job.status == "completed", job.error
    assert job.attempts == 3
    creates = [key for kind, key in vendor.requests if kind == "create"]
    assert len(creates) == 3
    assert len(set(creates)) == 1
    assert vendor.created == 1


async def test_a_vendor_that_does_not_answer_in_time_is_retried(
    fake_vendor: VendorFactory,
    remote_handler: HandlerFactory,
    start_worker: WorkerFactory,
    queue: JobQueue,
    storage: LocalFileStorage,
) -> None:
    """A create unanswered within request.timeout_s is UPSTREAM_TIMEOUT (transient): the next
    attempt, under the same idempotency key, completes."""
    vendor = await fake_vendor(script=[("timeout", 3.0)], duration_s=0.2)
    job = await _run(vendor, remote_handler, start_worker, queue, storage,
                     request={"timeout_s": 0.5})  # fmt: skip
    assert job.status == "completed", job.error
    assert job.attempts == 2
    assert vendor.created == 1


async def test_a_short_slow_down_is_waited_out_in_the_worker(
    fake_vendor: VendorFactory,
    remote_handler: HandlerFactory,
    start_worker: WorkerFactory,
    queue: JobQueue,
    storage: LocalFileStorage,
) -> None:
    """429 with Retry-After 0.6 s (under wait.inline_max_s): the job waits in its run and
    completes with attempts 1 and no deferral; the create came again after the pause."""
    vendor = await fake_vendor(script=[("429", 0.6)], duration_s=0.2)
    started = time.monotonic()
    job = await _run(vendor, remote_handler, start_worker, queue, storage)
    assert job.status == "completed", job.error
    assert (job.attempts, job.deferrals) == (1, 0)
    assert vendor.answers[429] == 1
    assert time.monotonic() - started >= 0.6


async def test_a_long_slow_down_defers_the_job_without_an_attempt(
    fake_vendor: VendorFactory,
    remote_handler: HandlerFactory,
    start_worker: WorkerFactory,
    queue: JobQueue,
    storage: LocalFileStorage,
) -> None:
    """Retry-After 2.5 s (over inline_max_s 1): the job goes back on the delayed set until
    the pause ends, deferred, and completes with attempts 1 -- the vendor said later, the
    job did nothing wrong."""
    vendor = await fake_vendor(script=[("429", 2.5)], duration_s=0.2)
    job = await _run(vendor, remote_handler, start_worker, queue, storage, wait={"inline_max_s": 1})
    assert job.status == "completed", job.error
    assert (job.attempts, job.deliveries, job.deferrals) == (1, 1, 1)
    assert vendor.created == 1


async def test_an_open_circuit_fails_the_job_after_the_bounded_wait(
    fake_vendor: VendorFactory,
    remote_handler: HandlerFactory,
    start_worker: WorkerFactory,
    queue: JobQueue,
    storage: LocalFileStorage,
) -> None:
    """A vendor that keeps failing: three 5xx open its circuit; the job then waits for it
    (probes fail too) and, past breaker.max_wait_s, fails UPSTREAM_UNAVAILABLE, not retryable
    and dead-lettered (a redrive policy brings it back once the circuit is closed)."""
    vendor = await fake_vendor(script=[("500",)] * 50)
    job = await _run(
        vendor,
        remote_handler,
        start_worker,
        queue,
        storage,
        worker={"max_attempts": 20},
        breaker={"failures": 3, "open_s": 0.3, "open_cap_s": 0.6, "max_wait_s": 1.5},
    )
    assert job.status == "failed"
    assert job.error is not None
    assert (job.error.code, job.error.retryable) == ("UPSTREAM_UNAVAILABLE", False)
    assert job.stage == "dead_lettered"
    assert vendor.created == 0
    # the redriver's default policy brings it back once the vendor's circuit is closed
    book = DeadLetterBook(queue)
    [letter] = await book.page(DeadLetterKind.JOBS, partition_of(job.id), "", 10)
    later = letter.at_ms + 600_000

    async def verdict() -> Verdict:
        [subject] = await book.subjects(DeadLetterKind.JOBS, [letter])
        return decide(default_policies(), subject.view(), later).verdict

    assert await verdict() is Verdict.WAIT
    lane = VendorLane(queue.redis, vendor_config(vendor.url))
    await lane.report("success", "probe", new_permit_id())
    assert await verdict() is Verdict.REDRIVE


async def test_a_cancel_reaches_the_vendor(
    fake_vendor: VendorFactory,
    remote_handler: HandlerFactory,
    start_worker: WorkerFactory,
    queue: JobQueue,
    storage: LocalFileStorage,
) -> None:
    """Canceling a job whose prediction runs forwards the cancel to the vendor's endpoint;
    the job ends canceled, and its slot is free again."""
    vendor = await fake_vendor(duration_s=30)
    config = vendor_config(vendor.url)
    handler = await remote_handler(config)
    await start_worker(handler)
    result = await queue.enqueue(await stored_spec(storage, sample_png(4)))

    async def created() -> bool:
        return vendor.created == 1

    await eventually(created, timeout=15)
    assert await queue.cancel(result.job_id) in {"cancel_requested", "canceled"}
    job = await wait_for_status(queue, result.job_id, {"canceled"}, timeout=15)
    assert job.status == "canceled"
    assert vendor.canceled == ["p00001"]
    assert await queue.redis.zcard(f"splatq:{{vendor:{config.name}}}:slots") == 0


async def test_a_mesh_output_is_refused(
    fake_vendor: VendorFactory,
    remote_handler: HandlerFactory,
    start_worker: WorkerFactory,
    queue: JobQueue,
    storage: LocalFileStorage,
) -> None:
    """A vendor returning a .glb (a mesh, not Gaussians) fails the job with a stable code."""
    vendor = await fake_vendor(output="glb", duration_s=0.1)
    job = await _run(vendor, remote_handler, start_worker, queue, storage)
    assert job.error is not None
    assert (job.error.code, job.error.retryable) == ("UPSTREAM_OUTPUT_UNSUPPORTED", False)


async def test_the_vendors_webhook_ends_the_wait_through_the_gateway(
    fake_vendor: VendorFactory,
    remote_handler: HandlerFactory,
    start_worker: WorkerFactory,
    make_client: Any,
    queue: JobQueue,
    storage: LocalFileStorage,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With webhook.enabled the vendor calls the gateway's /v1/vendor-webhooks/<vendor>; the
    signed call puts the finished prediction in the lane's inbox and the waiting worker takes
    it from there, without polling the vendor again (one GET, the first look). A forged call
    is refused 401 and changes nothing."""
    secret = generate_secret()
    monkeypatch.setenv("SPLATQ_TEST_VENDOR_WEBHOOK_SECRET", secret)
    vendor = await fake_vendor(duration_s=1.0, webhook_secret=secret)
    hook = {"enabled": True, "public_url": "http://gateway.test", "fallback_poll_s": 60,
            "secret_env": "SPLATQ_TEST_VENDOR_WEBHOOK_SECRET",
            "extra": {"webhook_events_filter": ["completed"]}}  # fmt: skip
    path = write_config(tmp_path / "vendor.toml", vendor.url, webhook=hook)
    gateway = await make_client(model="remote", remote_config=str(path))
    forged = await gateway.post("/v1/vendor-webhooks/fake", json={"id": "p00001",
                                "status": "succeeded"}, headers={"webhook-id": "m1",
                                "webhook-timestamp": str(int(time.time())),
                                "webhook-signature": "v1,AAAA"})  # fmt: skip
    assert forged.status == 401
    public = str(gateway.make_url("")).rstrip("/")
    config = vendor_config(vendor.url, webhook={**hook, "public_url": public})
    handler = await remote_handler(config)
    await start_worker(handler)
    result = await queue.enqueue(await stored_spec(storage, sample_png(5)))
    job = await wait_for_status(queue, result.job_id, {"completed", "failed"}, timeout=20)
    assert job.status == "completed", job.error
    assert [r for r in vendor.requests if r[0] == "get"] == [("get", "p00001")]
    assert vendor.bodies[0]["webhook"] == f"{public}/v1/vendor-webhooks/fake"
    assert vendor.bodies[0]["webhook_events_filter"] == ["completed"]
    assert (await gateway.post("/v1/vendor-webhooks/other", json={})).status == 404


async def test_the_staged_pipeline_reconstructs_through_the_vendor(
    fake_vendor: VendorFactory,
    start_stages: Any,
    settings: Settings,
    storage: LocalFileStorage,
    queue: JobQueue,
    vendor_token: str,
) -> None:
    """`--stages all` with the remote model: the reconstruct stage calls the vendor; export,
    render and publish treat its Gaussians as a local model's; the reconstruct unit is metered
    with the vendor's reported time."""
    from splatq.services.gpu_worker.stages import StageHandlers  # noqa: PLC0415

    vendor = await fake_vendor(duration_s=0.2)
    config = vendor_config(vendor.url)
    s = settings.with_overrides(device="cpu", model="remote")
    model = RemoteModel(s, config, Credential(config.auth), storage, CollectorRegistry())
    stages = StageHandlers(GpuJobHandler(s, model, storage, GpuMetrics.create(CollectorRegistry())))
    await stages.startup(tuple(PipelineStage))
    try:
        await start_stages(stages, "all")
        result = await queue.enqueue(await stored_spec(storage, sample_png(6)))
        job = await wait_for_status(queue, result.job_id, {"completed", "failed"}, timeout=40)
    finally:
        await stages.shutdown()
    assert job.status == "completed", job.error
    assert vendor.created == 1
    reconstruct = [ms for unit, ms in job.metered.items() if unit.startswith("reconstruct.")]
    assert reconstruct == [1250]
    assert job.model == "remote:fake:trellis@abc"
