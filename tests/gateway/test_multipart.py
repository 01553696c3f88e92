"""The gateway's in-memory multipart/form-data parser: what real clients send parses to the
same parts; everything malformed raises MultipartError (never anything else). Every test runs
against the gateway's hand-written framing and against the `multipart` package's parser with
the same policy (bench/multipart_library.py, the benchmark's candidate), so a switch between
them is a measured choice with the same behaviour."""

from __future__ import annotations

import random
from collections.abc import Callable

import aiohttp
import pytest
from aiohttp import payload

from bench import multipart_library
from splatq.services.gateway import multipart
from splatq.services.gateway.multipart import MAX_PARTS, FormPart, MultipartError, boundary_of

Parser = Callable[[bytes, bytes], list[FormPart]]


@pytest.fixture(params=[multipart.parse_form, multipart_library.parse_form],
                ids=["hand-written", "multipart-package"])  # fmt: skip
def parse_form(request: pytest.FixtureRequest) -> Parser:
    parser: Parser = request.param
    return parser


PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4 + b"\r\n--not-the-boundary\r\n"


async def _aiohttp_form(params: bytes, image: bytes) -> tuple[bytes, str]:
    """A body as aiohttp's client writes it (FormData -> MultipartWriter)."""
    form = aiohttp.FormData()
    form.add_field("params", params.decode(), content_type="application/json")
    form.add_field("image", image, filename="scene-1.png", content_type="image/png")
    writer = form()
    assert isinstance(writer, payload.Payload)
    chunks: list[bytes] = []

    class Sink:
        async def write(self, data: bytes) -> None:
            chunks.append(bytes(data))

    await writer.write(Sink())  # type: ignore[arg-type]
    return b"".join(chunks), writer.content_type


async def test_what_aiohttp_clients_send_parses_to_the_same_parts(parse_form: Parser) -> None:
    body, content_type = await _aiohttp_form(b'{"quality":"preview"}', PNG)
    params, image = parse_form(body, boundary_of(content_type))
    assert (params.name, params.data, params.content_type) == (
        "params",
        b'{"quality":"preview"}',
        "application/json",
    )
    assert (image.name, image.filename, image.data) == ("image", "scene-1.png", PNG)


def test_preamble_epilogue_quoted_boundary_and_no_content_type(parse_form: Parser) -> None:
    body = (
        b"ignored preamble\r\n--a b\r\n"
        b'Content-Disposition: form-data; name="image"; filename="x.png"\r\n\r\n'
        + PNG
        + b"\r\n--a b--\r\nignored epilogue"
    )
    [part] = parse_form(body, boundary_of('multipart/form-data; boundary="a b"'))
    assert (part.name, part.filename, part.content_type, part.data) == ("image", "x.png", "", PNG)


def test_an_empty_form_has_no_parts(parse_form: Parser) -> None:
    assert parse_form(b"--B--\r\n", b"B") == []


@pytest.mark.parametrize(
    ("content_type", "why"),
    [
        ("multipart/form-data", "no boundary"),
        ("multipart/form-data; boundary=", "empty"),
        ("multipart/form-data; boundary=" + "x" * 71, "too long"),
        ("multipart/form-data; boundary=a@b", "not a boundary character"),
        ("multipart/form-data; boundary=a\x01b", "control character"),
    ],
)
def test_bad_boundaries_are_refused(content_type: str, why: str) -> None:
    with pytest.raises(MultipartError):
        boundary_of(content_type)


DISPOSITION = b'Content-Disposition: form-data; name="image"\r\n'


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"no boundary at all",
        b"--B\r\n--B--\r\n",  # an empty part must still have a CRLF before the delimiter
        b"--B\r\nFalse--B--\r\n",
        b"--B junk\r\n" + DISPOSITION + b"\r\nx\r\n--B--",  # text after a delimiter
        b"--B\r\n" + DISPOSITION + b"\r\nx",  # never terminated
        b"--B\r\n" + DISPOSITION + b"x\r\n--B--",  # headers never end
        b"--B\r\n\r\nx\r\n--B--",  # no Content-Disposition
        b'--B\r\nContent-Disposition: attachment; name="image"\r\n\r\nx\r\n--B--',
        b"--B\r\nContent-Disposition: form-data\r\n\r\nx\r\n--B--",  # no name
        b'--B\r\nContent-Disposition: form-data; name="a\x01b"\r\n\r\nx\r\n--B--\r\n',
        b"--B\r\n" + DISPOSITION + DISPOSITION + b"\r\nx\r\n--B--",  # repeated header
        b"--B\r\nno colon here\r\n\r\nx\r\n--B--",
        b"--B\r\nBad Name: x\r\n" + DISPOSITION + b"\r\nx\r\n--B--",
        b"--B\r\n" + DISPOSITION + b"X-Note: \xff\xfe\r\n\r\nx\r\n--B--",  # not UTF-8
        b"--B\r\n" + DISPOSITION + b"Content-Type: multipart/mixed; boundary=C\r\n\r\nx\r\n--B--",
        b"--B\r\n" + DISPOSITION + b"Content-Transfer-Encoding: base64\r\n\r\neA==\r\n--B--",
        b"--B\r\nX-Pad: " + b"p" * 9000 + b"\r\n" + DISPOSITION + b"\r\nx\r\n--B--",
        b"".join(b"--B\r\n" + DISPOSITION + b"\r\nx\r\n" for _ in range(MAX_PARTS + 1)) + b"--B--",
    ],
)
def test_malformed_bodies_raise_multipart_error(parse_form: Parser, body: bytes) -> None:
    with pytest.raises(MultipartError):
        parse_form(body, b"B")


async def test_any_truncation_or_byte_flip_raises_only_multipart_error(parse_form: Parser) -> None:
    """Damaged versions of a real body either still parse or raise MultipartError."""
    body, content_type = await _aiohttp_form(b'{"quality":"full"}', PNG[:64])
    boundary = boundary_of(content_type)
    rng = random.Random(7)
    damaged = [body[:cut] for cut in range(len(body))]
    for _ in range(2000):
        flipped = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        damaged.append(bytes(flipped))
    parsed = 0
    for candidate in damaged:
        try:
            parse_form(candidate, boundary)
            parsed += 1
        except MultipartError:
            pass
    assert parsed < len(damaged)  # the damage is seen, not parsed past


@pytest.mark.parametrize(
    ("disposition", "name", "filename"),
    [
        (b'form-data; name="image"; filename="a.png"', "image", "a.png"),
        (b"form-data;name=image;filename=a.png", "image", "a.png"),
        (b'Form-Data; NAME="image"; filename="say \\"hi\\".png";', "image", 'say "hi".png'),
        (b"form-data; name=\"image\"; filename*=UTF-8''sc%C3%A8ne.png", "image", None),
        ('form-data; name="image"; filename="scène.png"'.encode(), "image", "scène.png"),
    ],
)
def test_content_disposition_forms_clients_send(
    parse_form: Parser, disposition: bytes, name: str, filename: str | None
) -> None:
    body = b"--B\r\nContent-Disposition: " + disposition + b"\r\n\r\nx\r\n--B--"
    [part] = parse_form(body, b"B")
    assert (part.name, part.filename, part.data) == (name, filename, b"x")


@pytest.mark.parametrize(
    "disposition",
    [
        b'form-data; name="image"; name="other"',
        b'form-data; name="unterminated',
        b"form-data; name",
        b"form-data; name=a b",
        b"form-data name=image",
        b'form-data; =x; name="image"',
    ],
)
def test_malformed_content_dispositions_raise(parse_form: Parser, disposition: bytes) -> None:
    body = b"--B\r\nContent-Disposition: " + disposition + b"\r\n\r\nx\r\n--B--"
    with pytest.raises(MultipartError):
        parse_form(body, b"B")
