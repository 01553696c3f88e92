"""`splatq <service> --check`: one health probe, exit 0 (healthy) or 1, for Kubernetes exec
probes and scripts. The gateway's asks its own `/readyz`; the others ping Redis, their one
dependency. One line on stdout says what was checked."""

from __future__ import annotations

import asyncio

import aiohttp

from splatq.shared.redis.client import connect
from splatq.shared.settings import Settings

EXIT_HEALTHY, EXIT_UNHEALTHY = 0, 1
CHECK_TIMEOUT_S = 5.0


def gateway_probe_url(settings: Settings) -> str:
    """The gateway of this pod/host: a wildcard bind address is reached over loopback."""
    host = settings.gateway_host
    if host in {"", "0.0.0.0", "::"}:
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.gateway_port}/readyz"


def check_gateway(settings: Settings, timeout_s: float = CHECK_TIMEOUT_S) -> int:
    return _report("gateway", asyncio.run(_http_ok(gateway_probe_url(settings), timeout_s)))


def check_redis(service: str, settings: Settings, timeout_s: float = CHECK_TIMEOUT_S) -> int:
    return _report(service, asyncio.run(_redis_ok(settings, timeout_s)))


async def _http_ok(url: str, timeout_s: float) -> tuple[bool, str]:
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http, http.get(url) as resp:
            return resp.status == 200, f"GET {url}: {resp.status}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        return False, f"GET {url}: {type(exc).__name__}: {exc}"


async def _redis_ok(settings: Settings, timeout_s: float) -> tuple[bool, str]:
    redis = connect(settings.redis_url, client_name="splatq-check")
    try:
        async with asyncio.timeout(timeout_s):
            await redis.ping()  # type: ignore[misc]
        return True, "redis: PING ok"
    except Exception as exc:
        return False, f"redis: {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        await redis.aclose()


def _report(service: str, result: tuple[bool, str]) -> int:
    ok, what = result
    print(f"{service}: {'healthy' if ok else 'unhealthy'} ({what})", flush=True)
    return EXIT_HEALTHY if ok else EXIT_UNHEALTHY
