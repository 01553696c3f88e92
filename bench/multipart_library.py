"""The gateway's multipart parsing on the `multipart` package's push parser (framing: delimiters,
preamble, epilogue, header lines, part and header limits; strict mode) with the gateway's own
part policy on top (services/gateway/multipart.py: Content-Disposition grammar, no repeated or
control-character headers, plain transfer encodings, no nested multipart). It passes the
gateway's multipart tests; bench/multipart.py measures it against the hand-written framing in
the same run. Kept as the benchmark's candidate: a switch is this module's `parse_form` in
place of the gateway's (docs/benchmarks.md#multipart)."""

from __future__ import annotations

import multipart as mp

from splatq.services.gateway.multipart import (
    _CONTROL_RE,
    MAX_HEADER_BYTES,
    MAX_PARTS,
    FormPart,
    MultipartError,
    part_from_headers,
)

MAX_HEADERS = 8
_LIMITS = {
    "Maximum segment count exceeded": f"more than {MAX_PARTS} parts",
    "Maximum segment header length exceeded": f"part headers exceed {MAX_HEADER_BYTES} bytes",
}


def parse_form(body: bytes, boundary: bytes) -> list[FormPart]:
    """Every part of the body, in order. A preamble before the first delimiter and an epilogue
    after the closing one are ignored, as RFC 2046 says; anything else out of shape raises."""
    parser = mp.PushMultipartParser(
        boundary,
        content_length=len(body),
        max_header_size=MAX_HEADER_BYTES,
        max_header_count=MAX_HEADERS,
        max_segment_count=MAX_PARTS,
        strict=True,
    )
    parts: list[FormPart] = []
    headers: list[tuple[str, str]] = []
    chunks: list[bytes] = []
    try:
        for event in parser.parse(body):
            if isinstance(event, mp.MultipartSegment):
                headers, chunks = event.headerlist, []
            elif event is None:
                parts.append(_part(headers, b"".join(chunks)))
            else:
                chunks.append(event)
        parser.close()
    except mp.ParserLimitReached as exc:
        raise MultipartError(_LIMITS.get(str(exc), str(exc))) from None
    except mp.MultipartError as exc:
        raise MultipartError(str(exc)) from None
    return parts


def _part(headerlist: list[tuple[str, str]], data: bytes) -> FormPart:
    return part_from_headers(_headers(headerlist), data)


def _headers(headerlist: list[tuple[str, str]]) -> dict[str, str]:
    """Header names lower-cased; a repeated header or a control character raises."""
    headers: dict[str, str] = {}
    for name, value in headerlist:
        if _CONTROL_RE.search(value):
            raise MultipartError("a part header holds control characters")
        key = name.lower()
        if key in headers:
            raise MultipartError(f"a part repeats its {key} header")
        headers[key] = value.strip(" \t")
    return headers
