"""Upload validation: every corpus item gets its contract code, valid images pass, and no
input bytes make validate_image raise anything but ImageRejected.

Decisions pinned here:
- The format is decided by magic bytes alone. Bytes without PNG/JPEG/WebP magic are 415
  (unsupported_media_type), random bytes included: nothing else is ever handed to a decoder,
  so "some format we do not take" and "not an image at all" are the same answer.
- Bytes WITH one of our magics that do not decode completely are 422 invalid_image: a
  truncated file, a wrong body behind the magic, and the PNG-signature-then-ZIP polyglot.
- A complete valid PNG with a ZIP appended after IEND is accepted: the image is intact, and
  refusing trailing bytes would turn away files from sloppy encoders. It is stored under its
  sniffed type only, and the digest covers every byte.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import pickle
import random
import struct
import time
import tracemalloc
import warnings
import zipfile
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from PIL import Image, ImageFile

from splatq.services.gateway import images
from splatq.services.gateway.images import (
    ImageRejected,
    ValidatedImage,
    sniff_format,
    validate_image,
)
from tests import hostile_inputs as hostile
from tests.gateway import corpus

Factory = Callable[[], bytes]

REJECTED: list[tuple[str, Factory, str, int]] = [
    ("empty", corpus.empty, "invalid_image", 422),
    ("truncated_png", corpus.truncated_png, "invalid_image", 422),
    ("truncated_jpeg", corpus.truncated_jpeg, "invalid_image", 422),
    ("zero_width_png", corpus.zero_width_png, "invalid_image", 422),
    ("jpeg_magic_png_body", corpus.jpeg_magic_png_body, "invalid_image", 422),
    ("polyglot_png_zip", corpus.polyglot, "invalid_image", 422),
    ("polyglot_gif_js", corpus.gif_js_polyglot, "unsupported_media_type", 415),
    ("gif_1x1", corpus.gif_1x1, "unsupported_media_type", 415),
    ("bmp_1x1", corpus.bmp_1x1, "unsupported_media_type", 415),
    ("tiff_1x1", corpus.tiff_1x1, "unsupported_media_type", 415),
    ("pdf", corpus.pdf_1x1, "unsupported_media_type", 415),
    ("svg", corpus.svg, "unsupported_media_type", 415),
    ("heic_without_meta", corpus.heic_header, "invalid_image", 422),
    ("mp4_ftyp", corpus.mp4_header, "unsupported_media_type", 415),
    ("random_0", lambda: corpus.random_bytes(4096, 0), "unsupported_media_type", 415),
    ("random_1", lambda: corpus.random_bytes(17, 1), "unsupported_media_type", 415),
    ("random_2", lambda: corpus.random_bytes(1, 2), "unsupported_media_type", 415),
    ("huge_png_header", corpus.huge_png_header, "image_too_large", 422),
    ("huge_jpeg_header", corpus.huge_jpeg_header, "image_too_large", 422),
    ("huge_webp_header", corpus.huge_webp_header, "image_too_large", 422),
    ("bomb_png", corpus.bomb_png, "image_too_large", 422),
]

OVERSIZED: list[tuple[str, Factory]] = [
    ("huge_png_header", lambda: corpus.huge_png_header(30_000, 30_000)),
    ("huge_jpeg_header", lambda: corpus.huge_jpeg_header(30_000, 30_000)),
    ("huge_webp_header", lambda: corpus.huge_webp_header(12_000, 12_000)),
    ("bomb_png", lambda: corpus.bomb_png(20_000, 20_000)),
    ("bomb_png_under_side_limit", lambda: corpus.bomb_png(10_000, 10_000)),
]


def pillow_images_created() -> int:
    """How many images Pillow's C core has allocated in this process so far."""
    return int(Image.core.get_stats()["new_count"])  # type: ignore[attr-defined]


def reject(data: bytes, **limits: int) -> ImageRejected:
    """The ImageRejected that validate_image raises for `data` (fails the test if it passes)."""
    with pytest.raises(ImageRejected) as info:
        validate_image(data, **limits)
    return info.value


@pytest.mark.parametrize(
    ("factory", "code", "status"),
    [pytest.param(f, c, s, id=name) for name, f, c, s in REJECTED],
)
def test_corpus_item_gets_its_code_and_status(factory: Factory, code: str, status: int) -> None:
    """Each malformed, foreign or oversized corpus item is refused with the contract's code."""
    exc = reject(factory())
    assert (exc.code, exc.status) == (code, status)
    assert exc.detail
    assert code in str(exc)


@pytest.mark.parametrize("factory", [pytest.param(f, id=name) for name, f in OVERSIZED])
def test_oversized_headers_are_refused_fast_without_allocating(
    factory: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Declared sizes over the limits are refused from the header: fast, tiny peak, no Pillow."""
    data = factory()  # generated before measuring
    opened: list[object] = []
    real_open = Image.open

    def spy(*args: Any, **kwargs: Any) -> Any:
        opened.append(args)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(Image, "open", spy)
    pillow_images_before = pillow_images_created()
    tracemalloc.start()
    started = time.perf_counter()
    try:
        exc = reject(data)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert exc.code == "image_too_large"
    assert elapsed < 1.0
    assert peak < 50 * 1024 * 1024  # Python heap; the two checks below cover Pillow's C heap
    assert opened == []
    assert pillow_images_created() == pillow_images_before


def test_the_bomb_is_small_and_real() -> None:
    """bomb_png is under 1 MB yet its IDAT inflates to the full 20000x20000 1-bit raster."""
    data = corpus.bomb_png(20_000, 20_000)
    assert len(data) < 1024 * 1024
    width, height, bit_depth = struct.unpack_from(">IIB", data, 16)
    assert (width, height, bit_depth) == (20_000, 20_000, 1)
    idat = data.index(b"IDAT")
    (length,) = struct.unpack_from(">I", data, idat - 4)
    raw = zlib.decompress(data[idat + 4 : idat + 4 + length])
    assert len(raw) == height * (1 + width // 8)
    assert raw.count(0) == len(raw)


def test_pixel_limit_applies_when_no_side_is_too_long() -> None:
    """A bomb with both sides under max_side is still refused on its pixel count."""
    exc = reject(corpus.bomb_png(10_000, 10_000))
    assert exc.code == "image_too_large"
    assert "100000000 pixels" in exc.detail
    exc = reject(corpus.bomb_png(20_000, 20_000), max_side=1_000_000)
    assert "400000000 pixels" in exc.detail


def test_limits_are_arguments() -> None:
    """max_pixels and max_side are per call: the same image passes or not depending on them."""
    data = corpus.valid_png(64, 48)
    assert validate_image(data, max_pixels=64 * 48, max_side=64).width == 64
    assert reject(data, max_pixels=64 * 48 - 1).code == "image_too_large"
    assert reject(data, max_side=63).code == "image_too_large"


def test_pillow_global_limit_still_applies_when_stricter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Image.MAX_IMAGE_PIXELS is read, never written: when it is lower it wins."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000)
    assert validate_image(corpus.valid_png(20, 20)).width == 20
    assert reject(corpus.valid_png(40, 40)).code == "image_too_large"
    assert Image.MAX_IMAGE_PIXELS == 1_000


class TestPillowsOwnBombChecks:
    """With the header pre-check out of the way, Pillow's bomb signals map to image_too_large."""

    @pytest.fixture(autouse=True)
    def _no_header_precheck(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(images, "check_limits", lambda header, limits: None)

    def test_decompression_bomb_error(self) -> None:
        """Over twice MAX_IMAGE_PIXELS Pillow's open raises DecompressionBombError."""
        exc = reject(corpus.bomb_png(20_000, 20_000), max_side=1_000_000)
        assert exc.code == "image_too_large"
        assert isinstance(exc.__cause__, Image.DecompressionBombError)

    def test_decompression_bomb_warning(self) -> None:
        """Between 1x and 2x Pillow only warns; the size check after open refuses it."""
        with pytest.warns(Image.DecompressionBombWarning):
            exc = reject(corpus.huge_webp_header(12_000, 12_000), max_pixels=10**12)
        assert exc.code == "image_too_large"

    @pytest.mark.filterwarnings("error::PIL.Image.DecompressionBombWarning")
    def test_decompression_bomb_warning_as_error(self) -> None:
        """Where warnings are errors (python -W error) the raised warning maps the same way."""
        exc = reject(corpus.huge_webp_header(12_000, 12_000), max_pixels=10**12)
        assert exc.code == "image_too_large"
        assert isinstance(exc.__cause__, Image.DecompressionBombWarning)


def _palette_png_with_transparency() -> bytes:
    """A palette PNG with a tRNS chunk (alpha without an alpha channel)."""
    image = Image.new("P", (8, 8), 1)
    buffer = io.BytesIO()
    image.save(buffer, "PNG", transparency=0)
    return buffer.getvalue()


def _greyscale_png() -> bytes:
    """An 8-bit greyscale PNG."""
    buffer = io.BytesIO()
    Image.new("L", (5, 7), 128).save(buffer, "PNG")
    return buffer.getvalue()


VALID: list[tuple[str, Factory, str, str, int, int, bool]] = [
    ("png_rgb", lambda: corpus.valid_png(64, 48), "image/png", "png", 64, 48, False),
    ("png_rgba", lambda: corpus.valid_png(33, 17, alpha=True), "image/png", "png", 33, 17, True),
    ("png_palette_trns", _palette_png_with_transparency, "image/png", "png", 8, 8, True),
    ("png_grey", _greyscale_png, "image/png", "png", 5, 7, False),
    ("jpeg", lambda: corpus.valid_jpeg(64, 48), "image/jpeg", "jpg", 64, 48, False),
    ("jpeg_mpo", corpus.mpo_jpeg, "image/jpeg", "jpg", 32, 24, False),
    ("webp", lambda: corpus.valid_webp(64, 48), "image/webp", "webp", 64, 48, False),
    ("webp_alpha", lambda: corpus.valid_webp(20, 10, True), "image/webp", "webp", 20, 10, True),
    ("webp_animated", lambda: corpus.huge_webp_header(40, 30), "image/webp", "webp", 40, 30, False),
    ("png_with_appended_zip", corpus.png_with_appended_zip, "image/png", "png", 64, 48, False),
]


@pytest.mark.parametrize(
    ("factory", "mime", "extension", "width", "height", "has_alpha"),
    [pytest.param(*row[1:], id=row[0]) for row in VALID],
)
def test_valid_images_pass(
    factory: Factory, mime: str, extension: str, width: int, height: int, has_alpha: bool
) -> None:
    """PNG, JPEG and WebP pass with the right mime, extension, size, alpha flag and digest."""
    data = factory()
    result = validate_image(data)
    assert result == ValidatedImage(
        mime=mime,
        extension=extension,
        width=width,
        height=height,
        has_alpha=has_alpha,
        sha256=hashlib.sha256(data).hexdigest(),
    )
    assert sniff_format(data) == (mime, extension)


def test_validated_image_is_frozen() -> None:
    """A ValidatedImage cannot be altered after validation."""
    result = validate_image(corpus.valid_png())
    with pytest.raises(AttributeError):
        result.width = 1  # type: ignore[misc]


def test_sniff_format_reads_magic_only() -> None:
    """sniff_format knows the three magics and nothing else, not even their prefixes."""
    assert sniff_format(corpus.valid_png()) == ("image/png", "png")
    assert sniff_format(corpus.valid_jpeg()) == ("image/jpeg", "jpg")
    assert sniff_format(corpus.valid_webp()) == ("image/webp", "webp")
    assert sniff_format(corpus.truncated_png()) == ("image/png", "png")  # magic, not validity
    for data in (
        b"",
        b"\x89PNG",
        b"\xff\xd8",
        b"RIFF\x00\x00\x00\x00WAVE",
        corpus.gif_1x1(),
        corpus.svg(),
        corpus.random_bytes(64, 3),
    ):
        assert sniff_format(data) is None


def test_polyglots_are_what_they_claim() -> None:
    """The corpus polyglots really are two things at once (so the verdicts above mean something)."""
    png_zip = zipfile.ZipFile(io.BytesIO(corpus.polyglot()))
    assert png_zip.read("index.html") == corpus.HTML_PAYLOAD
    assert corpus.polyglot().startswith(corpus.PNG_SIGNATURE)
    with Image.open(io.BytesIO(corpus.gif_js_polyglot())) as gif:
        assert gif.format == "GIF"
    assert corpus.gif_js_polyglot().endswith(b"*/=alert(1);")
    appended = zipfile.ZipFile(io.BytesIO(corpus.png_with_appended_zip()))
    assert appended.namelist() == ["index.html"]


def test_decoded_format_must_match_the_magic(monkeypatch: pytest.MonkeyPatch) -> None:
    """Were Pillow to identify PNG-magic bytes as another format, the upload is invalid_image."""
    real_open = Image.open
    gif = corpus.gif_1x1()
    monkeypatch.setattr(Image, "open", lambda *args, **kwargs: real_open(io.BytesIO(gif)))
    exc = reject(corpus.valid_png())
    assert exc.code == "invalid_image"
    assert "decodes as GIF" in exc.detail


@pytest.mark.parametrize("error", [KeyError("x"), ZeroDivisionError(), IndexError(), MemoryError()])
def test_unexpected_decoder_errors_are_invalid_image(
    error: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception of any kind from inside a decoder still leaves as invalid_image."""

    def broken_load(self: ImageFile.ImageFile) -> None:
        raise error

    monkeypatch.setattr(ImageFile.ImageFile, "load", broken_load)
    exc = reject(corpus.valid_jpeg())
    assert exc.code == "invalid_image"
    assert exc.__cause__ is error


def _mutate(data: bytes, rng: random.Random) -> bytes:
    """One random mutation: bit flips, truncation, overwrite, deletion or duplication."""
    buf = bytearray(data)
    kind = rng.randrange(5)
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
    elif kind == 1:
        del buf[rng.randrange(len(buf)) :]
    elif kind == 2:
        i = rng.randrange(len(buf))
        buf[i : i + rng.randint(1, 16)] = rng.randbytes(rng.randint(1, 16))
    elif kind == 3:
        i = rng.randrange(len(buf))
        del buf[i : i + rng.randint(1, 64)]
    else:
        i = rng.randrange(len(buf))
        buf[i:i] = buf[i : i + rng.randint(1, 64)]
    return bytes(buf)


@pytest.mark.parametrize(
    "factory",
    [
        pytest.param(lambda: corpus.valid_png(48, 32), id="png"),
        pytest.param(lambda: corpus.valid_png(24, 16, alpha=True), id="png_alpha"),
        pytest.param(lambda: corpus.valid_jpeg(48, 32), id="jpeg"),
        pytest.param(lambda: corpus.valid_webp(48, 32), id="webp"),
    ],
)
def test_500_mutations_only_ever_give_a_result_or_image_rejected(factory: Factory) -> None:
    """Bit flips and truncations of a valid image never make validate_image raise anything else."""
    rng = random.Random(20240611)
    base = factory()
    outcomes: dict[str, int] = {}
    for _ in range(500):
        data = _mutate(base, rng)
        rejected: ImageRejected | None = None
        try:
            result = validate_image(data)
        except ImageRejected as exc:
            rejected = exc
        if rejected is None:
            assert result.sha256 == hashlib.sha256(data).hexdigest()
            outcomes["accepted"] = outcomes.get("accepted", 0) + 1
        else:
            assert images._STATUS[rejected.code] == rejected.status
            outcomes[rejected.code] = outcomes.get(rejected.code, 0) + 1
    assert outcomes.get("invalid_image", 0) > 50  # the mutations did reach the decoders


def test_pillow_globals_are_left_alone() -> None:
    """Validating the whole corpus changes neither Pillow's globals nor the warning filters."""
    pixels, truncated = Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES
    filters = list(warnings.filters)
    for factory in [row[1] for row in REJECTED] + [row[1] for row in VALID]:
        with contextlib.suppress(ImageRejected):
            validate_image(factory())
    assert pixels == Image.MAX_IMAGE_PIXELS
    assert ImageFile.LOAD_TRUNCATED_IMAGES is truncated is False
    assert warnings.filters == filters


def test_refuses_to_run_with_load_truncated_images(monkeypatch: pytest.MonkeyPatch) -> None:
    """If the process set LOAD_TRUNCATED_IMAGES, validation fails loudly instead of passing
    truncated uploads (a deployment bug: RuntimeError, not a client error)."""
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(RuntimeError, match="LOAD_TRUNCATED_IMAGES"):
        validate_image(corpus.truncated_png())


def test_image_rejected_carries_the_contract() -> None:
    """ImageRejected maps each code to its status, refuses unknown codes, and pickles."""
    assert ImageRejected("invalid_image", "x").status == 422
    assert ImageRejected("image_too_large", "x").status == 422
    assert ImageRejected("unsupported_media_type", "x").status == 415
    with pytest.raises(ValueError, match="unknown rejection code"):
        ImageRejected("teapot", "x")  # type: ignore[arg-type]
    copy = pickle.loads(pickle.dumps(ImageRejected("image_too_large", "too big")))
    assert (copy.code, copy.status, copy.detail) == ("image_too_large", 422, "too big")


def test_concurrent_threads_get_the_same_answers() -> None:
    """From 8 threads at once (as the gateway calls it) every input gets its sequential answer."""

    def answer(data: bytes) -> str:
        try:
            return validate_image(data).sha256
        except ImageRejected as exc:
            return exc.code

    inputs = [row[1]() for row in REJECTED] + [row[1]() for row in VALID]
    expected = [answer(data) for data in inputs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(5):
            assert list(pool.map(answer, inputs)) == expected


# -- hostile inputs (tests/hostile_inputs.py): bounded before any decoder runs -------------


def cpu_seconds(fn: Callable[[], object]) -> float:
    """Process CPU time (user + system, every thread) that fn() costs, whatever it returns."""
    started = time.process_time()
    with contextlib.suppress(ImageRejected):
        fn()
    return time.process_time() - started


def test_jpeg_scan_bomb_is_refused_before_decoding() -> None:
    """A 150 kB progressive JPEG with its last scan repeated 1000 times is image_too_complex,
    in milliseconds of CPU and without Pillow allocating an image (today: ~10 s, accepted)."""
    data = hostile.jpeg_scan_bomb(1000)
    assert hostile.jpeg_scan_count(data) == 1010
    before = pillow_images_created()
    assert cpu_seconds(lambda: validate_image(data)) < 0.05
    exc = reject(data)
    assert (exc.code, exc.status) == ("image_too_complex", 422)
    assert "32 scans" in exc.detail
    assert pillow_images_created() == before


def test_the_scan_limit_is_exact_and_an_argument() -> None:
    """32 scans pass by default and 33 do not; max_jpeg_scans moves the line."""
    at_limit, over = hostile.jpeg_scan_bomb(22), hostile.jpeg_scan_bomb(23)
    assert (hostile.jpeg_scan_count(at_limit), hostile.jpeg_scan_count(over)) == (32, 33)
    assert validate_image(at_limit).width == 4000
    assert reject(over).code == "image_too_complex"
    assert validate_image(over, max_jpeg_scans=33).width == 4000
    assert reject(hostile.progressive_jpeg(), max_jpeg_scans=9).code == "image_too_complex"


def test_a_standard_progressive_jpeg_is_accepted_at_its_stored_size() -> None:
    """libjpeg's ten-scan progression passes; decoding at 1/8 scale still reports 4000x4000."""
    result = validate_image(hostile.progressive_jpeg())
    assert (result.mime, result.width, result.height) == ("image/jpeg", 4000, 4000)


def test_scan_limit_work_is_bounded() -> None:
    """At the scan limit a 16-megapixel progressive JPEG costs well under a second of CPU."""
    assert cpu_seconds(lambda: validate_image(hostile.jpeg_scan_bomb(22))) < 1.0


def test_png_pixel_flood_is_refused_on_its_decoded_bytes() -> None:
    """A few-hundred-kB 8900x8900 RGBA PNG (under the pixel limit) is image_too_large on the
    memory bound, before Pillow allocates its 302 MiB; as 8-bit grey (76 MiB) it passes."""
    data = hostile.png_flood(8900)
    before = pillow_images_created()
    exc = reject(data)
    assert (exc.code, exc.status) == ("image_too_large", 422)
    assert "decodes to 316840000 bytes" in exc.detail
    assert pillow_images_created() == before
    assert validate_image(hostile.png_flood(8900, colour_type=0)).width == 8900
    assert reject(data, max_decode_bytes=8900 * 8900 * 4 - 1).code == "image_too_large"


@pytest.mark.parametrize(
    ("factory", "code"),
    [
        pytest.param(hostile.png_header_flood, "image_too_large", id="png_header_flood"),
        pytest.param(hostile.jpeg_header_flood, "image_too_large", id="jpeg_header_flood"),
        pytest.param(hostile.png_size_disagrees_with_data, "invalid_image", id="png_short_data"),
        *(
            pytest.param(lambda d=d: d, "invalid_image", id=name)
            for name, d in hostile.truncated_headers().items()
        ),
        *(
            pytest.param(
                lambda d=d: d,
                "unsupported_media_type" if sniff_format(d) is None else "invalid_image",
                id=name,
            )
            for name, d in hostile.wrong_magic().items()
        ),
    ],
)
def test_hostile_headers_get_their_code_without_a_decoder(factory: Factory, code: str) -> None:
    """Floods, cut headers and wrong magic are refused from the structure: no Pillow image."""
    data = factory()
    before = pillow_images_created()
    assert reject(data).code == code
    assert pillow_images_created() == before


def test_png_whose_data_is_shorter_than_its_header_is_invalid() -> None:
    """Pillow zero-fills the missing rows and calls such a PNG whole; the gateway does not."""
    exc = reject(hostile.png_size_disagrees_with_data(64))
    assert exc.code == "invalid_image"
    assert "64x128" in exc.detail


def _interlaced_png(width: int, height: int) -> bytes:
    """A valid Adam7-interlaced 8-bit grey PNG (Pillow cannot write one), all zeros."""
    raw = b""
    for x, y, dx, dy in images._ADAM7:
        w, h = (width - x + dx - 1) // dx, (height - y + dy - 1) // dy
        raw += bytes(h * (1 + w)) if w and h else b""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 1)
    chunks = corpus.png_chunk(b"IHDR", ihdr) + corpus.png_chunk(b"IDAT", zlib.compress(raw))
    return corpus.PNG_SIGNATURE + chunks + corpus.png_chunk(b"IEND", b"")


@pytest.mark.parametrize(("width", "height"), [(13, 7), (1, 1), (3, 50), (64, 48)])
def test_interlaced_pngs_are_not_mistaken_for_short_data(width: int, height: int) -> None:
    """The raw-length check counts the seven Adam7 passes: interlaced PNGs pass, and one row
    short is refused."""
    data = _interlaced_png(width, height)
    assert validate_image(data).width == width
    ihdr = struct.pack(">IIBBBBB", width, height + 1, 8, 0, 0, 0, 1)
    idat_at = data.index(b"IDAT") - 4
    taller = corpus.PNG_SIGNATURE + corpus.png_chunk(b"IHDR", ihdr) + data[idat_at:]
    assert reject(taller).code == "invalid_image"


def test_segment_and_chunk_spam_is_image_too_complex() -> None:
    """Thousands of tiny JPEG COM segments or PNG tEXt chunks (each one a Python step in
    Pillow) are refused past the structure limits, cheaply."""
    jpeg = hostile.small_jpeg()
    spam_jpeg = jpeg[:2] + b"\xff\xfe\x00\x03x" * 100_000 + jpeg[2:]
    png = hostile.small_png()
    idat_at = png.index(b"IDAT") - 4
    spam_png = png[:idat_at] + corpus.png_chunk(b"tEXt", b"a\x00b") * 100_000 + png[idat_at:]
    for data in (spam_jpeg, spam_png):
        assert cpu_seconds(functools.partial(validate_image, data)) < 0.5
        assert reject(data).code == "image_too_complex"


def test_the_gate_runs_once_and_the_decode_reuses_its_header() -> None:
    """inspect_upload refuses a scan bomb with no Pillow image; for a valid upload,
    decode_upload on its header answers exactly what validate_image does."""
    limits = images.decode_limits(images.DEFAULT_MAX_PIXELS, images.DEFAULT_MAX_DECODE_BYTES, 32)
    bomb, short = hostile.jpeg_scan_bomb(40, side=64), hostile.png_size_disagrees_with_data()
    before = pillow_images_created()
    with pytest.raises(ImageRejected) as info:
        images.inspect_upload(bomb, limits)
    assert info.value.code == "image_too_complex"
    with pytest.raises(ImageRejected) as info:
        images.decode_upload(short, images.inspect_upload(short, limits), images.DEFAULT_MAX_PIXELS)
    assert info.value.code == "invalid_image"
    assert pillow_images_created() == before
    for data in (corpus.valid_png(32, 32, alpha=True), hostile.small_jpeg(), corpus.valid_png()):
        header = images.inspect_upload(data, limits)
        assert images.decode_upload(data, header, images.DEFAULT_MAX_PIXELS) == validate_image(data)


def test_only_tiny_uploads_are_decoded_inline() -> None:
    """Inline (on the event loop) only up to INLINE_MAX_BYTES and pixels x scans up to
    INLINE_MAX_PIXEL_SCANS: a 32x32 PNG is, a 64x65 one, a large file or a many-scan JPEG
    of the same size is not."""
    limits = images.decode_limits(images.DEFAULT_MAX_PIXELS, images.DEFAULT_MAX_DECODE_BYTES, 32)

    def inline(data: bytes) -> bool:
        return images.decodes_inline(data, images.inspect_upload(data, limits))

    small = corpus.valid_png(32, 32)
    assert len(small) <= images.INLINE_MAX_BYTES
    assert inline(small)
    assert inline(hostile.small_jpeg(16))
    assert not inline(corpus.valid_png(64, 65))
    assert not inline(small + b"\x00" * images.INLINE_MAX_BYTES)  # trailing bytes count
    progressive = hostile.small_jpeg(32, progressive=True)
    scans = hostile.jpeg_scan_count(progressive)
    assert scans * 32 * 32 > images.INLINE_MAX_PIXEL_SCANS
    assert not inline(progressive)
