"""The request bodies the gateway parses, as typed frozen dataclasses: a job submission (JSON
and multipart, and its params), webhook endpoints, the admin API's tenants, keys and quotas,
a dead letter's redrive or purge, a cache purge. The OpenAPI document's request schemas are
derived from them (services/gateway/shape_schema.py), and the strict parsers take the member
names they accept from them (`field_names`), so neither can name a field the other lacks.

The parsers check the values themselves (with the bounds below); these shapes state them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from splatq.services.gateway.shape_schema import Spec, absent, shape
from splatq.services.gateway.shapes import Quality
from splatq.services.gateway.submission import (
    BASE64_IMAGE_PATTERN,
    MAX_METADATA_BYTES,
    MAX_URL_LENGTH,
)
from splatq.shared.engine.events import EventType
from splatq.shared.engine.stages import PIPELINE
from splatq.shared.tenants.apikeys import KEY_ID_PATTERN
from splatq.shared.tenants.periods import Period
from splatq.shared.tenants.store import MAX_LABEL, MAX_WEIGHT
from splatq.shared.webhooks import headers as custom_headers

# What check_url (shared/webhooks/ssrf.py) refuses by syntax alone: a scheme other than https,
# no host, userinfo, whitespace, control characters or backslashes. Its host policy (no IP
# literal, no local or single-label name) is stated in words: 400 invalid_request.
HTTPS_URL_PATTERN = (
    "^[Hh][Tt][Tt][Pp][Ss]://[^\\x00-\\x20\\x7f\\\\/?#@]+([/?#][^\\x00-\\x20\\x7f\\\\]*)?$"
)
# The same for `image_url`, where http is accepted too.
HTTP_URL_PATTERN = HTTPS_URL_PATTERN.replace("[Ss]://", "[Ss]?://", 1)
# Bounds the admin API's parsers (services/gateway/admin.py) enforce.
MAX_CAP = 1_000_000
MAX_GRACE_S = 30 * 24 * 3600
MAX_QUOTA_SECONDS = 1e12  # exclusive
MAX_ACTOR = 64

# RFC 3339 with a zone (the server refuses a time without one: 400 invalid_request).
ZonedTime = Annotated[
    str,
    Spec(format="date-time", pattern="([Zz]|[+-][0-9]{2}:[0-9]{2})$",
         description="RFC 3339 with a zone (`Z` or ±hh:mm); a time without one is refused"),
]  # fmt: skip

# -- a job submission -------------------------------------------------------------------------

PROGRESSIVE_DESCRIPTION = (
    "A full job first gets a quick preview-resolution result, announced by "
    "`3d_reconstruction.preview_ready`, then the full result as usual. It costs an extra "
    "preview-resolution forward pass (reserved and charged as GPU time with the job). "
    "Accepted and ignored on a preview job. Identical submissions share a job (the cache) "
    "only with the same `progressive`."
)
RULE = "Send exactly one of `image` and `image_url` (400 invalid_request otherwise)."
# Exactly one of image / image_url: validators read these, generators ignore them. JSON only:
# beside a binary property (multipart) a `not` crashes schemathesis' coverage phase.
_ONE_INPUT: dict[str, Any] = {
    "if": {"not": {"required": ["image"]}},
    "then": {"required": ["image_url"]},
    "dependentSchemas": {"image": {"not": {"required": ["image_url"]}}},
}
ImageUrl = Annotated[
    str,
    Spec(minLength=1, maxLength=MAX_URL_LENGTH, format="uri", pattern=HTTP_URL_PATTERN,
         description="http(s) URL of the image, fetched through the SSRF guard (in place of "
         "`image`; a URL its parsers read differently, or with an invalid host name, is a 400; "
         "422 image_url_forbidden, image_url_unreachable, image_url_too_large)"),
]  # fmt: skip


@shape("JobParams", closed=True,
       description="The job's parameters (the multipart `params` part, as JSON).")  # fmt: skip
@dataclass(frozen=True, kw_only=True)
class JobParams:
    """What services/gateway/submission.py `parse_params` accepts (its `PARAMS`)."""

    quality: Annotated[Quality, Spec(default="full")] = absent()
    webhook_url: Annotated[
        str | None,
        Spec(maxLength=MAX_URL_LENGTH, pattern=f"^$|{HTTPS_URL_PATTERN}",
             description="https URL to POST this job's events to, signed with the tenant's "
             "secret; checked by the SSRF guard (public hosts only, else 400); empty or null: "
             "none"),
    ] = absent()  # fmt: skip
    webhook_events: Annotated[
        list[EventType], Spec(description="the events sent to webhook_url; empty: every event")
    ] = absent()
    metadata: Annotated[
        dict[str, Any] | None,
        Spec(description=f"echoed in the job and its events; at most {MAX_METADATA_BYTES} "
             "bytes as JSON"),
    ] = absent()  # fmt: skip
    cache: Annotated[
        bool, Spec(default=True, description="answer an identical completed job from the cache")
    ] = absent()
    progressive: Annotated[bool, Spec(default=False, description=PROGRESSIVE_DESCRIPTION)] = (
        absent()
    )


@dataclass(frozen=True, kw_only=True)
class _JsonImage:
    image: Annotated[
        str,
        Spec(minLength=1, pattern=BASE64_IMAGE_PATTERN,
             description="the image as base64, or a data: URL of it"),
    ] = absent()  # fmt: skip
    image_url: ImageUrl = absent()


@shape("SubmitJobJson", closed=True, description=f"A submission as JSON. {RULE}",
       extra=_ONE_INPUT)  # fmt: skip
@dataclass(frozen=True, kw_only=True)
class SubmitJobJson(JobParams, _JsonImage):
    """The image (or its URL) with the params as members (`_JsonImage`'s fields first)."""


@shape("SubmitJobForm", closed=True, description=f"A submission as multipart/form-data. {RULE}")
@dataclass(frozen=True, kw_only=True)
class SubmitJobForm:
    """The parts services/gateway/submission.py reads (its `FORM_PARTS`)."""

    image: Annotated[
        str,
        Spec(format="binary", description="the image file: PNG, JPEG, WebP, HEIC/HEIF or "
             "AVIF; EXIF orientation (a HEIF's irot/imir) is applied"),
    ] = absent()  # fmt: skip
    image_url: ImageUrl = absent()
    params: JobParams = absent()


# -- webhook endpoints ------------------------------------------------------------------------

EndpointUrl = Annotated[
    str,
    Spec(minLength=1, maxLength=MAX_URL_LENGTH, pattern=HTTPS_URL_PATTERN,
         description="where to POST the events: an https URL of a public host name (no IP "
         "literal, no single-label or local name: 400 invalid_request from the SSRF guard); "
         "http and private hosts only where SPLATQ_WEBHOOK_ALLOW_PRIVATE is set (testing)"),
]  # fmt: skip
Events = Annotated[list[EventType], Spec(description="the events to send; empty: every event")]
HeaderValue = Annotated[str, Spec(maxLength=custom_headers.MAX_VALUE, pattern="^[\\x20-\\x7e]*$")]
Headers = Annotated[
    dict[str, HeaderValue] | None,
    Spec(maxProperties=custom_headers.MAX_HEADERS,
         propertyNames={"maxLength": custom_headers.MAX_NAME,
                        "pattern": "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"},
         description="custom headers sent with every delivery: values of visible ASCII and "
         "spaces; hop-by-hop, framing, User-Agent, tracing and webhook-*/proxy-* (signature) "
         "headers are refused (names compared case-insensitively, each name once); at most "
         f"{custom_headers.MAX_TOTAL} bytes in all; PATCH replaces the set, null clears it",
         examples=[{"X-Api-Key": "rk_live_4f1c"}]),
]  # fmt: skip


@shape(closed=True)
@dataclass(frozen=True, kw_only=True, slots=True)
class EndpointCreate:
    url: EndpointUrl
    events: Events = absent()
    headers: Headers = absent()


@shape(closed=True)
@dataclass(frozen=True, kw_only=True, slots=True)
class EndpointUpdate:
    url: EndpointUrl = absent()
    events: Events = absent()
    enabled: bool = absent()
    headers: Headers = absent()


@shape(closed=True)
@dataclass(frozen=True, kw_only=True, slots=True)
class RecoverRequest:
    since: ZonedTime


# -- the admin API ----------------------------------------------------------------------------

Weight = Annotated[int, Spec(minimum=1, maximum=MAX_WEIGHT)]
Cap = Annotated[int, Spec(minimum=0, maximum=MAX_CAP)]


@shape(
    closed=True,
    description="running jobs per class, across all workers (0 = no cap of its own)",
)
@dataclass(frozen=True, kw_only=True, slots=True)
class RunningCaps:
    """Per stream class (shared/engine/keys.py StreamName; a test keeps them equal)."""

    interactive: Cap = absent()
    synthesis: Cap = absent()


@shape(closed=True)
@dataclass(frozen=True, kw_only=True, slots=True)
class TenantCreate:
    tenant: Annotated[str, Spec(pattern="^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
    weight: Weight = absent()
    running_caps: RunningCaps = absent()


@shape(closed=True)
@dataclass(frozen=True, kw_only=True, slots=True)
class TenantUpdate:
    weight: Weight = absent()
    running_caps: RunningCaps = absent()


@shape(closed=True)
@dataclass(frozen=True, kw_only=True, slots=True)
class KeyCreate:
    label: Annotated[
        str,
        Spec(maxLength=MAX_LABEL, description="printable text (no control, format or "
             "unassigned characters), else 400"),
    ] = absent()  # fmt: skip
    rotate: Annotated[
        str, Spec(pattern=f"^{KEY_ID_PATTERN}$", description="the key id to retire")
    ] = absent()
    grace_seconds: Annotated[int, Spec(minimum=0, maximum=MAX_GRACE_S)] = absent()


@shape(closed=True)
@dataclass(frozen=True, kw_only=True, slots=True)
class QuotaSet:
    gpu_seconds: Annotated[float | None, Spec(minimum=0, exclusiveMaximum=MAX_QUOTA_SECONDS)]
    period: Annotated[Period, Spec(default=Period.MONTH.value)] = absent()


@shape(closed=True)
@dataclass(frozen=True, kw_only=True, slots=True)
class DeadLetterAction:
    """The optional body of a dead letter's redrive or purge."""

    actor: Annotated[
        str,
        Spec(minLength=1, maxLength=MAX_ACTOR,
             description="who acts, recorded as person:<actor> (default console)"),
    ] = absent()  # fmt: skip
    from_stage: Annotated[
        str,
        Spec(enum=[s.value for s in PIPELINE],
             description="redrive a staged job from this stage (jobs only)"),
    ] = absent()  # fmt: skip


@shape(closed=True)
@dataclass(frozen=True, kw_only=True, slots=True)
class CachePurge:
    version: Annotated[str, Spec(minLength=1, maxLength=300)] = absent()
