"""Per-tenant metrics stay bounded: the top N tenants by waiting jobs plus 'other', re-ranked
at every sample; finished-job counters only for opt-in tenants."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from splatq.shared.engine.fairness import TenantPolicy
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.queue import JobQueue
from splatq.shared.engine.tenant_metrics import OTHER, TenantMetrics, top_tenants


def test_top_tenants_keeps_n_and_sums_the_rest() -> None:
    counts = {"a": 5, "b": 9, "c": 1, "d": 5}
    assert top_tenants(counts, 2) == {"b": 9, "a": 5, OTHER: 6}
    assert top_tenants(counts, 10) == counts
    assert top_tenants({}, 3) == {}


def _series(registry: CollectorRegistry, name: str) -> dict[tuple[str, ...], float]:
    out = {}
    for metric in registry.collect():
        for s in metric.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


async def test_sampled_gauges_follow_the_fair_queues_and_drop_departed_tenants(
    queue: JobQueue,
) -> None:
    registry = CollectorRegistry()
    metrics = TenantMetrics.create(top_n=2, named={"big"}, registry=registry)
    for tenant, n in (("big", 6), ("mid", 4), ("small", 3), ("tiny", 3)):
        for i in range(n):
            await queue.enqueue(
                JobSpec(tenant=tenant, quality="full", metadata={"n": i}),
                policy=TenantPolicy(max_running=1) if tenant == "mid" else None,
            )
    await queue.take(0, {}, 4, "w1")
    await metrics.sample(queue, [0])
    waiting = {
        dict(k)["tenant"]: v
        for k, v in _series(registry, "splatq_tenant_waiting_jobs").items()
        if dict(k)["stream"] == StreamName.SYNTHESIS.value
    }
    assert set(waiting) == {"big", "mid", OTHER}
    assert sum(waiting.values()) == (await queue.waiting(0, StreamName.SYNTHESIS)).waiting
    running = _series(registry, "splatq_tenant_capped_running_jobs")
    assert {dict(k)["tenant"]: v for k, v in running.items()} == {"mid": 1.0}
    # everything takeable taken: the tenants leave the fair queues and their series go with
    # them; only the capped tenant still waits (its one running job never finished here)
    for _ in range(20):
        await queue.take(0, {}, 4, "w2")
    await metrics.sample(queue, [0])
    assert _series(registry, "splatq_tenant_waiting_jobs") == {
        (("stream", "synthesis"), ("tenant", "mid")): 3.0
    }
    metrics.finished("big", "completed")
    metrics.finished("mid", "completed")
    jobs = _series(registry, "splatq_tenant_jobs_total")
    assert {dict(k)["tenant"] for k in jobs} == {"big", OTHER}
