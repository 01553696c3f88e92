"""The gateway's listeners and what each answers. One application serves them all; a request
is told apart by the local port it came in on:

- the public listener (SPLATQ_GATEWAY_PORT): the API, /healthz, /readyz, /openapi.json,
  /docs; the admin API too unless it has a listener of its own; /metrics only behind the
  admin key, and only while there is no metrics listener;
- the admin listener (SPLATQ_ADMIN_PORT, when set): /v1/admin/* and /healthz only; the
  public listener then answers 404 for /v1/admin/*, as for any path it does not serve;
- the metrics listener (SPLATQ_METRICS_PORT, when set, as for every other splatq service):
  /metrics (no key: what Prometheus scrapes) and /healthz only; the public listener then
  answers 404 for /metrics.

Keep the admin and metrics listeners off the public network (a cluster-internal port, a
loopback or VPN address: SPLATQ_ADMIN_HOST; the metrics listener binds SPLATQ_GATEWAY_HOST,
where Prometheus reaches the pod).
"""

from __future__ import annotations

from enum import StrEnum

from aiohttp import web

from splatq.services.gateway.problems import not_found
from splatq.shared.settings import Settings

ADMIN_PREFIX = "/v1/admin"
METRICS_PATH = "/metrics"


class Listener(StrEnum):
    PUBLIC = "public"
    ADMIN = "admin"
    METRICS = "metrics"


def local_port(request: web.Request) -> int | None:
    transport = request.transport
    sockname = transport.get_extra_info("sockname") if transport is not None else None
    if isinstance(sockname, tuple) and len(sockname) >= 2 and isinstance(sockname[1], int):
        return sockname[1]
    return None


def listener_of(port: int | None, settings: Settings) -> Listener:
    if port is not None and settings.admin_port and port == settings.admin_port:
        return Listener.ADMIN
    if port is not None and settings.metrics_port and port == settings.metrics_port:
        return Listener.METRICS
    return Listener.PUBLIC


def is_admin_path(path: str) -> bool:
    return path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/")


def serves(listener: Listener, path: str, settings: Settings) -> bool:
    """Whether `listener` answers `path` at all (else 404). Pure."""
    if listener is Listener.ADMIN:
        return is_admin_path(path) or path == "/healthz"
    if listener is Listener.METRICS:
        return path in (METRICS_PATH, "/healthz")
    if settings.metrics_port and path == METRICS_PATH:
        return False
    return not (settings.admin_port and is_admin_path(path))


def screen(request: web.Request, settings: Settings) -> bool:
    """404 for a path the request's listener does not serve; True when the request must carry
    the admin key (/metrics on the public listener). Called by `observe` before the handler,
    so each refusal is a problem+json answer, logged and counted like any other. Without an
    admin or metrics listener every request is the public listener's (no socket lookup)."""
    if settings.admin_port or settings.metrics_port:
        listener = listener_of(local_port(request), settings)
    else:
        listener = Listener.PUBLIC
    path = request.path
    if not serves(listener, path, settings):
        raise not_found("resource")
    return listener is Listener.PUBLIC and path == METRICS_PATH


def extra_sites(runner: web.AppRunner, settings: Settings) -> list[web.TCPSite]:
    """The listeners besides the public one that `settings` asks for (not started)."""
    sites = []
    if settings.admin_port:
        host = settings.admin_host or settings.gateway_host
        sites.append(web.TCPSite(runner, host, settings.admin_port))
    if settings.metrics_port:
        sites.append(web.TCPSite(runner, settings.gateway_host, settings.metrics_port))
    return sites
