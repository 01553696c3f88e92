"""The sections the settings are declared in (the README's sub-tables), and a unit."""

from __future__ import annotations

from splatq.shared.settings.declare import Group

STACK = Group("Redis, storage, the local stack and the client commands")
GATEWAY = Group("Gateway: limits and admission")
TENANTS = Group("Tenants, API keys, admin API and GPU quotas")
STREAMS = Group("Streams, partitions and fair scheduling")
LEASES = Group("Leases, retries and retention")
WORKERS = Group("Workers and the staged pipeline")
MODEL = Group("GPU worker: device, model, foreground and batching")
WEBHOOKS = Group("Webhooks (the dispatcher; docs/webhooks.md)")
MAINTENANCE = Group("The redriver and scheduled maintenance")
OBSERVABILITY = Group("Logs, metrics and tracing")

DAY_S = 24 * 3600
