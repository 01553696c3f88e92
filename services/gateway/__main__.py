"""`python -m splatq.services.gateway`: the REST gateway (same as `splatq gateway`)."""

from __future__ import annotations

from aiohttp import web

from splatq.services.gateway.app import create_app
from splatq.shared.logs import configure_logging
from splatq.shared.settings import Settings


def main() -> None:
    settings = Settings.from_env()
    configure_logging(settings.log_level, settings.log_format, "gateway")
    web.run_app(
        create_app(settings),
        host=settings.gateway_host,
        port=settings.gateway_port,
        access_log=None,  # the middleware logs every request as a structlog event
        print=None,
        shutdown_timeout=settings.shutdown_grace_s,
    )


if __name__ == "__main__":
    main()
