"""The built-in foreground segmentation: OpenCV's GrabCut, seeded from the frame's border,
run twice -- over the whole frame, then again over the object's box at a finer scale -- and
cleaned: the backdrop's own colours (lit or in shadow) cut from the object's edge, then the
object's connected parts kept. Offline, no weights; good on product and object
photos, whose subject does not touch the frame and differs in colour from its backdrop.

Pure (pixels in, mask out) and deterministic (OpenCV's GMM initialisation is seeded).
"""

from __future__ import annotations

import cv2
import numpy as np

# GrabCut runs at this long side (its cost grows with the pixels: ~0.2 s a pass here).
SEGMENT_SIDE = 320
# The band of the frame taken as sure background in the first pass (a fraction of the
# shorter side): the subject of a photo rarely touches the frame.
BORDER_FRACTION = 0.04
ITERATIONS = 5
# The colour prior: the border's colours as k-means clusters (Lab); a pixel farther from all
# of them than BORDER_QUANTILE of the border's own pixels (times PRIOR_SLACK, and at least
# MIN_COLOUR_DISTANCE Lab units) seeds "probable object". Below MIN_PRIOR of the frame the
# prior is void and the seed is a plain rectangle.
BORDER_CLUSTERS = 8
LIGHTNESS_WEIGHT = 0.25
BORDER_QUANTILE = 0.98
PRIOR_SLACK = 1.2
MIN_COLOUR_DISTANCE = 6.0
MIN_PRIOR = 0.002
# The second pass: the object's box grown by this fraction each side; inside it, pixels this
# far (a fraction of the box's short side) from the first pass's edge keep their label for
# sure, the band between is decided again at the finer scale.
REFINE_MARGIN = 0.15
REFINE_BAND = 0.1
# The backdrop's own pixels kept by GrabCut: looked for within this fraction of the region's
# short side of the edge, a pixel is backdrop when its colour over one of the backdrop's
# BORDER_CLUSTERS colours is one factor in all channels (within SHADOW_TINT of its mean)
# and that factor is within SHADOW_LIGHT -- the colour itself, or it in shadow.
SHADOW_REACH = 0.05
SHADOW_TINT = 0.1
SHADOW_LIGHT = (0.4, 1.05)
# Connected parts smaller than this fraction of the largest are specks, not object.
MIN_PART = 0.15
# Holes smaller than this fraction of the object are filled (GrabCut pits on highlights).
MAX_HOLE = 0.01


class GrabCutRemover:
    """The `segmented` foreground method (SPLATQ_FOREGROUND=segment)."""

    source = "segmented"
    version = "segmented:grabcut-2"  # bumped when the same photo would get another mask

    def mask(self, rgb: np.ndarray) -> np.ndarray:
        return grabcut_mask(rgb)


def grabcut_mask(rgb: np.ndarray) -> np.ndarray:
    """[H, W] float32 soft mask in [0, 1] of the object in an [H, W, 3] uint8 photo; all
    zeros when nothing separates from the backdrop."""
    height, width = rgb.shape[:2]
    cv2.setRNGSeed(0)
    scale = min(1.0, SEGMENT_SIDE / max(height, width))
    small = _resize(rgb, scale)
    coarse = _first_pass(small)
    if not coarse.any():
        return np.zeros((height, width), np.float32)
    box = _grown_box(coarse, 1.0 / scale, width, height)
    x0, y0, x1, y1 = box
    region = rgb[y0:y1, x0:x1]
    fine_scale = min(1.0, SEGMENT_SIDE / max(region.shape[:2]))
    region_small = _resize(region, fine_scale)
    prior = cv2.resize(
        coarse.astype(np.uint8),
        (width, height),
        interpolation=cv2.INTER_NEAREST,
    )[y0:y1, x0:x1]
    prior = cv2.resize(prior, region_small.shape[1::-1], interpolation=cv2.INTER_NEAREST).astype(
        bool
    )
    fine = _second_pass(region_small, prior)
    soft = cv2.resize(fine.astype(np.float32), (x1 - x0, y1 - y0), interpolation=cv2.INTER_LINEAR)
    out = np.zeros((height, width), np.float32)
    out[y0:y1, x0:x1] = soft
    return out


def _resize(rgb: np.ndarray, scale: float) -> np.ndarray:
    if scale >= 1.0:
        return np.ascontiguousarray(rgb)
    size = (max(1, round(rgb.shape[1] * scale)), max(1, round(rgb.shape[0] * scale)))
    return cv2.resize(rgb, size, interpolation=cv2.INTER_AREA)


def _grabcut(rgb: np.ndarray, labels: np.ndarray) -> np.ndarray:
    bgd, fgd = np.zeros((1, 65), np.float64), np.zeros((1, 65), np.float64)
    # GrabCut wants both sure/probable classes present; a degenerate seed is returned as is.
    if not ((labels == cv2.GC_PR_FGD) | (labels == cv2.GC_FGD)).any():
        return labels
    if not ((labels == cv2.GC_BGD) | (labels == cv2.GC_PR_BGD)).any():
        return labels
    # The rectangle is ignored when seeding from the mask.
    cv2.grabCut(
        _shadow_tolerant(rgb), labels, (0, 0, 0, 0), bgd, fgd, ITERATIONS, cv2.GC_INIT_WITH_MASK
    )
    return labels


def _shadow_tolerant(rgb: np.ndarray) -> np.ndarray:
    """The pixels in Lab with lightness scaled by LIGHTNESS_WEIGHT: a shadow or a shading
    gradient on the backdrop changes lightness far more than colour, so it stays close to
    the backdrop's colours (GrabCut models each class as a Gaussian mixture of these)."""
    lab = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2LAB)
    lab[..., 0] = (lab[..., 0].astype(np.float32) * LIGHTNESS_WEIGHT).astype(np.uint8)
    return lab


def _first_pass(small: np.ndarray) -> np.ndarray:
    """Border band: sure background. Inside: probable object where the colour prior says
    the backdrop does not explain the pixel, probable background elsewhere."""
    height, width = small.shape[:2]
    band = max(2, round(BORDER_FRACTION * min(height, width)))
    border = np.zeros((height, width), bool)
    border[:band], border[-band:], border[:, :band], border[:, -band:] = True, True, True, True
    labels = np.where(_unexplained_by_border(small, border), cv2.GC_PR_FGD, cv2.GC_PR_BGD)
    labels = labels.astype(np.uint8)
    if (labels == cv2.GC_PR_FGD).mean() < MIN_PRIOR:
        labels[:] = cv2.GC_PR_FGD  # the prior found nothing: a plain rectangle seed
    labels[border] = cv2.GC_BGD
    labels = _grabcut(small, labels)
    return _clean((labels == cv2.GC_FGD) | (labels == cv2.GC_PR_FGD))


def _unexplained_by_border(small: np.ndarray, border: np.ndarray) -> np.ndarray:
    """[H, W] bool: pixels farther (in Lab) from every colour cluster of the border band
    than BORDER_QUANTILE of the border's own pixels are -- the saliency prior."""
    lab = _shadow_tolerant(small).astype(np.float32)
    samples = lab[border]
    k = min(BORDER_CLUSTERS, len(samples))
    criteria = (cv2.TERM_CRITERIA_EPS + cv2.TERM_CRITERIA_MAX_ITER, 20, 0.5)
    seed = np.zeros((len(samples), 1), np.int32)  # unused: the centres come from k-means++
    _, assigned, centres = cv2.kmeans(samples, k, seed, criteria, 1, cv2.KMEANS_PP_CENTERS)
    flat = lab.reshape(-1, 3)
    nearest = np.full(len(flat), np.inf, np.float32)
    for centre in centres:
        nearest = np.minimum(nearest, ((flat - centre) ** 2).sum(axis=1))
    own = ((samples - centres[assigned[:, 0]]) ** 2).sum(axis=1)
    limit = float(np.quantile(own, BORDER_QUANTILE)) * PRIOR_SLACK**2
    return (nearest > max(limit, MIN_COLOUR_DISTANCE**2)).reshape(small.shape[:2])


def _second_pass(region: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """The first pass's labels again at the finer scale: sure inside and outside a band
    around its edge, probable within it; the region's own border is background."""
    height, width = region.shape[:2]
    band = max(2, round(REFINE_BAND * min(height, width)))
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * band + 1, 2 * band + 1))
    inner = cv2.erode(prior.astype(np.uint8), kernel).astype(bool)
    outer = cv2.dilate(prior.astype(np.uint8), kernel).astype(bool)
    labels = np.full((height, width), cv2.GC_BGD, np.uint8)
    labels[outer] = cv2.GC_PR_BGD
    labels[prior] = cv2.GC_PR_FGD
    labels[inner] = cv2.GC_FGD
    edge = max(1, round(0.02 * min(height, width)))
    labels[:edge], labels[-edge:], labels[:, :edge], labels[:, -edge:] = (cv2.GC_BGD,) * 4
    labels = _grabcut(region, labels)
    found = _clean((labels == cv2.GC_FGD) | (labels == cv2.GC_PR_FGD))
    return _clean(found & ~_backdrop_kept(region, found))


def _backdrop_kept(rgb: np.ndarray, found: np.ndarray) -> np.ndarray:
    """Pixels near the object's edge that are the backdrop, not it: one of the backdrop's
    colours (k-means of the region's background) scaled by a common factor in every channel
    -- the same colour, lit or in shadow. GrabCut keeps a contact shadow with a dark-edged
    object, and on a two-colour backdrop (a checked cloth) whole cells that border a part
    of the object in a similar hue; the local mean colour cannot tell those apart (it is a
    blend of the cells), the backdrop's palette can."""
    height, width = found.shape
    sigma = SHADOW_REACH * min(height, width)
    near = found & (cv2.distanceTransform(found.astype(np.uint8), cv2.DIST_L2, 3) < sigma)
    out = np.zeros_like(found, dtype=bool)
    palette = _palette(rgb[~found])
    if palette is None or not near.any():
        return out
    pixels = rgb[near].astype(np.float32)
    hit = np.zeros(len(pixels), bool)
    for colour in palette:
        ratio = (pixels + 4.0) / (colour + 4.0)
        light = ratio.mean(axis=-1)
        tint = (ratio.max(axis=-1) - ratio.min(axis=-1)) / np.maximum(light, 1e-3)
        hit |= (light > SHADOW_LIGHT[0]) & (light < SHADOW_LIGHT[1]) & (tint < SHADOW_TINT)
    out[near] = hit
    return out


def _palette(samples: np.ndarray) -> np.ndarray | None:
    """[K, 3] float32: the mean colour of each of BORDER_CLUSTERS k-means clusters of the
    [N, 3] samples; None when there are too few samples to cluster."""
    if len(samples) < 4 * BORDER_CLUSTERS:
        return None
    data = samples.astype(np.float32)
    criteria = (cv2.TERM_CRITERIA_EPS + cv2.TERM_CRITERIA_MAX_ITER, 20, 0.5)
    seed = np.zeros((len(data), 1), np.int32)  # unused: the centres come from k-means++
    _, _, centres = cv2.kmeans(data, BORDER_CLUSTERS, seed, criteria, 1, cv2.KMEANS_PP_CENTERS)
    return np.asarray(centres, np.float32)


def _grown_box(mask: np.ndarray, scale: float, width: int, height: int) -> tuple[int, ...]:
    """The mask's bounding box in the full frame, grown by REFINE_MARGIN each side."""
    ys, xs = np.nonzero(mask)
    x0, x1 = xs.min() * scale, (xs.max() + 1) * scale
    y0, y1 = ys.min() * scale, (ys.max() + 1) * scale
    grow = REFINE_MARGIN * max(x1 - x0, y1 - y0)
    return (
        max(0, int(x0 - grow)),
        max(0, int(y0 - grow)),
        min(width, int(np.ceil(x1 + grow))),
        min(height, int(np.ceil(y1 + grow))),
    )


def _clean(mask: np.ndarray) -> np.ndarray:
    """The object's parts (the largest connected component and those at least MIN_PART of
    it), with small holes filled."""
    count, labels, stats, _ = cv2.connectedComponentsWithStats(
        mask.astype(np.uint8), connectivity=8
    )
    if count <= 1:
        return np.zeros_like(mask, dtype=bool)
    areas = stats[1:, cv2.CC_STAT_AREA]
    keep = np.flatnonzero(areas >= MIN_PART * areas.max()) + 1
    parts = np.isin(labels, keep)
    holes_n, holes, hole_stats, _ = cv2.connectedComponentsWithStats(
        (~parts).astype(np.uint8), connectivity=4
    )
    limit = MAX_HOLE * parts.sum()
    for i in range(1, holes_n):
        x, y, w, h, area = hole_stats[i]
        touches = x == 0 or y == 0 or x + w == mask.shape[1] or y + h == mask.shape[0]
        if not touches and area <= limit:
            parts[holes == i] = True
    return parts
