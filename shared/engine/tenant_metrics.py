"""Per-tenant metrics with bounded cardinality.

A label per tenant is unbounded (every tenant that ever submitted would stay a series for
ever), so tenants appear as labels in two bounded ways only:
- gauges of the fair queues (jobs waiting, jobs running under a cap): the top N tenants of
  each stream by jobs waiting, re-ranked at every sample, plus `tenant="other"` for the sum of
  the rest; series of tenants that left the top N are removed;
- counters of finished jobs: only the tenants named in SPLATQ_METRICS_TENANTS (opt-in, e.g.
  the largest customers) get their own label, every other tenant counts as `other`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from splatq.shared.engine.keys import STREAMS, StreamName
from splatq.shared.engine.queue import JobQueue

OTHER = "other"


def top_tenants(counts: Mapping[str, int], n: int) -> dict[str, int]:
    """The `n` largest counts by tenant (ties by name), and `other` for the sum of the rest
    (present, possibly 0, whenever any tenant was left out)."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    top = dict(ranked[:n])
    if len(ranked) > n:
        top[OTHER] = sum(v for _, v in ranked[n:])
    return top


@dataclass(frozen=True, slots=True)
class TenantMetrics:
    waiting: Gauge
    running_capped: Gauge
    jobs: Counter
    top_n: int
    named: frozenset[str]

    @classmethod
    def create(
        cls,
        top_n: int = 10,
        named: Iterable[str] = (),
        registry: CollectorRegistry = REGISTRY,
    ) -> TenantMetrics:
        labels = ["stream", "tenant"]
        return cls(
            waiting=Gauge(
                "splatq_tenant_waiting_jobs",
                "Jobs waiting in a tenant's fair queue (top tenants; the rest as 'other')",
                labels,
                registry=registry,
            ),
            running_capped=Gauge(
                "splatq_tenant_capped_running_jobs",
                "Jobs of a capped tenant fed to workers and unfinished (top tenants)",
                labels,
                registry=registry,
            ),
            jobs=Counter(
                "splatq_tenant_jobs_total",
                "Finished jobs by tenant (SPLATQ_METRICS_TENANTS; others as 'other') and status",
                ["tenant", "status"],
                registry=registry,
            ),
            top_n=top_n,
            named=frozenset(named),
        )

    def tenant_label(self, tenant: str) -> str:
        return tenant if tenant in self.named else OTHER

    def finished(self, tenant: str, status: str) -> None:
        self.jobs.labels(self.tenant_label(tenant), status).inc()

    def record(self, backlogs: Mapping[StreamName, Mapping[str, tuple[int, int]]]) -> None:
        """Replace the gauges with one sample (summed over partitions by the caller)."""
        self.waiting.clear()
        self.running_capped.clear()
        for stream, per_tenant in backlogs.items():
            waiting = top_tenants({t: w for t, (w, _) in per_tenant.items()}, self.top_n)
            running = top_tenants({t: r for t, (_, r) in per_tenant.items() if r}, self.top_n)
            for tenant, value in waiting.items():
                self.waiting.labels(stream.value, tenant).set(value)
            for tenant, value in running.items():
                self.running_capped.labels(stream.value, tenant).set(value)

    async def sample(self, queue: JobQueue, partitions: Iterable[int]) -> None:
        totals: dict[StreamName, dict[str, tuple[int, int]]] = {s: {} for s in STREAMS}
        for p in partitions:
            for stream in STREAMS:
                for tenant, (w, r) in (await queue.tenant_backlogs(p, stream)).items():
                    w0, r0 = totals[stream].get(tenant, (0, 0))
                    totals[stream][tenant] = (w0 + w, r0 + r)
        self.record(totals)
