"""A strict `multipart/form-data` parser for a body already read into memory (RFC 7578, with
RFC 2046's framing).

The gateway reads a submission's body whole anyway (the image is validated and stored as one
object, and the body is capped at the upload limit), so parsing the bytes in one pass with
`bytes.find` replaces aiohttp's streaming reader, which costs several awaits per part and
was a fifth of a submission's CPU (docs/benchmarks.md). The `multipart` package's push parser
was measured against this one in the same run (bench/multipart.py): equal on large bodies,
about 5 us slower per small one, so this one stays (docs/benchmarks.md#multipart). Pure:
bytes in, parts or `MultipartError` out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiohttp.helpers import parse_mimetype

MAX_PARTS = 8
MAX_HEADER_BYTES = 8 * 1024
# RFC 2046 bchars, 1-70 characters, not ending in a space.
_BOUNDARY_RE = re.compile(rb"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")
_TOKEN_RE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
# One `; name=value` parameter: a token, or a quoted-string with backslash escapes.
_PARAM_RE = re.compile(rf'[ \t]*;[ \t]*({_TOKEN})[ \t]*=[ \t]*(?:"((?:[^"\\]|\\.)*)"|({_TOKEN}))')
_ESCAPE_RE = re.compile(r"\\(.)")
_PLAIN_ENCODINGS = frozenset({"", "7bit", "8bit", "binary"})


class MultipartError(ValueError):
    """The body is not well-formed multipart/form-data; the message says where."""


@dataclass(frozen=True, slots=True)
class FormPart:
    name: str
    filename: str | None
    content_type: str
    data: bytes


def boundary_of(content_type: str) -> bytes:
    """The boundary parameter of a `multipart/form-data` Content-Type header."""
    boundary = parse_mimetype(content_type).parameters.get("boundary", "")
    raw = boundary.encode("latin-1", errors="replace")
    if not _BOUNDARY_RE.fullmatch(raw):
        raise MultipartError("the Content-Type has no valid boundary parameter")
    return raw


def parse_form(body: bytes, boundary: bytes) -> list[FormPart]:
    """Every part of the body, in order. A preamble before the first delimiter and an epilogue
    after the closing one are ignored, as RFC 2046 says; anything else out of shape raises."""
    delimiter = b"--" + boundary
    if body.startswith(delimiter):
        pos = len(delimiter)
    else:
        found = body.find(b"\r\n" + delimiter)
        if found < 0:
            raise MultipartError("no opening boundary")
        pos = found + 2 + len(delimiter)
    separator = b"\r\n" + delimiter
    parts: list[FormPart] = []
    while True:
        if body.startswith(b"--", pos):
            return parts
        line_end = body.find(b"\r\n", pos)
        if line_end < 0 or body[pos:line_end].strip(b" \t"):
            raise MultipartError("a boundary line has trailing characters")
        start = line_end + 2
        end = body.find(separator, start)
        if end < 0:
            raise MultipartError("a part is not terminated by a boundary")
        if len(parts) == MAX_PARTS:
            raise MultipartError(f"more than {MAX_PARTS} parts")
        parts.append(_part(body, start, end))
        pos = end + len(separator)


def _part(body: bytes, start: int, end: int) -> FormPart:
    if body.startswith(b"\r\n", start):
        head, data_start = b"", start + 2
    else:
        head_end = body.find(b"\r\n\r\n", start, end)
        if head_end < 0:
            raise MultipartError("part headers are not terminated")
        head, data_start = body[start:head_end], head_end + 4
    if len(head) > MAX_HEADER_BYTES:
        raise MultipartError(f"part headers exceed {MAX_HEADER_BYTES} bytes")
    return part_from_headers(_headers(head), body[data_start:end])


def part_from_headers(headers: dict[str, str], data: bytes) -> FormPart:
    """The gateway's policy on one part, its headers parsed (names lower-cased)."""
    disposition = headers.get("content-disposition")
    if disposition is None:
        raise MultipartError("a part has no Content-Disposition header")
    kind, params = _disposition(disposition)
    if kind != "form-data" or not params.get("name"):
        raise MultipartError("a part's Content-Disposition is not form-data with a name")
    encoding = headers.get("content-transfer-encoding", "").strip().lower()
    if encoding not in _PLAIN_ENCODINGS:
        raise MultipartError(f"Content-Transfer-Encoding {encoding!r} is not accepted")
    content_type = headers.get("content-type", "").strip()
    if content_type.lower().startswith("multipart/"):
        raise MultipartError("nested multipart bodies are not accepted")
    return FormPart(params["name"], params.get("filename"), content_type, data)


def _disposition(value: str) -> tuple[str, dict[str, str]]:
    """`form-data; name="image"; filename="a.png"` -> ("form-data", {"name": ..., ...});
    parameter names lower-cased, quoted values unescaped; anything else raises."""
    kind, sep, rest = value.partition(";")
    params: dict[str, str] = {}
    rest = sep + rest
    pos = 0
    while pos < len(rest.rstrip(" \t;")):
        match = _PARAM_RE.match(rest, pos)
        if match is None:
            raise MultipartError("a part's Content-Disposition parameters are malformed")
        name = match.group(1).lower()
        if name in params:
            raise MultipartError(f"a part's Content-Disposition repeats {name!r}")
        quoted = match.group(2)
        if quoted is None:
            params[name] = match.group(3)
        else:
            params[name] = _ESCAPE_RE.sub(r"\1", quoted) if "\\" in quoted else quoted
        pos = match.end()
    return kind.strip().lower(), params


def _headers(head: bytes) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in head.split(b"\r\n") if head else ():
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN_RE.fullmatch(name):
            raise MultipartError("a part header line is malformed")
        try:
            text = value.strip(b" \t").decode("utf-8")
        except UnicodeDecodeError:
            raise MultipartError("a part header is not UTF-8") from None
        if _CONTROL_RE.search(text):
            raise MultipartError("a part header holds control characters")
        key = name.decode("ascii").lower()
        if key in headers:
            raise MultipartError(f"a part repeats its {key} header")
        headers[key] = text
    return headers
