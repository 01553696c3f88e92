"""A hosted model's configuration (TOML, path in SPLATQ_REMOTE_CONFIG), validated at start:
an error names the file, the key and what was expected. Pure: no I/O beyond reading the file.

The file describes one vendor's API shape -- where to send the image and how, how to read
the answer, where the output is -- and the limits the whole fleet must keep towards it. It
names where the API token is (an environment variable or a mounted secret file), never the
token itself. docs/hosted-model.md has a complete example.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VENDOR_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")
# A dotted path into a JSON answer: names and list indexes ("output.0", "metrics.predict_time").
JSON_PATH = re.compile(r"[A-Za-z0-9_$-]+(\.[A-Za-z0-9_$-]+)*")
SHAPES = ("multipart", "json")
MODES = ("async", "sync")
IMAGE_AS = ("data_uri", "url")
OUTPUT_FORMATS = ("auto", "ply", "splat")
QUALITIES = ("preview", "full")


class VendorConfigError(ValueError):
    """The configuration cannot be used; the message says where and why."""


@dataclass(frozen=True, slots=True)
class AuthConfig:
    env: str = ""  # the environment variable holding the token
    file: str = ""  # or a mounted secret file holding it (Kubernetes secret volume)
    header: str = "Authorization"
    scheme: str = "Bearer"  # the header is "<scheme> <token>", or the bare token when ""


@dataclass(frozen=True, slots=True)
class RequestConfig:
    shape: str = "json"  # multipart (the image as a file part) | json (image as URL/data URI)
    path: str = "/predictions"
    # json: the dotted path in the body where the image goes; multipart: the file part's name
    image_field: str = "input.image"
    image_as: str = "data_uri"  # json only: data_uri | url (a presigned GET of object storage)
    image_list: bool = False  # json only: the field is a list of images (the one image in it)
    image_format: str = "png"  # png (keeps the cut-out's alpha) | jpeg
    resolution: Mapping[str, int] = field(default_factory=lambda: {"preview": 256, "full": 512})
    body: Mapping[str, Any] = field(default_factory=dict)  # the rest of the body (json), fields
    headers: Mapping[str, str] = field(default_factory=dict)  # static extra headers (no secrets)
    idempotency_header: str = "Idempotency-Key"  # '' = the vendor has none
    timeout_s: float = 30.0
    url_ttl_s: int = 3600


@dataclass(frozen=True, slots=True)
class ResponseConfig:
    mode: str = "async"  # async: a prediction id to poll or a webhook; sync: the answer has it
    id: str = "id"
    status: str = "status"
    succeeded: tuple[str, ...] = ("succeeded",)
    failed: tuple[str, ...] = ("failed",)
    canceled: tuple[str, ...] = ("canceled",)
    output: str = "output"  # the output URL: a string, a list (first match), or a table
    output_key: str = ""  # when `output` is a table: the member holding the URL
    error: str = "error"
    get_path: str = "/predictions/{id}"
    cancel_path: str = "/predictions/{id}/cancel"  # '' = the vendor cannot cancel
    request_id_header: str = "X-Request-Id"
    predict_time: str = "metrics.predict_time"  # seconds the vendor reports it computed
    cost: str = ""  # a cost the vendor reports (any unit), '' = none
    ms_per_cost: float = 0.0  # quota ms charged per unit of cost (0: charge the time instead)


@dataclass(frozen=True, slots=True)
class OutputConfig:
    format: str = "auto"  # auto (by magic bytes) | ply | splat; a mesh (.glb) is refused
    max_bytes: int = 256 * 1024 * 1024
    timeout_s: float = 120.0
    send_auth: bool = False  # the vendor's auth header on the output GET (its own host only)


@dataclass(frozen=True, slots=True)
class PollConfig:
    initial_s: float = 0.5
    max_s: float = 5.0
    factor: float = 1.5
    timeout_s: float = 900.0  # the most one prediction may take before it counts as failed


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    enabled: bool = False
    public_url: str = ""  # the gateway's public base: <public_url>/v1/vendor-webhooks/<name>
    url_field: str = "webhook"  # the body member carrying the webhook URL
    extra: Mapping[str, Any] = field(default_factory=dict)  # e.g. webhook_events_filter
    secret_env: str = ""  # Standard Webhooks `whsec_...` secret signing the vendor's calls
    secret_file: str = ""
    fallback_poll_s: float = 30.0  # polled this often anyway, in case a webhook is lost


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    rate: int = 60  # prediction creations ...
    per_s: float = 60.0  # ... per this many seconds, the whole fleet together
    concurrency: int = 5  # predictions in flight at once, the whole fleet together
    tenant_rate: int = 0  # the same per tenant within the vendor (0 = none)
    tenant_concurrency: int = 0
    # The limiter runs at this fraction of the vendor's rate: room for clock and network
    # jitter between our count and the vendor's (docs/hosted-model.md#limits).
    safety: float = 0.97
    # A held slot lapses this long after its holder's last renewal (a killed worker's slot
    # comes back); keep it above the job lease TTL + reaper interval so a job taken over
    # after a crash keeps its slot while its prediction still runs at the vendor.
    slot_ttl_s: float = 60.0


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    failures: int = 5  # consecutive transient failures that open the circuit
    open_s: float = 30.0  # first open period; doubled after each failed probe ...
    open_cap_s: float = 600.0  # ... up to this
    max_wait_s: float = 900.0  # a job waits this long for a closed circuit, then fails


@dataclass(frozen=True, slots=True)
class WaitConfig:
    # A pause or an open circuit shorter than this is waited for in the worker; a longer one
    # puts the job back on the delayed set until then (deferred: no attempt counted).
    inline_max_s: float = 5.0
    jitter: float = 0.2  # each waiter resumes up to this fraction of the pause later


@dataclass(frozen=True, slots=True)
class VendorConfig:
    name: str
    base_url: str
    model_version: str
    auth: AuthConfig = AuthConfig()
    request: RequestConfig = RequestConfig()
    response: ResponseConfig = ResponseConfig()
    output: OutputConfig = OutputConfig()
    poll: PollConfig = PollConfig()
    webhook: WebhookConfig = WebhookConfig()
    limits: LimitsConfig = LimitsConfig()
    breaker: BreakerConfig = BreakerConfig()
    wait: WaitConfig = WaitConfig()

    @property
    def version(self) -> str:
        """The backend's version: recorded as the job's `model` and part of every cache key,
        so results of another vendor model are never served as this one's."""
        return f"remote:{self.name}:{self.model_version}"

    @property
    def webhook_url(self) -> str:
        base = self.webhook.public_url.rstrip("/")
        return f"{base}/v1/vendor-webhooks/{self.name}" if self.webhook.enabled else ""


def load_vendor_config(path: str | Path) -> VendorConfig:
    source = str(path)
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise VendorConfigError(f"{source}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise VendorConfigError(f"{source}: cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise VendorConfigError(f"{source}: not valid TOML: {exc}") from None
    return parse_vendor_config(raw, source)


def parse_vendor_config(raw: Mapping[str, Any], source: str = "config") -> VendorConfig:
    top = _Table(source, "", raw)
    vendor = top.table("vendor")
    name = vendor.text("name", pattern=VENDOR_NAME)
    base_url = vendor.text("base_url").rstrip("/")
    if not base_url.startswith(("https://", "http://")):
        raise vendor.error("base_url", "must be an http(s) URL")
    model_version = vendor.text("model_version")
    vendor.done()
    config = VendorConfig(
        name=name,
        base_url=base_url,
        model_version=model_version,
        auth=_auth(top.table("auth")),
        request=_request(top.table("request")),
        response=_response(top.table("response")),
        output=_output(top.table("output")),
        poll=_poll(top.table("poll")),
        webhook=_webhook(top.table("webhook")),
        limits=_limits(top.table("limits")),
        breaker=_breaker(top.table("breaker")),
        wait=_wait(top.table("wait")),
    )
    top.done()
    for json_only in ("image_as", "image_list"):
        if config.request.shape == "multipart" and json_only in raw.get("request", {}):
            raise top.error(f"request.{json_only}", "applies to the json shape only")
    return config


def _auth(t: _Table) -> AuthConfig:
    d = AuthConfig()
    env, file = t.text("env", ""), t.text("file", "")
    if bool(env) == bool(file):
        raise t.error("env", "name exactly one of env (a variable) and file (a secret file)")
    out = AuthConfig(
        env=env,
        file=file,
        header=t.text("header", d.header, pattern=HEADER_NAME),
        scheme=t.text("scheme", d.scheme, allow_empty=True),
    )
    t.done()
    return out


def _request(t: _Table) -> RequestConfig:
    d = RequestConfig()
    shape = t.choice("shape", SHAPES, d.shape)
    resolution = t.table("resolution")
    sizes = {q: int(resolution.number(q, d.resolution[q], 32, 4096, True)) for q in QUALITIES}
    resolution.done()
    field_pattern = JSON_PATH if shape == "json" else HEADER_NAME
    out = RequestConfig(
        shape=shape,
        path=t.path("path", d.path),
        image_field=t.text("image_field", d.image_field, pattern=field_pattern),
        image_as=t.choice("image_as", IMAGE_AS, d.image_as),
        image_list=t.flag("image_list", d.image_list),
        image_format=t.choice("image_format", ("png", "jpeg"), d.image_format),
        resolution=sizes,
        body=t.any_table("body"),
        headers=t.string_table("headers"),
        idempotency_header=t.text("idempotency_header", d.idempotency_header, HEADER_NAME, True),
        timeout_s=t.number("timeout_s", d.timeout_s, 0.1, 3600),
        url_ttl_s=int(t.number("url_ttl_s", d.url_ttl_s, 60, 7 * 86400, True)),
    )
    secretish = [h for h in out.headers if h.lower() in {"authorization", "x-api-key", "api-key"}]
    if secretish:
        raise t.error(f"headers.{secretish[0]}", "a credential belongs in [auth], not here")
    t.done()
    return out


def _response(t: _Table) -> ResponseConfig:
    d = ResponseConfig()
    out = ResponseConfig(
        mode=t.choice("mode", MODES, d.mode),
        id=t.text("id", d.id, JSON_PATH),
        status=t.text("status", d.status, JSON_PATH),
        succeeded=t.strings("succeeded", d.succeeded),
        failed=t.strings("failed", d.failed),
        canceled=t.strings("canceled", d.canceled),
        output=t.text("output", d.output, JSON_PATH),
        output_key=t.text("output_key", d.output_key, JSON_PATH, True),
        error=t.text("error", d.error, JSON_PATH, True),
        get_path=t.path("get_path", d.get_path),
        cancel_path=t.path("cancel_path", d.cancel_path, optional=True),
        request_id_header=t.text("request_id_header", d.request_id_header, HEADER_NAME, True),
        predict_time=t.text("predict_time", d.predict_time, JSON_PATH, True),
        cost=t.text("cost", d.cost, JSON_PATH, True),
        ms_per_cost=t.number("ms_per_cost", d.ms_per_cost, 0, 1e12),
    )
    if "{id}" not in out.get_path:
        raise t.error("get_path", "must contain {id}")
    if out.cancel_path and "{id}" not in out.cancel_path:
        raise t.error("cancel_path", "must contain {id} (or be '' when there is none)")
    t.done()
    return out


def _output(t: _Table) -> OutputConfig:
    d = OutputConfig()
    out = OutputConfig(
        format=t.choice("format", OUTPUT_FORMATS, d.format),
        max_bytes=int(t.number("max_bytes", d.max_bytes, 1024, 4 * 1024**3, True)),
        timeout_s=t.number("timeout_s", d.timeout_s, 0.1, 3600),
        send_auth=t.flag("send_auth", d.send_auth),
    )
    t.done()
    return out


def _poll(t: _Table) -> PollConfig:
    d = PollConfig()
    out = PollConfig(
        initial_s=t.number("initial_s", d.initial_s, 0.01, 600),
        max_s=t.number("max_s", d.max_s, 0.01, 600),
        factor=t.number("factor", d.factor, 1.0, 10),
        timeout_s=t.number("timeout_s", d.timeout_s, 1, 7 * 86400),
    )
    if out.max_s < out.initial_s:
        raise t.error("max_s", "must be >= initial_s")
    t.done()
    return out


def _webhook(t: _Table) -> WebhookConfig:
    d = WebhookConfig()
    out = WebhookConfig(
        enabled=t.flag("enabled", d.enabled),
        public_url=t.text("public_url", "", allow_empty=True).rstrip("/"),
        url_field=t.text("url_field", d.url_field, JSON_PATH),
        extra=t.any_table("extra"),
        secret_env=t.text("secret_env", "", allow_empty=True),
        secret_file=t.text("secret_file", "", allow_empty=True),
        fallback_poll_s=t.number("fallback_poll_s", d.fallback_poll_s, 0.1, 3600),
    )
    if out.enabled:
        if not out.public_url.startswith(("https://", "http://")):
            raise t.error("public_url", "must be the gateway's public http(s) URL")
        if bool(out.secret_env) == bool(out.secret_file):
            raise t.error("secret_env", "name exactly one of secret_env and secret_file")
    t.done()
    return out


def _limits(t: _Table) -> LimitsConfig:
    d = LimitsConfig()
    out = LimitsConfig(
        rate=int(t.number("rate", d.rate, 1, 1_000_000, True)),
        per_s=t.number("per_s", d.per_s, 0.001, 86400),
        concurrency=int(t.number("concurrency", d.concurrency, 1, 100_000, True)),
        tenant_rate=int(t.number("tenant_rate", 0, 0, 1_000_000, True)),
        tenant_concurrency=int(t.number("tenant_concurrency", 0, 0, 100_000, True)),
        safety=t.number("safety", d.safety, 0.5, 1.0),
        slot_ttl_s=t.number("slot_ttl_s", d.slot_ttl_s, 1, 86400),
    )
    t.done()
    return out


def _breaker(t: _Table) -> BreakerConfig:
    d = BreakerConfig()
    out = BreakerConfig(
        failures=int(t.number("failures", d.failures, 1, 10_000, True)),
        open_s=t.number("open_s", d.open_s, 0.01, 86400),
        open_cap_s=t.number("open_cap_s", d.open_cap_s, 0.01, 7 * 86400),
        max_wait_s=t.number("max_wait_s", d.max_wait_s, 0, 30 * 86400),
    )
    if out.open_cap_s < out.open_s:
        raise t.error("open_cap_s", "must be >= open_s")
    t.done()
    return out


def _wait(t: _Table) -> WaitConfig:
    d = WaitConfig()
    out = WaitConfig(
        inline_max_s=t.number("inline_max_s", d.inline_max_s, 0, 3600),
        jitter=t.number("jitter", d.jitter, 0, 1),
    )
    t.done()
    return out


class _Table:
    """One TOML table being read: typed getters with defaults, an error naming the key, and
    `done()` refusing keys nobody read (a typo must not silently mean the default)."""

    def __init__(self, source: str, at: str, raw: Mapping[str, Any]) -> None:
        self.source, self.at, self.raw = source, at, raw
        self.read: set[str] = set()

    def error(self, key: str, problem: str) -> VendorConfigError:
        where = f"{self.at}.{key}" if self.at and key else (self.at or key)
        return VendorConfigError(f"{self.source}: {where}: {problem}")

    def _get(self, key: str) -> Any:
        self.read.add(key)
        return self.raw.get(key)

    def table(self, key: str) -> _Table:
        value = self._get(key)
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise self.error(key, "must be a table")
        return _Table(self.source, f"{self.at}.{key}" if self.at else key, value)

    def text(
        self,
        key: str,
        default: str | None = None,
        pattern: re.Pattern[str] | None = None,
        allow_empty: bool = False,
    ) -> str:
        value = self._get(key)
        if value is None:
            if default is None:
                raise self.error(key, "is required")
            return default
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, got {value!r}")
        if value == "" and (allow_empty or default == ""):
            return value
        if not value.strip():
            raise self.error(key, "must not be empty")
        if pattern is not None and not pattern.fullmatch(value):
            raise self.error(key, f"{value!r} does not match {pattern.pattern}")
        return value

    def path(self, key: str, default: str, optional: bool = False) -> str:
        value = self.text(key, default, allow_empty=optional)
        if value and (not value.startswith("/") or any(c in value for c in " ?#\\")):
            raise self.error(key, "must be a path starting with / (no query, no spaces)")
        return value

    def choice(self, key: str, allowed: tuple[str, ...], default: str) -> str:
        value = self.text(key, default)
        if value not in allowed:
            raise self.error(key, f"must be one of {' | '.join(allowed)}, got {value!r}")
        return value

    def number(
        self, key: str, default: float, lo: float, hi: float, integer: bool = False
    ) -> float:
        value = self._get(key)
        if value is None:
            return float(default)
        ok = isinstance(value, int) or (isinstance(value, float) and not integer)
        if isinstance(value, bool) or not ok or not lo <= float(value) <= hi:
            what = "an integer" if integer else "a number"
            raise self.error(key, f"must be {what} within [{lo:g}, {hi:g}], got {value!r}")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    def strings(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self._get(key)
        if value is None:
            return default
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(v, str) and v for v in value)
        ):
            raise self.error(key, "must be a non-empty array of strings")
        return tuple(value)

    def any_table(self, key: str) -> Mapping[str, Any]:
        value = self._get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.error(key, "must be a table")
        return value

    def string_table(self, key: str) -> Mapping[str, str]:
        value = self.any_table(key)
        bad = [
            k for k, v in value.items() if not isinstance(v, str) or not HEADER_NAME.fullmatch(k)
        ]
        if bad:
            raise self.error(f"{key}.{bad[0]}", "must be a header name with a string value")
        return dict(value)

    def done(self) -> None:
        unknown = sorted(set(self.raw) - self.read)
        if unknown:
            raise self.error(unknown[0], f"unknown key (known: {', '.join(sorted(self.read))})")
