"""Schemathesis hooks for tests/gateway/test_schemathesis.py's full run (SCHEMATHESIS_HOOKS).

Two built-in checks run through wrappers registered here, the run excluding the originals:
`positive_data_acceptance` (a schema-valid request must not be refused with 400/415/422) and
`ensure_resource_availability` (a resource just created must not answer 404). Each wrapper is
the same check, except for the answers in DOCUMENTED: documented behaviours that no OpenAPI
schema can state (what the bytes of an image are, what a host resolves to, which cursors this
server issued, what time it is now, which key ids a tenant has). Anything else they find is a
failure. Each entry says why, and where the behaviour is documented.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import schemathesis
from jsonschema import Draft202012Validator
from schemathesis.core.failures import Failure
from schemathesis.specs.openapi.checks import (
    ensure_resource_availability,
    positive_data_acceptance,
)


@dataclass(frozen=True, slots=True)
class Documented:
    operation: str  # "METHOD /path" as the document names it
    status: int
    code: str
    detail: str  # a regular expression the problem's detail must match
    why: str


DOCUMENTED = (
    Documented("POST /v1/jobs", 415, "unsupported_media_type", "send a PNG, JPEG, WebP, HEIC",
               "the schema says `image` is a file (or base64); whether its bytes are a PNG, "
               "JPEG, WebP, HEIC/HEIF or AVIF is the content check (docs/api.md, refused "
               "uploads)"),
    Documented("POST /v1/jobs", 422, "invalid_image|image_too_large|image_too_complex", "",
               "the bytes are an image the decoder refuses or one past the pixel/decode "
               "limits: content, not shape (docs/api.md, refused uploads)"),
    Documented("POST /v1/jobs", 422, "image_url_(unreachable|forbidden|too_large)", "",
               "`image_url` is fetched: whether its host is public and answers with an image "
               "is known only then (docs/api.md, input by URL)"),
    Documented("POST /v1/jobs", 422, "idempotency_key_reused", "",
               "an Idempotency-Key names one request: generated cases reuse a key with "
               "another body, and that is refused, as the header's description says"),
    Documented("POST /v1/jobs", 400, "invalid_request",
               r"^send either an image part or an image_url part|^missing multipart part",
               "multipart: exactly one of the image and image_url parts is stated in the "
               "description only (a `not` beside a binary property crashes schemathesis' "
               "coverage phase); the JSON encoding states it in the schema"),
    Documented(r"(POST|PATCH) /v1/(jobs|webhook-endpoints(/\{endpoint_id\})?)", 400,
               "invalid_request", r"^(webhook_url|url) rejected \(|^image_url rejected: ",
               "the SSRF guard's host policy (no IP literal, no local or single-label name, "
               "one reading for every URL parser) is stated in the url's description"),
    Documented(r"GET /v1/(jobs|admin/tenants)", 400, "invalid_request", "^cursor ",
               "a cursor is opaque: only the values this API returned (for the same filters) "
               "are cursors, as the parameter's description says"),
    Documented("POST /v1/webhook-endpoints/{endpoint_id}/recover", 400, "invalid_request",
               "^since is in the future", "`since` must be in the past: relative to now"),
    Documented(r"(POST|PATCH) /v1/webhook-endpoints(/\{endpoint_id\})?", 400, "invalid_request",
               r"is set by splatq|is given twice|bytes in all$",
               "custom header names splatq sets (compared case-insensitively), a name given "
               "twice in two cases, and the 4 KB total are stated in `headers`' description"),
    Documented("POST /v1/admin/tenants/{tenant}/keys", 400, "invalid_request", "^label: ",
               "a label is printable text (Python's str.isprintable: no control, format or "
               "unassigned characters), stated in its description"),
    Documented("POST /v1/admin/tenants/{tenant}/keys", 404, "not_found", "has no key",
               "`rotate` names a key id the tenant does not have: the 404 is that key's (the "
               "operation's description), not the tenant's, which exists"),
)  # fmt: skip


def documented(case: Any, response: Any) -> Documented | None:
    """The documented behaviour this refusal is, if any."""
    label = f"{case.operation.method.upper()} {case.operation.path}"
    try:
        problem = response.json()
    except ValueError:
        return None
    if not isinstance(problem, dict):
        return None
    for entry in DOCUMENTED:
        if (
            re.fullmatch(entry.operation, label)
            and response.status_code == entry.status
            and re.fullmatch(entry.code, str(problem.get("code", "")))
            and re.search(entry.detail, str(problem.get("detail", "")))
        ):
            return entry
    return None


_LOCATIONS = {"header": "headers", "query": "query", "path": "path_parameters"}


def violates_parameters(case: Any) -> bool:
    """A parameter value that its own schema refuses. The stateful phase fills parameters from
    earlier answers (its links), unchecked: such a case is not schema-valid, whatever its
    generation mode says, and refusing it is right."""
    for param in case.operation.definition.raw.get("parameters", []):
        values = getattr(case, _LOCATIONS.get(param.get("in"), ""), None) or {}
        matches = [v for k, v in values.items() if k.lower() == param["name"].lower()]
        validator = Draft202012Validator(param.get("schema", {}))
        if any(not validator.is_valid(v) for v in matches):
            return True
    return False


@schemathesis.check
def documented_positive_data_acceptance(ctx: Any, response: Any, case: Any) -> bool | None:
    """positive_data_acceptance, less the DOCUMENTED refusals and the cases whose parameters
    their own schemas refuse."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except Failure:
        if documented(case, response) is not None or violates_parameters(case):
            return None
        raise


@schemathesis.check
def documented_ensure_resource_availability(ctx: Any, response: Any, case: Any) -> bool | None:
    """ensure_resource_availability, less the DOCUMENTED 404s."""
    try:
        return ensure_resource_availability(ctx, response, case)
    except Failure:
        if documented(case, response) is not None:
            return None
        raise
