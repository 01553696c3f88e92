"""Stage 0, shared by every model: the object separated from its backdrop and recentred.

The input's own alpha when it is a cut-out, else the configured remover (the built-in GrabCut
or a learned ONNX one) finds the object's mask; the model's square is then cut around the
object's box with a margin, so a small object in a large frame fills the model's input. The
model gets RGBA whose alpha is that mask (the plug-in interface's channel 3); the job records
where the mask came from (`foreground`) and the mask itself (the `mask` artifact).

Pure (bytes in, tensors and a PNG out); the removers are loaded once per worker process.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from splatq.services.gpu_worker.images import (
    Photo,
    border_colour,
    decode_image,
    decode_photo,
)
from splatq.services.gpu_worker.remover import (
    FROM_ALPHA,
    ConfigurationError,
    Remover,
)
from splatq.shared.images.headers import DecodeLimits
from splatq.shared.settings import Settings

# Alpha is a cut-out when any pixel is visibly transparent (the builtin model's rule): an
# image saved with a solid alpha channel is segmented like one without.
CUTOUT_ALPHA = 0.99
# The remover and recentring work on the photo at this long side (or twice the model's
# resolution, when larger): fine enough that a small object's crop still has detail.
WORK_SIDE = 1024
MASK_THRESHOLD = 0.5


@dataclass(frozen=True)
class PreparedInput:
    """What ingest hands the model: one [4, R, R] RGBA tensor per resolution (alpha: the
    mask), where the mask came from (None: SPLATQ_FOREGROUND=none, the whole frame), the
    mask as a PNG in the upright photo's frame, and the model square's place in that frame
    ((x0, y0, side) in the photo's pixels, `photo_size` = (width, height))."""

    images: Mapping[int, torch.Tensor]
    foreground: str | None
    mask_png: bytes | None
    crop: tuple[int, int, int] | None
    photo_size: tuple[int, int]


def load_remover(settings: Settings) -> Remover | None:
    """The remover SPLATQ_FOREGROUND names, loaded now (a worker's startup): None for
    `none`. `learned` needs SPLATQ_FOREGROUND_MODEL, a local ONNX file, and the `learned`
    extra (onnxruntime); without either it is a ConfigurationError -- weights are never
    downloaded."""
    if settings.foreground == "none":
        return None
    if settings.foreground == "segment":
        from splatq.services.gpu_worker.segment_grabcut import GrabCutRemover  # noqa: PLC0415

        return GrabCutRemover()
    path = settings.foreground_model
    if not path or not Path(path).is_file():
        raise ConfigurationError(
            "SPLATQ_FOREGROUND=learned needs SPLATQ_FOREGROUND_MODEL, the path of a local"
            f" ONNX background remover (e.g. a BiRefNet or U2-Net export); got {path!r}, which"
            " is not a file. Weights are never downloaded: put the file there, or use"
            " SPLATQ_FOREGROUND=segment"
        )
    try:
        from splatq.services.gpu_worker.learned_remover import OnnxRemover  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigurationError(
            f"SPLATQ_FOREGROUND=learned needs onnxruntime: pip install 'splatq[learned]' ({exc})"
        ) from None
    return OnnxRemover(Path(path), normalisation=settings.foreground_normalisation)


def remover_version(remover: Remover | None) -> str:
    return "none" if remover is None else remover.version


def prepare_input(
    data: bytes,
    resolutions: Sequence[int],
    limits: DecodeLimits,
    remover: Remover | None,
    margin: float = 0.1,
) -> PreparedInput:
    """Decode once, find the object, cut the model's square around it and make each
    resolution's tensor from that one square (a progressive job's quick image included)."""
    if remover is None:
        images = {r: decode_image(data, r, limits) for r in resolutions}
        return PreparedInput(images, None, None, None, (0, 0))
    photo = decode_photo(data, max(WORK_SIDE, 2 * max(resolutions)), limits)
    mask, source = find_foreground(photo, remover)
    height, width = mask.shape
    crop = object_square(mask > MASK_THRESHOLD, margin)
    images = {r: square_input(photo, mask, crop, r) for r in resolutions}
    return PreparedInput(images, source, mask_png(mask), crop, (width, height))


def find_foreground(photo: Photo, remover: Remover) -> tuple[np.ndarray, str]:
    """([H, W] float32 mask in [0, 1], its source): the photo's alpha when it is a cut-out,
    else the remover's answer. A remover that finds nothing leaves the whole frame."""
    alpha = photo.rgba[..., 3]
    if photo.has_alpha and alpha.min() < CUTOUT_ALPHA * 255:
        return alpha.astype(np.float32) / 255.0, FROM_ALPHA
    mask = np.clip(remover.mask(np.ascontiguousarray(photo.rgba[..., :3])), 0.0, 1.0)
    if not (mask > MASK_THRESHOLD).any():
        mask = np.ones_like(mask)
    return mask.astype(np.float32), remover.source


def object_square(mask: np.ndarray, margin: float) -> tuple[int, int, int]:
    """(x0, y0, side): the square centred on the mask's bounding box, its side the box's
    longer side grown by `margin` each way (it may reach past the frame)."""
    ys, xs = np.nonzero(mask)
    if len(xs) == 0:
        height, width = mask.shape
        side = max(width, height)
        return ((width - side) // 2, (height - side) // 2, side)
    x0, x1, y0, y1 = int(xs.min()), int(xs.max()) + 1, int(ys.min()), int(ys.max()) + 1
    side = max(2, round(max(x1 - x0, y1 - y0) * (1.0 + 2.0 * margin)))
    return ((x0 + x1 - side) // 2, (y0 + y1 - side) // 2, side)


def square_input(
    photo: Photo, mask: np.ndarray, crop: tuple[int, int, int], resolution: int
) -> torch.Tensor:
    """[4, R, R] float32: the photo's pixels in the square (outside the frame: its border
    colour) with the mask as alpha, each resampled on its own so the colours behind the
    mask stay the photo's (a model may composite them itself)."""
    x0, y0, side = crop
    box = (x0, y0, x0 + side, y0 + side)
    fill = border_colour(photo.rgba)[:3]
    rgb = _crop(Image.fromarray(photo.rgba[..., :3]), box, fill)
    alpha = _crop(Image.fromarray(np.rint(mask * 255).astype(np.uint8), "L"), box, 0)
    size = (resolution, resolution)
    rgb = rgb.resize(size, Image.Resampling.LANCZOS)
    alpha = alpha.resize(size, Image.Resampling.BILINEAR)
    array = np.concatenate([np.asarray(rgb), np.asarray(alpha)[..., None]], axis=-1)
    return torch.from_numpy(array.astype(np.float32) / 255.0).permute(2, 0, 1).contiguous()


def _crop(image: Image.Image, box: tuple[int, int, int, int], fill: object) -> Image.Image:
    """`image.crop(box)` with `fill` where the box leaves the image (Pillow fills zeros)."""
    x0, y0, x1, y1 = box
    out = Image.new(image.mode, (x1 - x0, y1 - y0), fill)  # type: ignore[arg-type]
    out.paste(image, (-x0, -y0))
    return out


def mask_png(mask: np.ndarray) -> bytes:
    """The mask as an 8-bit greyscale PNG (255: object)."""
    buf = io.BytesIO()
    Image.fromarray(np.rint(mask * 255).astype(np.uint8), "L").save(buf, "PNG")
    return buf.getvalue()
