"""Webhook deliveries per second through the dispatcher (signing, SSRF-guarded connector,
claim/record scripts included) to a local aiohttp receiver, at 0 % and 30 % transient
receiver failures, and to a registered endpoint (circuit breaker checks included), against a
bare aiohttp client POST loop in the same run that signs each request with the Standard
Webhooks headers (and, for scale, one that does not), both with the garbage collector set as
a running dispatcher sets it, so the ratio is the dispatcher's own work.

Usage: python -m bench.webhook_throughput [--messages 3000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from splatq.services.webhook_dispatcher.collector import tuned_collector
from splatq.services.webhook_dispatcher.dispatcher import Dispatcher
from splatq.shared.engine.ids import new_event_id, new_job_id
from splatq.shared.engine.queue import JobQueue
from splatq.shared.logs import configure_logging
from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer
from splatq.shared.settings import Settings
from splatq.shared.webhooks.endpoints import EndpointStore
from splatq.shared.webhooks.signing import generate_secret, signed_headers
from splatq.shared.webhooks.store import WebhookStore

PAYLOAD = b'{"event":"3d_reconstruction.completed","id":"evt_x","timestamp":1,"data":{}}'


async def _receiver(
    fail_ratio: float,
) -> tuple[web.AppRunner, str, dict[str, int], list[float]]:
    """A loopback receiver: counts, and the time (perf_counter) each success arrived."""
    seen: dict[str, int] = {"ok": 0, "failed": 0, "ids": 0}
    arrivals: list[float] = []
    ids: set[str] = set()
    rng = random.Random(1)

    async def hook(request: web.Request) -> web.Response:
        await request.read()
        if rng.random() < fail_ratio:
            seen["failed"] += 1
            return web.Response(status=503)
        seen["ok"] += 1
        arrivals.append(time.perf_counter())
        ids.add(request.headers.get("webhook-id", ""))
        seen["ids"] = len(ids)
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/hook", seen, arrivals


def steady_rate(arrivals: list[float]) -> float:
    """Successes per second from the first success to the last: start-up excluded (the
    dispatcher loads its scripts and creates its consumer groups first), as the engine
    bench's steady rates are."""
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    return (len(arrivals) - 1) / span if span > 0 else 0.0


async def bare_loop(url: str, n: int, concurrency: int, signed: bool) -> float:
    """Requests/s of a plain aiohttp client POSTing the same payload (the baseline); `signed`:
    each request signed and sent with the Standard Webhooks headers, a fresh message id each,
    as any webhook sender must (the issue's "bare signed POST loop")."""
    left = n
    secret = (generate_secret(),)
    ids = [new_event_id() for _ in range(n)]  # made before the clock starts, as the
    # dispatcher's come from the fan-out
    async with aiohttp.ClientSession() as http:

        async def one() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                headers = None
                if signed:
                    headers = signed_headers(secret, ids[left], int(time.time()), PAYLOAD)
                    headers["Content-Type"] = "application/json"
                async with http.post(url, data=PAYLOAD, headers=headers) as resp:
                    await resp.read()

        t = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        return n / (time.perf_counter() - t)


async def dispatcher_run(
    redis_url: str,
    url: str,
    n: int,
    concurrency: int,
    seen: dict[str, int],
    to_endpoint: bool = False,
) -> float:
    """Deliveries/s of n messages to the job's webhook_url, or (`to_endpoint`) to a
    registered endpoint: then every attempt also passes the circuit breaker's gate and
    updates the endpoint's health."""
    settings = Settings(
        redis_url=redis_url,
        webhook_allow_private=True,
        webhook_concurrency=concurrency,
        webhook_concurrency_per_host=concurrency,
        webhook_concurrency_per_endpoint=concurrency,
        webhook_retry_base_ms=5,
        webhook_retry_cap_ms=50,
        log_level="warning",
    )
    redis = connect(redis_url)
    queue = JobQueue(redis, settings)
    await queue.setup()
    store = WebhookStore(queue)
    await store.setup()
    job_id = new_job_id(0)
    target, message_url = "job", url
    if to_endpoint:
        endpoint = await EndpointStore(queue).create("bench", url, [])
        target, message_url = endpoint.id, ""
    for i in range(0, n, 500):  # messages as the fan-out would create them
        batch = []
        for _ in range(min(500, n - i)):
            evt = new_event_id()
            batch.append(
                {
                    "id": f"{evt}:{target}",
                    "event_id": evt,
                    "event_type": "x",
                    "job_id": job_id,
                    "tenant": "bench",
                    "url": message_url,
                    "payload": PAYLOAD.decode(),
                    "target": target,
                    "created_ms": "0",
                }
            )
        entry = await redis.xadd(queue.keys.events(0), {"type": "x"})
        await store.fan_out(0, [(entry, batch)])
    await store.tenant_secret("bench")
    dispatcher = Dispatcher(queue)
    task = asyncio.create_task(dispatcher.run())
    t = time.perf_counter()
    while seen["ids"] < n:  # noqa: ASYNC110 - polling the receiver's count is the clock
        await asyncio.sleep(0.02)
    elapsed = time.perf_counter() - t
    dispatcher.stop()
    await task
    await redis.aclose()
    return n / elapsed


async def main(n: int, concurrency: int) -> None:
    # As the service runs: JSON logs at warning (an info line per attempt is a debugging aid).
    configure_logging("warning", "json", "dispatcher")
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp), appendonly=False)
        await server.start()
        rows = []
        try:
            # The baselines run with the collector set as a running dispatcher sets it
            # (services/webhook_dispatcher/collector.py): the ratio is then the dispatcher's
            # own work, not a process setting the bare loop could have too. The ratios are
            # to the signed loop (the first row); the unsigned one is shown for scale.
            for signed in (True, False):
                runner, url, _, arrivals = await _receiver(0.0)
                with tuned_collector():
                    bare = await bare_loop(url, n, concurrency, signed)
                await runner.cleanup()
                name = "bare signed aiohttp POST loop" if signed else "bare POST loop, unsigned"
                rows.append((name, bare, steady_rate(arrivals), "-"))
            for fail, to_endpoint in ((0.0, False), (0.3, False), (0.0, True)):
                flusher = connect(server.url)
                await flusher.flushall()
                await flusher.aclose()
                runner, url, seen, arrivals = await _receiver(fail)
                rate = await dispatcher_run(server.url, url, n, concurrency, seen, to_endpoint)
                await runner.cleanup()
                where = "registered endpoint" if to_endpoint else "job webhook_url"
                rows.append(
                    (
                        f"dispatcher → {where}, {int(fail * 100)} % transient failures",
                        rate,
                        steady_rate(arrivals),
                        f"{seen['ok']} ok / {seen['failed']} failed, {seen['ids']} ids",
                    )
                )
        finally:
            await server.stop()
    print(f"\n{n} messages, concurrency {concurrency}\n")
    print("wall: from the dispatcher's start (script loading, group creation) or the loop's")
    print("first request to the last delivery; steady: from the first delivery to the last")
    print()
    print("| run | deliveries/s, wall | ratio | steady | ratio | receiver saw |")
    print("|---|---:|---:|---:|---:|---|")
    for name, rate, steady, note in rows:
        print(f"| {name} | {rate:,.0f} | {rate / rows[0][1]:.2f} | {steady:,.0f} |"
              f" {steady / rows[0][2]:.2f} | {note} |")  # fmt: skip


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=64)
    a = p.parse_args()
    asyncio.run(main(a.messages, a.concurrency))
