"""OpenTelemetry spans (the `otel` extra), exported to the SDK's in-memory exporter: a request's
span is the child of the caller's `traceparent`, and the job it creates runs in a span of the
same trace. Off by default: nothing is wrapped."""

from __future__ import annotations

from aiohttp import FormData
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from splatq.shared import tracing
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.runner import traced
from splatq.shared.testing import WorkerFactory, wait_for_status
from tests.gateway import corpus
from tests.gateway.conftest import AUTH_A, ClientFactory
from tests.handlers import BehaviourHandler
from tests.tracing_fixtures import spans  # noqa: F401 - the fixture

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def test_tracing_is_off_and_wraps_nothing_by_default() -> None:
    assert not tracing.enabled()
    handler = BehaviourHandler()
    assert traced(handler) is handler
    with tracing.span("x", TRACE_ID) as span:
        assert span is None
    assert tracing.traceparent_headers() == {}


async def test_a_request_and_its_job_share_the_callers_trace(
    spans: InMemorySpanExporter,  # noqa: F811 - the imported fixture
    make_client: ClientFactory,
    start_worker: WorkerFactory,
    queue: JobQueue,
) -> None:
    client = await make_client()
    data = FormData()
    data.add_field("image", corpus.valid_png(32, 24), filename="in.png", content_type="image/png")
    headers = {**AUTH_A, "traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"}
    resp = await client.post("/v1/jobs", data=data, headers=headers)
    assert resp.status == 202, await resp.text()
    job_id = (await resp.json())["id"]

    await start_worker(traced(BehaviourHandler()))
    job = await wait_for_status(queue, job_id, {"completed"})
    assert job.trace_id == TRACE_ID

    finished = spans.get_finished_spans()
    request = [s for s in finished if s.name == "POST /v1/jobs"]
    assert len(request) == 1, [s.name for s in finished]
    assert request[0].kind is SpanKind.SERVER
    assert request[0].context.trace_id == int(TRACE_ID, 16)
    assert request[0].parent is not None
    assert request[0].parent.span_id == int(CALLER_SPAN, 16)
    assert request[0].attributes is not None
    assert request[0].attributes["http.response.status_code"] == 202
    runs = [s for s in finished if s.name == "job.run"]
    assert len(runs) == 1, [s.name for s in finished]
    assert runs[0].context.trace_id == int(TRACE_ID, 16)
    assert runs[0].parent is None  # a root span of the job's trace
    assert runs[0].attributes is not None
    assert runs[0].attributes["splatq.job_id"] == job_id
    assert runs[0].attributes["splatq.tenant"] == "acme"


async def test_a_request_without_traceparent_gets_the_trace_id_it_answers(
    spans: InMemorySpanExporter,  # noqa: F811 - the imported fixture
    make_client: ClientFactory,
) -> None:
    client = await make_client()
    resp = await client.get("/v1/jobs/j_0000000000000000000000000000", headers=AUTH_A)
    assert resp.status == 404
    (span,) = [s for s in spans.get_finished_spans() if s.name.startswith("GET ")]
    assert span.parent is None
    assert f"{span.context.trace_id:032x}" == resp.headers["X-Trace-ID"]
    assert span.attributes is not None
    assert span.attributes["http.response.status_code"] == 404
