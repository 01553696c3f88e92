"""Prometheus metrics of the gateway: requests by route and status, latency, submissions by
outcome. Definitions, and the bounding of label values that come from requests."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

# The methods a label may name; anything else a client sends is counted as `other`, so no
# request can create a new time series.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_label(method: str) -> str:
    return method if method in KNOWN_METHODS else "other"


@dataclass(frozen=True, slots=True)
class GatewayMetrics:
    requests: Counter
    latency: Histogram
    submissions: Counter
    streams_refused: Counter
    cache_lookups: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry = REGISTRY) -> GatewayMetrics:
        return cls(
            requests=Counter(
                "splatq_http_requests_total",
                "HTTP requests",
                ["route", "method", "status"],
                registry=registry,
            ),
            latency=Histogram(
                "splatq_http_request_duration_seconds",
                "HTTP request latency",
                ["route"],
                registry=registry,
                buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            ),
            submissions=Counter(
                "splatq_submissions_total",
                "Job submissions by outcome (created, duplicate, cached, rejected codes)",
                ["outcome"],
                registry=registry,
            ),
            streams_refused=Counter(
                "splatq_sse_streams_refused_total",
                "Event streams refused by the per-tenant or per-process cap (429)",
                registry=registry,
            ),
            cache_lookups=Counter(
                "splatq_cache_lookups_total",
                "Result cache lookups by result (hit, stale, miss)",
                ["result"],
                registry=registry,
            ),
        )
