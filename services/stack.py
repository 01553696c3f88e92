"""`splatq up`: the local stack -- an embedded redis-server (AOF on, data in ./var/redis)
unless SPLATQ_REDIS_URL is set, plus one process of each service that exists.

A supervisor only: it starts, watches and stops child processes; it runs no jobs itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from splatq.shared.logs import configure_logging
from splatq.shared.redis.server import RedisServer, RedisServerError, die_with_parent
from splatq.shared.settings import Settings, process_environment

log = structlog.get_logger("splatq.stack")
DEFAULT_REDIS_PORT = 6390
DEV_KEY_PREFIX = "sq_dev_"


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    name: str
    argv: tuple[str, ...]


def services_to_run(settings: Settings) -> list[ServiceSpec]:
    """One process of each service: gateway, worker, webhook dispatcher, DLQ redriver, quota
    settler."""
    return [
        ServiceSpec("gateway", (sys.executable, "-m", "splatq.services.cli", "gateway")),
        ServiceSpec("worker", (sys.executable, "-m", "splatq.services.cli", "worker")),
        ServiceSpec("dispatcher", (sys.executable, "-m", "splatq.services.cli", "dispatcher")),
        ServiceSpec("redriver", (sys.executable, "-m", "splatq.services.cli", "redriver")),
        ServiceSpec("settler", (sys.executable, "-m", "splatq.services.cli", "settler")),
    ]


AfterStart = Callable[[Settings], Awaitable[int]]


async def run_stack(
    settings: Settings, then: AfterStart | None = None, redis_port: int = DEFAULT_REDIS_PORT
) -> int:
    """Run until Ctrl-C (or until `then` returns: its exit code ends the stack). Every child,
    the embedded redis-server included, dies with this process even if it is SIGKILLed."""
    configure_logging(settings.log_level, settings.log_format, "stack")
    redis: RedisServer | None = None
    env = process_environment()
    if settings.redis_url_is_default:
        redis = RedisServer(settings.data_dir / "redis", port=redis_port)
        try:
            await redis.start()
        except RedisServerError as exc:
            print(f"splatq up: {exc}", file=sys.stderr)
            return 1
        env["SPLATQ_REDIS_URL"] = redis.url
        log.info("redis.started", url=redis.url, data_dir=str(redis.data_dir), aof=True)
    redis_url = env.get("SPLATQ_REDIS_URL", settings.redis_url)
    if not settings.storage_url:
        env["SPLATQ_STORAGE_URL"] = f"file://{settings.storage_root.resolve()}"
    if not settings.api_keys:
        # A development key for this stack only (printed below); production sets its own.
        env["SPLATQ_API_KEYS"] = f"dev:{DEV_KEY_PREFIX}{secrets.token_urlsafe(18)}"
    api_key = env.get("SPLATQ_API_KEYS", "").split(",")[0].partition(":")[2]
    child_settings = settings.with_overrides(
        redis_url=redis_url,
        storage_url=env["SPLATQ_STORAGE_URL"],
        api_keys={api_key: "dev"} if api_key else settings.api_keys,
    )
    children: dict[str, asyncio.subprocess.Process] = {}
    try:
        for spec in services_to_run(settings):
            children[spec.name] = await asyncio.create_subprocess_exec(
                *spec.argv,
                env=env,
                preexec_fn=die_with_parent(),  # dies with `splatq up`, even on SIGKILL
            )
            log.info("service.started", service=spec.name, pid=children[spec.name].pid)
        gateway = settings.public_base_url
        print(
            f"splatq is up.\n  API:     {gateway}  (OpenAPI: {gateway}/openapi.json)\n"
            f"  API key: {api_key}\n  Redis:   {redis_url}\n"
            f"  try:     curl -H 'Authorization: Bearer {api_key}' -F image=@photo.png "
            f"{gateway}/v1/jobs\n(Ctrl-C stops everything)",
            flush=True,
        )
        return await _supervise(children, then(child_settings) if then else None)
    finally:
        await _stop_children(children, settings.shutdown_grace_s + 5)
        if redis is not None:
            await redis.stop()
            log.info("redis.stopped")


async def _supervise(
    children: dict[str, asyncio.subprocess.Process], then: Awaitable[int] | None
) -> int:
    """Wait for Ctrl-C/SIGTERM, a child's death (exit 1), or `then` (its exit code)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stopper = asyncio.create_task(stop.wait())
    waiters = [asyncio.create_task(p.wait()) for p in children.values()]
    runner = asyncio.ensure_future(then) if then is not None else None
    watched = [stopper, *waiters] + ([runner] if runner is not None else [])
    try:
        done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in watched:
            if not task.done():
                task.cancel()
    if runner is not None and runner in done:
        return runner.result()
    return 0 if stopper in done else 1


async def _stop_children(children: dict[str, asyncio.subprocess.Process], grace_s: float) -> None:
    for name, proc in children.items():
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        else:
            log.error("service.exited", service=name, code=proc.returncode)
    for proc in children.values():
        with contextlib.suppress(ProcessLookupError):
            try:
                await asyncio.wait_for(proc.wait(), timeout=grace_s)
            except TimeoutError:
                proc.kill()
