"""The gateway's side of remote model backends and the result cache: the vendor's webhook
(`POST /v1/vendor-webhooks/{vendor}`: a finished prediction is put in the vendor lane's inbox,
where the worker waiting on it finds it), and the admin cache endpoints (`GET
/v1/admin/cache`, `POST /v1/admin/cache/purge` by version).

The webhook is verified by the vendor's Standard Webhooks signature (the secret the vendor
configuration names) before anything is stored; only a finished prediction is kept, for an
hour, under its own id: a forged or replayed call cannot finish anybody's job early, it can
at most repeat what the vendor said.
"""

from __future__ import annotations

from typing import Any

import orjson
import structlog
from aiohttp import web

from splatq.services.gateway.appkeys import QUEUE, SETTINGS
from splatq.services.gateway.auth import authenticate_admin
from splatq.services.gateway.endpoints import _check_fields, _json_body
from splatq.services.gateway.problems import ApiError, invalid_request, not_found
from splatq.services.gateway.result_cache import RESULT_CACHE
from splatq.services.gateway.server import NO_STORE
from splatq.services.gateway.shape_schema import field_names
from splatq.services.gateway.shapes_requests import CachePurge
from splatq.services.gateway.submission import read_capped
from splatq.shared.settings import Settings
from splatq.shared.vendor.config import VendorConfig, load_vendor_config
from splatq.shared.vendor.credentials import Credential, webhook_secret
from splatq.shared.vendor.keys import VendorKeys
from splatq.shared.vendor.shape import PENDING, ShapeError, parse_prediction
from splatq.shared.webhooks.signing import SignatureError, verify

log = structlog.get_logger("splatq.gateway.upstream")
MAX_WEBHOOK_BYTES = 1024 * 1024
INBOX_TTL_MS = 3_600_000
MAX_VERSION_CHARS = 300


class VendorHook:
    """The configured vendor's webhook: its name, response shape and signing secret."""

    def __init__(self, config: VendorConfig, secret: Credential) -> None:
        self.config = config
        self.secret = secret
        self.keys = VendorKeys(config.name)


VENDOR_HOOK = web.AppKey("vendor_hook", VendorHook)


def install(app: web.Application, settings: Settings) -> None:
    app.router.add_get("/v1/admin/cache", cache_info)
    app.router.add_post("/v1/admin/cache/purge", purge_cache)
    app.router.add_post("/v1/vendor-webhooks/{vendor}", vendor_webhook)
    if settings.model == "remote" and settings.remote_config:
        config = load_vendor_config(settings.remote_config)
        if config.webhook.enabled:
            secret = webhook_secret(config.webhook.secret_env, config.webhook.secret_file)
            app[VENDOR_HOOK] = VendorHook(config, secret)


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers=NO_STORE
    )


async def cache_info(request: web.Request) -> web.Response:
    await authenticate_admin(request, request.app[SETTINGS].admin_api_key)
    cache = request.app[RESULT_CACHE]
    generation = await cache.generation(request.app[QUEUE].redis)
    return _json(_info(cache.version, generation, request.app[SETTINGS]))


def _info(version: str, generation: int, settings: Settings) -> dict[str, Any]:
    return {
        "version": version,
        "generation": generation,
        "soft_ttl_s": settings.cache_soft_ttl_s,
        "hard_ttl_s": settings.cache_hard_ttl_s,
    }


async def purge_cache(request: web.Request) -> web.Response:
    """Every cached result of a version (default: the current one) becomes a miss."""
    await authenticate_admin(request, request.app[SETTINGS].admin_api_key)
    doc = await _json_body(request)
    _check_fields(doc, field_names(CachePurge))
    cache = request.app[RESULT_CACHE]
    version = doc.get("version", cache.version)
    if not isinstance(version, str) or not 0 < len(version) <= MAX_VERSION_CHARS:
        raise invalid_request(f"version must be a string of 1-{MAX_VERSION_CHARS} characters")
    generation = await cache.purge(request.app[QUEUE].redis, version)
    return _json(_info(version, generation, request.app[SETTINGS]))


async def vendor_webhook(request: web.Request) -> web.Response:
    hook = request.app.get(VENDOR_HOOK)
    if hook is None or request.match_info["vendor"] != hook.config.name:
        raise not_found("vendor webhook")
    body = await read_capped(request, MAX_WEBHOOK_BYTES, request.app[SETTINGS].body_timeout_s)
    try:
        verify(hook.secret.value(), request.headers, body)
    except SignatureError as exc:
        raise ApiError(401, "invalid_signature", f"webhook signature: {exc.code}") from None
    try:
        prediction = parse_prediction(hook.config.response, orjson.loads(body))
    except (orjson.JSONDecodeError, ShapeError) as exc:
        raise invalid_request(f"not a prediction: {exc}") from None
    if not prediction.id or len(prediction.id) > 200:
        raise invalid_request("the prediction has no usable id")
    if prediction.status != PENDING:
        key = hook.keys.inbox(prediction.id)
        await request.app[QUEUE].redis.set(key, body, px=INBOX_TTL_MS)
        log.info("vendor.webhook", vendor=hook.config.name, prediction_id=prediction.id,
                 status=prediction.status)  # fmt: skip
    return web.Response(status=204)
