"""A span per webhook attempt, in the trace of the job the event belongs to, and the
attempt's `traceparent` on the request the receiver gets."""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from splatq.services.webhook_dispatcher.dispatcher import Dispatcher
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.queue import JobQueue
from splatq.shared.settings import Settings
from splatq.shared.testing import WorkerFactory, eventually, wait_for_status
from splatq.shared.webhooks.store import WebhookStore
from tests.tracing_fixtures import spans  # noqa: F401 - the fixture
from tests.webhook_dispatcher.conftest import ReceiverFactory, dispatcher_settings

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
COMPLETED = "3d_reconstruction.completed"


async def test_each_attempt_is_a_span_in_the_jobs_trace(
    spans: InMemorySpanExporter,  # noqa: F811 - the imported fixture
    queue: JobQueue,
    settings: Settings,
    start_worker: WorkerFactory,
    start_dispatcher: Callable[[Settings], Dispatcher],
    receivers: ReceiverFactory,
) -> None:
    r = await receivers((503, {}, 0.0))  # one retry, then 200
    spec = JobSpec(
        tenant="acme",
        quality="preview",
        webhook_url=r.url,
        webhook_events=(COMPLETED,),
        trace_id=TRACE_ID,
    )
    job_id = (await queue.enqueue(spec)).job_id
    await start_worker()
    await wait_for_status(queue, job_id, {"completed"})
    start_dispatcher(dispatcher_settings(settings))
    store = WebhookStore(queue)

    async def delivered() -> bool:
        log = await store.deliveries(job_id)
        return bool(log) and log[-1]["outcome"] == "delivered"

    await eventually(delivered, timeout=15)
    attempts = [s for s in spans.get_finished_spans() if s.name == "webhook.attempt"]
    assert len(attempts) == 2
    assert len(r.calls) == 2
    for span, (_, headers, _) in zip(attempts, r.calls, strict=True):
        assert span.kind is SpanKind.CLIENT
        assert f"{span.context.trace_id:032x}" == TRACE_ID
        assert span.attributes is not None
        assert span.attributes["splatq.job_id"] == job_id
        assert span.attributes["splatq.event_type"] == COMPLETED
        assert headers["traceparent"] == f"00-{TRACE_ID}-{span.context.span_id:016x}-01"
    assert [s.attributes["splatq.attempt"] for s in attempts if s.attributes] == [1, 2]
