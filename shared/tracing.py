"""OpenTelemetry traces, an optional extra (`pip install 'splatq[otel]'`, SPLATQ_TRACING).

A span per HTTP request (gateway), per job run (worker) and per webhook attempt (dispatcher),
all in the trace splatq already carries: a job's `trace_id` is the W3C trace id of the request
that created it (the caller's `traceparent`, else a new one), so a request's span, the job's
runs and its webhook attempts share one trace id. A request with a `traceparent` is the child
of the caller's span; a job run and a webhook attempt are root spans of that trace (the job
record keeps the trace id, not a span id).

Disabled (the default, or the extra not installed) nothing here is imported from
OpenTelemetry and the call sites do not wrap anything: `enabled()` is a global read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

# The splatq trace id the next root span takes (read by the id generator below).
_root_trace_id: ContextVar[int] = ContextVar("splatq_root_trace_id", default=0)
_provider: TracerProvider | None = None
_tracer: Tracer | None = None

AttributeValue = str | int | float | bool


class TracingUnavailable(RuntimeError):
    """SPLATQ_TRACING asks for traces but the `otel` extra is not installed."""


def enabled() -> bool:
    return _tracer is not None


def configure_tracing(mode: str, service: str, exporter: SpanExporter | None = None) -> None:
    """Set up this process's tracer: `mode` is SPLATQ_TRACING (off, otlp, console); an
    `exporter` given (tests: the SDK's InMemorySpanExporter) is used synchronously."""
    global _provider, _tracer  # noqa: PLW0603 - one tracer per process, set at startup
    shutdown_tracing()
    if mode == "off" and exporter is None:
        return
    try:
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
        )
    except ImportError as exc:
        raise TracingUnavailable(
            f"SPLATQ_TRACING={mode} needs the otel extra: pip install 'splatq[otel]' ({exc})"
        ) from None
    provider = TracerProvider(
        resource=Resource.create({"service.name": f"splatq-{service}" if service else "splatq"}),
        id_generator=_joined_id_generator(),
    )
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif mode == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
                OTLPSpanExporter,
            )
        except ImportError as exc:
            raise TracingUnavailable(
                f"SPLATQ_TRACING=otlp needs the otel extra: pip install 'splatq[otel]' ({exc})"
            ) from None
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _provider = provider
    _tracer = provider.get_tracer("splatq")


def shutdown_tracing() -> None:
    """Flush and drop the tracer (at exit; tests reconfigure)."""
    global _provider, _tracer  # noqa: PLW0603
    if _provider is not None:
        _provider.shutdown()
    _provider = _tracer = None


def _joined_id_generator() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator  # noqa: PLC0415

    class JoinedIds(RandomIdGenerator):
        """Root spans take splatq's trace id when one is set (random ids otherwise)."""

        def generate_trace_id(self) -> int:
            return _root_trace_id.get() or super().generate_trace_id()

        def is_trace_id_random(self) -> bool:
            # A joined id came from a caller or a job record: not ours to vouch for (W3C's
            # `random` trace flag stays unset).
            return not _root_trace_id.get()

    return JoinedIds()


def _trace_int(trace_id: str) -> int:
    try:
        return int(trace_id, 16) if len(trace_id) == 32 else 0
    except ValueError:
        return 0


@contextlib.contextmanager
def span(
    name: str,
    trace_id: str,
    *,
    kind: str = "internal",
    carrier: Mapping[str, str] | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> Iterator[Span | None]:
    """A current span in trace `trace_id` (32 hex digits), the child of the span in
    `carrier`'s `traceparent` when that names the same trace; yields None when disabled.
    An exception leaving the block is recorded on the span and re-raised."""
    tracer = _tracer
    if tracer is None:
        yield None
        return
    from opentelemetry import trace  # noqa: PLC0415
    from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
        TraceContextTextMapPropagator,
    )

    wanted = _trace_int(trace_id)
    context = None
    if carrier is not None and "traceparent" in carrier:
        extracted = TraceContextTextMapPropagator().extract(carrier=carrier)
        parent = trace.get_current_span(extracted).get_span_context()
        if parent.is_valid and parent.trace_id == wanted:
            context = extracted
    if context is None:
        context = trace.set_span_in_context(trace.INVALID_SPAN)  # a root span, not a child
    token = _root_trace_id.set(wanted)
    try:
        started = tracer.start_span(
            name, context=context, kind=trace.SpanKind[kind.upper()], attributes=attributes
        )
    finally:
        _root_trace_id.reset(token)
    with trace.use_span(started, end_on_exit=True):
        yield started


def traceparent_headers() -> dict[str, str]:
    """`traceparent` of the current span, for an outgoing request ({} when disabled)."""
    if _tracer is None:
        return {}
    from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
        TraceContextTextMapPropagator,
    )

    headers: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(headers)
    return headers
