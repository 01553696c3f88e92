"""`python -m splatq.services.gateway`: the REST gateway (same as `splatq gateway`)."""

from __future__ import annotations

import asyncio
import signal

import structlog
from aiohttp import web

from splatq.services.gateway import listeners
from splatq.services.gateway.app import create_app
from splatq.services.gateway.server import GatewayRunner
from splatq.shared import tracing
from splatq.shared.engine.metrics import package_version
from splatq.shared.logs import configure_logging
from splatq.shared.settings import Settings

log = structlog.get_logger("splatq.gateway")


async def serve(settings: Settings) -> None:
    """Serve until SIGTERM/SIGINT, then stop accepting, drain (`shutdown_grace_s`) and exit."""
    runner = GatewayRunner(
        create_app(settings),
        header_timeout_s=settings.header_timeout_s,
        access_log=None,  # the middleware logs every request as a structlog event
        shutdown_timeout=settings.shutdown_grace_s,
    )
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, settings.gateway_host, settings.gateway_port)
        await site.start()
        for extra in listeners.extra_sites(runner, settings):
            await extra.start()
        for address in runner.addresses:
            log.info(
                "gateway.listening",
                host=address[0],
                port=address[1],
                url=settings.public_base_url,
                version=package_version(),
            )
        await stop.wait()
        log.info("gateway.stopping")
    finally:
        await runner.cleanup()


def main() -> None:
    settings = Settings.from_env()
    configure_logging(settings.log_level, settings.log_format, "gateway")
    tracing.configure_tracing(settings.tracing, "gateway")
    try:
        asyncio.run(serve(settings))
    finally:
        tracing.shutdown_tracing()


if __name__ == "__main__":
    main()
