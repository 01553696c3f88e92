"""A runnable splatq webhook receiver: verifies each delivery, dedupes it in Redis, prints it.

    python examples/webhook_receiver.py --secret whsec_... --port 9000 \\
        --redis-url redis://localhost:6379/0

Give it the secret the webhook dispatcher signs with (`--secret` again for each secret while
one is being rotated; or SPLATQ_WEBHOOK_SECRET, which keeps it out of `ps`), then submit jobs
with `splatq submit IMAGE --webhook http://HOST:9000/webhooks`. Each event is printed once as
one JSON line, however often it is redelivered; bad signatures get 401 with a problem+json code.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence

import orjson
from aiohttp import web

from splatq.shared.redis.client import connect
from splatq.shared.webhooks.receiver import AiohttpWebhookHandler, Delivery, WebhookReceiver
from splatq.shared.webhooks.signing import parse_secret


async def print_event(delivery: Delivery) -> None:
    """The application's work for one event; here, one JSON line on stdout."""
    line = {"webhook_id": delivery.id, "event": delivery.event, "payload": delivery.payload}
    print(orjson.dumps(line).decode(), flush=True)


async def serve(secrets: Sequence[str], host: str, port: int, path: str, redis_url: str) -> None:
    redis = connect(redis_url, client_name="splatq-webhook-receiver")
    # AiohttpWebhookHandler rather than aiohttp_handler(): it can drain on shutdown.
    handler = AiohttpWebhookHandler(WebhookReceiver(secrets, redis), print_event)
    app = web.Application()
    app.router.add_post(path, handler.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await web.TCPSite(runner, host, port).start()
        print(f"listening on http://{host}:{port}{path}", file=sys.stderr, flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()  # stop taking requests first, then finish the running events
        await handler.drain(timeout_s=10)
        await redis.aclose()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--secret",
        action="append",
        default=[],
        help="whsec_... secret; repeat during rotation (default: $SPLATQ_WEBHOOK_SECRET)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--path", default="/webhooks")
    parser.add_argument("--redis-url", default="redis://localhost:6379/0")
    args = parser.parse_args(argv)
    secrets = args.secret or [s for s in [os.environ.get("SPLATQ_WEBHOOK_SECRET", "")] if s]
    if not secrets:
        parser.error("give --secret or set SPLATQ_WEBHOOK_SECRET")
    for secret in secrets:
        try:
            parse_secret(secret)
        except ValueError as exc:
            parser.error(str(exc))
    asyncio.run(serve(secrets, args.host, args.port, args.path, args.redis_url))


if __name__ == "__main__":
    main()
