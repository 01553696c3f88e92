"""Prometheus metrics of the gateway: requests by route and status, latency, submissions by
outcome. Definitions only."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram


@dataclass(frozen=True, slots=True)
class GatewayMetrics:
    requests: Counter
    latency: Histogram
    submissions: Counter

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
                "splatq_http_request_seconds",
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
        )
