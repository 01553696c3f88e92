"""Operations: /healthz, /readyz, /metrics, /openapi.json and /docs."""

from __future__ import annotations

import asyncio
import functools

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from splatq.services.gateway import docs_page
from splatq.services.gateway.appkeys import (
    QUEUE,
    REGISTRY_KEY,
    SETTINGS,
)
from splatq.services.gateway.openapi import openapi_document
from splatq.services.gateway.problems import ApiError
from splatq.services.gateway.responses import json_response

log = structlog.get_logger("splatq.gateway")
OVERLOAD_RETRY_AFTER_S = 5
STREAMS_RETRY_AFTER_S = 5


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    try:
        await asyncio.wait_for(request.app[QUEUE].redis.ping(), timeout=2)  # type: ignore[arg-type]
    except Exception as exc:
        raise ApiError(503, "not_ready", f"redis unreachable: {type(exc).__name__}") from None
    return json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[REGISTRY_KEY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    return json_response(openapi_document(settings.public_base_url, settings.prefer_wait_max_s))


@functools.lru_cache(maxsize=4)
def _docs_html(base_url: str, max_wait_s: int) -> bytes:
    return docs_page.render(openapi_document(base_url, max_wait_s)).encode()


async def docs(request: web.Request) -> web.Response:
    """The API reference page (services/gateway/docs_page.py): no script, no outside resource."""
    return web.Response(
        body=_docs_html(
            request.app[SETTINGS].public_base_url, request.app[SETTINGS].prefer_wait_max_s
        ),
        content_type="text/html",
        charset="utf-8",
        headers={
            "Content-Security-Policy": docs_page.CONTENT_SECURITY_POLICY,
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "public, max-age=300",
        },
    )
