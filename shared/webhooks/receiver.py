"""Receiving splatq webhooks: verify the signature, then act once per `webhook-id` (Redis).

For users' endpoints, our tests and examples; the sending side is the webhook dispatcher.
A delivery is marked seen before it is processed: answer fast, and make `on_event` safe to
fail (it is not retried by the sender once the delivery was acknowledged).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson
import structlog
from aiohttp import web
from redis.asyncio import Redis

from splatq.shared.webhooks.signing import (
    DEFAULT_TOLERANCE_S,
    SignatureError,
    parse_secret,
    read_headers,
    verify,
)

log = structlog.get_logger("splatq.webhook_receiver")

INVALID_PAYLOAD: Final = "invalid_payload"
PROBLEM_TYPE_BASE: Final = "https://splatq.dev/problems/"
# A captured delivery stays replayable while its timestamp is within tolerance (either side of
# now), so remembering ids for less than that would let a replay through.
MIN_DEDUPE_TTL_S: Final = 2 * DEFAULT_TOLERANCE_S


class InvalidPayload(ValueError):
    """A correctly signed delivery whose body is not JSON; its id is not marked seen."""

    code: Final = INVALID_PAYLOAD


@dataclass(frozen=True, slots=True)
class Delivery:
    """One verified, first-seen delivery: `event` is the payload's `event` field ('' if none)."""

    id: str
    timestamp: int
    event: str
    payload: Any


class WebhookReceiver:
    """Verifies deliveries against any of `secrets` and lets each `webhook-id` through once."""

    def __init__(
        self,
        secrets: Sequence[str],
        redis: Redis,
        # Longer than the dispatcher's retry horizon (~27 h by default), so a retry that
        # follows a lost 2xx is still recognised.
        dedupe_ttl_s: int = 3 * 24 * 3600,
        key_prefix: str = "splatq:webhook-seen:",
    ) -> None:
        if isinstance(secrets, str):
            raise TypeError("secrets is a sequence of secrets, not one string")
        if not secrets:
            raise ValueError("at least one webhook secret is needed")
        for secret in secrets:
            parse_secret(secret)  # a misconfigured secret fails here, not on the first request
        if dedupe_ttl_s < MIN_DEDUPE_TTL_S:
            raise ValueError(f"dedupe_ttl_s must be at least {MIN_DEDUPE_TTL_S}s")
        self.secrets = tuple(secrets)
        self.redis = redis
        self.dedupe_ttl_s = dedupe_ttl_s
        self.key_prefix = key_prefix

    def seen_key(self, msg_id: str) -> str:
        return self.key_prefix + msg_id

    async def accept(self, headers: Mapping[str, str], body: bytes) -> Delivery | None:
        """The delivery if verified and first seen; None for a duplicate of an accepted one.

        Raises SignatureError (bad signature, stale timestamp) or InvalidPayload (not JSON);
        neither marks the id seen, so a forged or broken request cannot block the real one.
        """
        verify(self.secrets, headers, body)
        read = read_headers(headers)
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise InvalidPayload(f"the body is not JSON: {exc}") from exc
        event = payload.get("event") if isinstance(payload, dict) else None
        first = await self.redis.set(self.seen_key(read.msg_id), 1, nx=True, ex=self.dedupe_ttl_s)
        if not first:
            return None
        return Delivery(
            id=read.msg_id,
            timestamp=read.timestamp,
            event=event if isinstance(event, str) else "",
            payload=payload,
        )


OnEvent = Callable[[Delivery], Awaitable[None]]


def _problem(status: int, title: str, code: str, detail: str) -> web.Response:
    body = {
        "type": PROBLEM_TYPE_BASE + code,
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    }
    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/problem+json"
    )


def _ok(status: str) -> web.Response:
    return web.Response(body=orjson.dumps({"status": status}), content_type="application/json")


class AiohttpWebhookHandler:
    """Route POSTs to `.handle`: 200 at once, `on_event` in a background task per delivery.

    Answers 401 (problem+json with the SignatureError code) on a bad signature, 400 on a
    signed body that is not JSON, and 200 for accepted and duplicate deliveries alike.
    Keeps the running tasks (`tasks`) so they are not garbage-collected; `drain` on shutdown.
    """

    def __init__(self, receiver: WebhookReceiver, on_event: OnEvent) -> None:
        self.receiver = receiver
        self.on_event = on_event
        self.tasks: set[asyncio.Task[None]] = set()  # strong references until each task ends

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()  # the raw bytes: signatures are over exactly these
        try:
            delivery = await self.receiver.accept(request.headers, body)
        except SignatureError as exc:
            return _problem(401, "Unauthorized", exc.code, exc.detail or exc.code)
        except InvalidPayload as exc:
            return _problem(400, "Bad Request", exc.code, str(exc))
        if delivery is None:
            return _ok("duplicate")
        task = asyncio.create_task(self._run(delivery), name=f"webhook:{delivery.id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return _ok("accepted")

    async def _run(self, delivery: Delivery) -> None:
        try:
            await self.on_event(delivery)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "webhook.on_event_failed", webhook_id=delivery.id, webhook_event=delivery.event
            )

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait for the running `on_event` tasks (on shutdown); cancel those left at timeout."""
        pending = set(self.tasks)
        if not pending:
            return
        _, still_running = await asyncio.wait(pending, timeout=timeout_s)
        for task in still_running:
            task.cancel()
        if still_running:
            await asyncio.wait(still_running)


Handler = Callable[[web.Request], Awaitable[web.Response]]


def aiohttp_handler(receiver: WebhookReceiver, on_event: OnEvent) -> Handler:
    """A handler to route POSTs to: `app.router.add_post("/webhooks", aiohttp_handler(...))`.

    To wait for running `on_event` tasks on shutdown, build `AiohttpWebhookHandler` instead,
    route to its `.handle` and call its `drain()`.
    """
    return AiohttpWebhookHandler(receiver, on_event).handle
