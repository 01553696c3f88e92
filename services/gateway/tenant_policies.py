"""Each tenant's fair-scheduling terms as the gateway admits its jobs: the tenant's own
settings in Redis (`splatq tenants`, the admin API) over the deployment's defaults
(SPLATQ_TENANT_WEIGHTS, SPLATQ_TENANT_MAX_RUNNING_*), cached per process for the same few
seconds as API keys, so a change reaches every gateway within SPLATQ_API_KEY_CACHE_S."""

from __future__ import annotations

from aiohttp import web

from splatq.services.gateway.ttl_cache import TtlCache
from splatq.shared.engine.fairness import FairScheduling, TenantPolicy
from splatq.shared.engine.keys import StreamName
from splatq.shared.tenants.store import DEFAULT_WEIGHT, TenantScheduling, TenantStore


def merge(
    defaults: FairScheduling, own: TenantScheduling, tenant: str, stream: StreamName
) -> TenantPolicy:
    """The tenant's own weight and cap where it has them (a weight other than the default 1,
    a cap other than 0), else the deployment's."""
    base = defaults.policy(tenant, stream)
    weight = own.weight if own.weight != DEFAULT_WEIGHT else base.weight
    cap = own.running_cap(stream) or base.max_running
    return TenantPolicy(weight=min(weight, 1000), max_running=cap)


class TenantPolicies:
    """`await policies.get(tenant, stream)`: one Redis read per tenant per cache period."""

    def __init__(
        self, store: TenantStore, defaults: FairScheduling, ttl_s: float, size: int
    ) -> None:
        self.store = store
        self.defaults = defaults
        self._cache: TtlCache[str, TenantScheduling] = TtlCache(ttl_s, size)

    async def get(self, tenant: str, stream: StreamName) -> TenantPolicy:
        own = await self._cache.get(tenant, lambda: self.store.scheduling(tenant))
        return merge(self.defaults, own, tenant, stream)


TENANT_POLICIES = web.AppKey("tenant_policies", TenantPolicies)
