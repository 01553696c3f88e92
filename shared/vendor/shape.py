"""The vendor's API shape, both ways: the body of a create request (JSON with the image as a
URL or data URI, or multipart with the image as a file part) and a prediction read from an
answer (its id, its status, where its output is, what it reports of time and cost). Pure.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from splatq.shared.vendor.config import ResponseConfig, VendorConfig

PENDING, SUCCEEDED, FAILED, CANCELED = "pending", "succeeded", "failed", "canceled"
IMAGE_TYPES = {"png": "image/png", "jpeg": "image/jpeg"}
# An output whose name ends so is preferred when an answer lists several files.
GAUSSIAN_SUFFIXES = (".ply", ".splat")


class ShapeError(ValueError):
    """An answer that does not have the configured shape."""


def json_get(doc: Any, path: str) -> Any:
    """The value at a dotted path ("metrics.predict_time", "output.0"), or None."""
    value = doc
    for part in path.split("."):
        if isinstance(value, Mapping):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def json_set(doc: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    node = doc
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def data_uri(image: bytes, image_format: str) -> str:
    return f"data:{IMAGE_TYPES[image_format]};base64,{base64.b64encode(image).decode('ascii')}"


def create_body(config: VendorConfig, image_ref: str, webhook_url: str = "") -> dict[str, Any]:
    """The JSON body of a create request: the configured body with the image (a URL or a data
    URI) at `image_field`, and the webhook URL and its extra members when webhooks are on."""
    body: dict[str, Any] = copy.deepcopy(dict(config.request.body))
    image: Any = [image_ref] if config.request.image_list else image_ref
    json_set(body, config.request.image_field, image)
    if webhook_url:
        json_set(body, config.webhook.url_field, webhook_url)
        for name, value in config.webhook.extra.items():
            json_set(body, name, copy.deepcopy(value))
    return body


def form_fields(config: VendorConfig, webhook_url: str = "") -> list[tuple[str, str]]:
    """The non-file fields of a multipart create request (values that are not strings are
    sent as JSON)."""
    members: dict[str, Any] = dict(config.request.body)
    if webhook_url:
        members[config.webhook.url_field] = webhook_url
        members.update(config.webhook.extra)
    return [
        (name, value if isinstance(value, str) else orjson.dumps(value).decode())
        for name, value in members.items()
    ]


@dataclass(frozen=True, slots=True)
class Prediction:
    id: str
    status: str  # pending | succeeded | failed | canceled
    raw_status: str
    output_url: str
    error: str
    predict_time_s: float | None
    cost: float | None


def _number(doc: Any, path: str) -> float | None:
    if not path:
        return None
    value = json_get(doc, path)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def output_url(cfg: ResponseConfig, doc: Any) -> str:
    """The output file's URL: `output` is a URL, a list of them (the first Gaussian file, else
    the first), or a table (its `output_key`, else its first Gaussian file)."""
    value = json_get(doc, cfg.output)
    if isinstance(value, Mapping):
        value = json_get(value, cfg.output_key) if cfg.output_key else list(value.values())
    if isinstance(value, list):
        urls = [v for v in value if isinstance(v, str)]
        preferred = [u for u in urls if u.split("?", 1)[0].lower().endswith(GAUSSIAN_SUFFIXES)]
        value = (preferred or urls or [""])[0]
    return value if isinstance(value, str) else ""


def parse_prediction(cfg: ResponseConfig, doc: Any, default_status: str = "") -> Prediction:
    """A prediction from a JSON answer (create, get, webhook). `default_status` is taken
    when the answer has no status (a synchronous vendor answers only when it is done)."""
    if not isinstance(doc, Mapping):
        raise ShapeError("the answer is not a JSON object")
    raw_id = json_get(doc, cfg.id)
    pid = str(raw_id) if isinstance(raw_id, str | int) and not isinstance(raw_id, bool) else ""
    raw = json_get(doc, cfg.status)
    raw_status = raw if isinstance(raw, str) else default_status
    if raw_status in cfg.succeeded or (raw_status == SUCCEEDED and default_status):
        status = SUCCEEDED
    elif raw_status in cfg.failed:
        status = FAILED
    elif raw_status in cfg.canceled:
        status = CANCELED
    elif raw_status:
        status = PENDING
    else:
        raise ShapeError(f"the answer has no status at {cfg.status!r}")
    error = json_get(doc, cfg.error) if cfg.error else None
    return Prediction(
        id=pid,
        status=status,
        raw_status=raw_status,
        output_url=output_url(cfg, doc) if status == SUCCEEDED else "",
        error=error if isinstance(error, str) else orjson.dumps(error).decode() if error else "",
        predict_time_s=_number(doc, cfg.predict_time),
        cost=_number(doc, cfg.cost),
    )


def error_message(cfg: ResponseConfig, body: bytes) -> str:
    """The vendor's own words in an error answer: its error member, a `detail`/`message`, or
    the text itself (the caller sanitises and bounds it)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:2000].decode("utf-8", "replace")
    for path in (cfg.error, "detail", "message", "error.message", "error", "title"):
        value = json_get(doc, path) if path else None
        if isinstance(value, str) and value:
            return value
    return body[:2000].decode("utf-8", "replace")
