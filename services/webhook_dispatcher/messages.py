"""Which deliveries an outbox event makes (pure): to the job's `webhook_url` when its filter
wants the event, and to every endpoint of the tenant subscribed to it (a test event: to its
one endpoint); and the keys per-target concurrency and per-tenant shares count by."""

from __future__ import annotations

import functools
from urllib.parse import urlsplit

from splatq.services.webhook_dispatcher.policy import endpoint_wants, should_deliver
from splatq.shared.webhooks.store import Message


def messages_of(
    fields: dict[str, str], url: str, events: str, endpoints: dict[str, str], created_ms: str
) -> list[dict[str, str]]:
    """The delivery messages of one outbox event: to the job's webhook_url if its filter
    wants the event, and to every endpoint of the tenant subscribed to it; a test event
    (an `endpoint` field) to that endpoint alone, if it still exists."""
    event_type = fields.get("type", "")
    event_id = fields.get("event_id", "")
    if not event_type or not event_id:
        return []
    common = {
        "event_id": event_id,
        "event_type": event_type,
        "job_id": fields.get("job_id", ""),
        "tenant": fields.get("tenant", ""),
        "payload": fields.get("payload", "{}"),
        "created_ms": created_ms,
    }

    def to_endpoint(endpoint_id: str) -> dict[str, str]:
        return {**common, "id": f"{event_id}:{endpoint_id}", "url": "", "target": endpoint_id}

    only = fields.get("endpoint", "")
    if only:
        return [to_endpoint(only)] if only in endpoints else []
    messages: list[dict[str, str]] = []
    if url and should_deliver(event_type, tuple(e for e in events.split(",") if e)):
        messages.append({**common, "id": f"{event_id}:job", "url": url, "target": "job"})
    for endpoint_id, wanted in sorted(endpoints.items()):
        if endpoint_wants(event_type, tuple(e for e in wanted.split(",") if e)):
            messages.append(to_endpoint(endpoint_id))
    return messages


def target_key(m: Message) -> str:
    """What per-target concurrency counts: the endpoint, or the host of a job's webhook_url."""
    if m.endpoint_id:
        return m.endpoint_id
    return _url_key(m.url)


@functools.lru_cache(maxsize=4096)
def _url_key(url: str) -> str:
    # Remembered: asked several times per attempt (shares, latency), of a few URLs.
    return "url:" + (urlsplit(url).netloc or url)


def tenant_key(m: Message) -> str:
    """What per-tenant shares count (kept apart from target keys in the shared tables)."""
    return "tenant:" + m.tenant
