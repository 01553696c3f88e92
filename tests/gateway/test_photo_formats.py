"""Phone photos at the gate: HEIC/HEIF and AVIF accepted behind the same pre-decode structure
checks as PNG/JPEG/WebP, their bombs refused from the boxes alone, and EXIF orientation (a
HEIF's irot/imir) read from the structure the same way the decoders apply it."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pillow_heif
import pytest
from PIL import Image, ImageOps

from splatq.services.gateway import images
from splatq.services.gateway.images import ImageRejected, validate_image
from splatq.shared.images import isobmff
from splatq.shared.images.headers import DEFAULT_MAX_PIXELS, read_header
from splatq.shared.images.orientation import apply
from tests import hostile_inputs as hostile

# An asymmetric 48x30 picture: every one of the eight orientations gives different pixels.
_PIXELS = np.random.default_rng(3).integers(0, 255, (30, 48, 3), dtype=np.uint8)


def _exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def _saved(fmt: str, orientation: int, **params: Any) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(_PIXELS).save(buffer, fmt, exif=_exif(orientation), **params)
    return buffer.getvalue()


def _heic(orientation: int) -> bytes:
    buffer = io.BytesIO()
    pillow_heif.from_pillow(Image.fromarray(_PIXELS)).save(buffer, exif=_exif(orientation))
    return buffer.getvalue()


def reject(data: bytes) -> ImageRejected:
    with pytest.raises(ImageRejected) as caught:
        validate_image(data)
    return caught.value


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_exif_orientation_is_read_from_the_structure_as_pillow_reads_it(
    fmt: str, orientation: int
) -> None:
    """JPEG APP1, PNG eXIf and WebP EXIF: the header's orientation turns the decoded pixels
    exactly as Pillow's exif_transpose does, and the limits see the upright size."""
    data = _saved(fmt, orientation, **({"lossless": True} if fmt == "WEBP" else {}))
    header = read_header(data)
    assert header.orientation == orientation
    with Image.open(io.BytesIO(data)) as image:
        expected = np.asarray(ImageOps.exif_transpose(image).convert("RGB"))
        decoded = np.asarray(image.convert("RGB"))
    assert np.array_equal(apply(decoded, header.orientation), expected)
    assert header.upright_size == (expected.shape[1], expected.shape[0])
    assert validate_image(data).orientation == orientation


@pytest.mark.parametrize("orientation", range(1, 9))
def test_avif_transforms_become_the_orientation_pillow_reports(orientation: int) -> None:
    """Pillow writes EXIF orientation as irot/imir and does not apply them when decoding:
    the orientation composed from the boxes is the one it reports."""
    data = _saved("AVIF", orientation, quality=90)
    header = read_header(data)
    assert header.format.name == "AVIF"
    with Image.open(io.BytesIO(data)) as image:
        assert header.orientation == image.getexif().get(0x0112, 1) == orientation
        assert image.size == (header.width, header.height)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_heic_is_decoded_upright_by_libheif_and_needs_no_turn(orientation: int) -> None:
    """pillow-heif stores EXIF orientation as irot/imir and libheif applies them: the header
    says 1 with the turned size, and the decoded picture is the upright one."""
    data = _heic(orientation)
    header = read_header(data)
    assert (header.format.name, header.orientation) == ("HEIF", 1)
    upright = apply(_PIXELS, orientation)
    decoded = np.asarray(pillow_heif.open_heif(io.BytesIO(data)))
    assert decoded.shape[:2] == upright.shape[:2]
    assert header.width >= decoded.shape[1]
    assert header.height >= decoded.shape[0]
    # lossy: the right turn is far closer than any other
    errors = {
        o: float(np.abs(decoded.astype(int) - apply(_PIXELS, o).astype(int)).mean())
        for o in range(1, 9)
        if apply(_PIXELS, o).shape == decoded.shape
    }
    assert min(errors, key=errors.__getitem__) == orientation


def test_heic_and_avif_and_a_tiled_heic_are_accepted() -> None:
    """Real files: a HEIC, a HEIC stored as a grid of 512 px tiles (as phones do), an AVIF."""
    assert validate_image(hostile.heic_photo()).mime == "image/heic"
    grid = hostile.heic_photo(1100, 700, tile_size=512)
    layout = isobmff.read_layout(grid)
    assert (layout.primary_type, layout.tiles) == ("grid", 6)
    accepted = validate_image(grid)
    assert (accepted.width, accepted.height, accepted.extension) == (1100, 700, "heic")
    avif = validate_image(hostile.avif_photo())
    assert (avif.mime, avif.extension, avif.width, avif.height) == ("image/avif", "avif", 64, 48)


HEIF_HOSTILE = [
    ("heic_size_bomb", hostile.heic_size_bomb, "image_too_large"),
    ("avif_size_bomb", hostile.avif_size_bomb, "image_too_large"),
    ("heic_pixel_bomb", lambda: hostile.heic_size_bomb(12_000), "image_too_large"),
    ("heif_item_flood", hostile.heif_item_flood, "image_too_complex"),
    ("heif_grid_bomb", hostile.heif_grid_bomb, "image_too_complex"),
    ("heif_boxes_past_end", hostile.heif_boxes_past_end, "invalid_image"),
    ("heif_truncated", hostile.heif_truncated, "invalid_image"),
]


@pytest.mark.parametrize(
    ("factory", "code"), [pytest.param(f, c, id=n) for n, f, c in HEIF_HOSTILE]
)
def test_heif_bombs_are_refused_from_the_boxes_before_any_decoder(
    factory: Any, code: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Declared sizes, item and tile floods, boxes and data past the end: refused by the
    pre-decode gate with their code, no decoder (pillow-heif, Pillow) ever opened."""
    data = factory()

    def no_decoder(*args: object, **kwargs: object) -> None:
        raise AssertionError("a decoder was opened")

    monkeypatch.setattr(pillow_heif, "open_heif", no_decoder)
    monkeypatch.setattr(Image, "open", no_decoder)
    assert reject(data).code == code
    assert len(data) < 200_000


def test_the_default_pixel_limit_admits_phone_photos() -> None:
    """48, 50 and 64 MP main cameras fit the default; the limit is judged upright."""
    assert DEFAULT_MAX_PIXELS >= 9248 * 6936
    limits = images.decode_limits(DEFAULT_MAX_PIXELS, images.DEFAULT_MAX_DECODE_BYTES, 32)
    header = images.inspect_upload(hostile.jpeg_header_flood(8064, 6048), limits)
    assert header.pixels == 8064 * 6048


def test_a_heic_is_judged_at_its_decode_peak_and_a_50_mp_one_fits_the_default() -> None:
    """A HEIC decodes whole, libheif's planes beside the RGB image: measured ~6 bytes a pixel
    at the peak (docs/benchmarks.md), so the decoded-bytes limit counts 6, and the default
    still admits a 50 MP phone photo (8160 x 6120)."""
    data = _heic(1)
    header = read_header(data)
    assert header.decode_bytes == header.width * header.height * 6
    assert images.DEFAULT_MAX_DECODE_BYTES >= 8160 * 6120 * 6
    assert validate_image(data, max_decode_bytes=header.decode_bytes).width == header.width
    with pytest.raises(ImageRejected) as caught:
        validate_image(data, max_decode_bytes=header.decode_bytes - 1)
    assert caught.value.code == "image_too_large"
