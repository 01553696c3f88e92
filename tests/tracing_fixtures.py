"""The `spans` fixture: tracing on, exporting to the OpenTelemetry SDK's in-memory exporter
(import it into a test module to use it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from splatq.shared import tracing


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.configure_tracing("off", "test", exporter=exporter)
    yield exporter
    tracing.shutdown_tracing()
