"""Stage 0: the object separated from its backdrop (alpha, GrabCut, a learned ONNX remover),
recentred, upright, and what the model and the job get of it."""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from PIL import Image

from bench.input_quality import heic_bytes, jpeg_bytes, rotated_jpeg, silhouette_iou
from splatq.services.gpu_worker.foreground import (
    ConfigurationError,
    Remover,
    load_remover,
    object_square,
    prepare_input,
)
from splatq.services.gpu_worker.images import decode_image
from splatq.services.gpu_worker.learned_remover import NORMALISATIONS
from splatq.services.gpu_worker.sample_photos import SCENES, Scene, render_scene
from splatq.services.gpu_worker.samples import sample_image
from splatq.services.gpu_worker.segment_grabcut import GrabCutRemover, grabcut_mask
from splatq.shared.images.headers import DecodeLimits
from splatq.shared.settings import Settings
from tests.helpers import REPO_ROOT

LIMITS = DecodeLimits()
# Small photos keep these fast: 480x360 (the benchmark runs 1600x1200).
SMALL = {s.name: dataclasses.replace(s, width=480, height=360) for s in SCENES}


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / (a | b).sum())


@pytest.mark.parametrize("name", ["texture-off-centre", "gradient-small"])
def test_grabcut_finds_the_object_on_a_busy_backdrop(name: str) -> None:
    """The built-in segmentation against the true mask, where the backdrop's colour rule
    (the model's own) sees a card."""
    photo, truth = render_scene(SMALL[name])
    mask = grabcut_mask(np.asarray(photo)) > 0.5
    assert _iou(mask, truth) > 0.85


@pytest.mark.parametrize("name", ["tiles-centred", "tiles-off-centre"])
def test_grabcut_leaves_the_checked_cloth_cells_behind(name: str) -> None:
    """A checked backdrop with cells of the object's hues: the cells GrabCut keeps along the
    object's edge (lit or in its shadow) are the backdrop's colours and are cut (issue #22:
    0.86 and 0.79 before at this size, the benchmark's target is 0.9)."""
    photo, truth = render_scene(SMALL[name])
    mask = grabcut_mask(np.asarray(photo)) > 0.5
    assert _iou(mask, truth) >= 0.9


def test_the_opaque_gaussians_cover_the_object_not_the_frame() -> None:
    """Through the model: the silhouette rendered from the input camera matches the object
    with stage 0 and is a card of the whole frame without it (the old behaviour)."""
    photo, truth = render_scene(SMALL["texture-small"])
    data = jpeg_bytes(photo)
    card, _ = silhouette_iou(data, truth, None, res=128)
    segmented, prepared = silhouette_iou(data, truth, GrabCutRemover(), res=128)
    assert prepared.foreground == "segmented"
    assert card < 0.2
    assert segmented > 0.85


def test_a_cutout_keeps_its_alpha_and_is_recentred() -> None:
    """A small figure in a large transparent canvas: the alpha is the mask, the model's
    square is cut around it with the margin, and the tensor's alpha is that mask."""
    canvas = Image.new("RGBA", (600, 400), (0, 0, 0, 0))
    canvas.paste(sample_image(100, seed=2), (420, 40))
    buffer = io.BytesIO()
    canvas.save(buffer, "PNG")
    prepared = prepare_input(buffer.getvalue(), (128,), LIMITS, GrabCutRemover(), margin=0.1)
    assert prepared.foreground == "alpha"
    alpha = np.asarray(canvas)[..., 3] > 127
    x0, y0, side = prepared.crop or (0, 0, 0)
    ys, xs = np.nonzero(alpha)
    assert x0 <= xs.min()
    assert xs.max() < x0 + side
    assert y0 <= ys.min()
    assert ys.max() < y0 + side
    assert side == round(max(np.ptp(xs) + 1, np.ptp(ys) + 1) * 1.2)
    image = prepared.images[128]
    # the object now fills the square: over 5x its share of the frame
    assert float((image[3] > 0.5).float().mean()) > 5 * alpha.mean()
    mask = np.asarray(Image.open(io.BytesIO(prepared.mask_png or b"")))
    assert mask.shape == (400, 600)
    assert _iou(mask > 127, alpha) > 0.99


def test_object_square_is_centred_on_the_box_and_may_leave_the_frame() -> None:
    """The square's centre is the box's, its side the longer side grown by the margin."""
    mask = np.zeros((100, 200), bool)
    mask[0:40, 180:200] = True
    assert object_square(mask, 0.25) == (160, -10, 60)
    assert object_square(np.zeros((10, 30), bool), 0.1) == (0, -10, 30)


def test_without_stage_0_the_model_gets_the_whole_frame() -> None:
    """SPLATQ_FOREGROUND=none: no remover, no mask, the old fitted frame."""
    photo, _ = render_scene(SMALL["gradient-centred"])
    data = jpeg_bytes(photo)
    prepared = prepare_input(data, (128,), LIMITS, None)
    assert (prepared.foreground, prepared.mask_png, prepared.crop) == (None, None, None)
    assert bool((prepared.images[128] == decode_image(data, 128, LIMITS)).all())
    assert load_remover(Settings().with_overrides(foreground="none")) is None


@pytest.mark.parametrize("encode", [heic_bytes, rotated_jpeg], ids=["heic", "jpeg-exif6"])
def test_heic_and_an_exif_rotated_photo_give_the_upright_object(encode: object) -> None:
    """The same scene as a HEIC and as a JPEG stored on its side (orientation 6): the mask
    is of the upright photo and matches the plain JPEG's."""
    photo, truth = render_scene(SMALL["texture-centred"])
    reference = prepare_input(jpeg_bytes(photo), (128,), LIMITS, GrabCutRemover())
    other = prepare_input(encode(photo), (128,), LIMITS, GrabCutRemover())  # type: ignore[operator]
    assert other.photo_size == reference.photo_size == (480, 360)
    ours = np.asarray(Image.open(io.BytesIO(other.mask_png or b""))) > 127
    assert _iou(ours, truth) > 0.85


# -- the learned remover ----------------------------------------------------------------


def _tiny_remover(
    path: Path,
    backdrop: tuple[float, float, float],
    side: int = 64,
    normalisation: str = "imagenet",
) -> None:
    """A real ONNX background remover that calls a pixel object when its colour is far from
    `backdrop`: undo the normalisation, squared distance, a steep logistic around 0.02.
    `imagenet`: the interface of rembg's U2-Net and BiRefNet exports ([1, 3, S, S]
    ImageNet-normalised in, [1, 1, S, S] logits out); `isnet`: ISNet's (RGB minus 0.5 in;
    the probability first, then a side output, as IMG.LY's export returns them)."""
    mean_, std_ = NORMALISATIONS[normalisation]
    mean = np.asarray(mean_, np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(std_, np.float32).reshape(1, 3, 1, 1)
    colour = np.asarray(backdrop, np.float32).reshape(1, 3, 1, 1)
    consts = {
        "std": std, "mean": mean, "colour": colour,
        "gain": np.asarray(200.0, np.float32), "offset": np.asarray(0.02, np.float32),
    }  # fmt: skip
    nodes = [
        helper.make_node("Mul", ["image", "std"], ["scaled"]),
        helper.make_node("Add", ["scaled", "mean"], ["rgb"]),
        helper.make_node("Sub", ["rgb", "colour"], ["diff"]),
        helper.make_node("Mul", ["diff", "diff"], ["squared"]),
        helper.make_node("ReduceSum", ["squared", "axes"], ["distance"], keepdims=1),
        helper.make_node("Sub", ["distance", "offset"], ["shifted"]),
        helper.make_node("Mul", ["shifted", "gain"], ["logits"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1, side, side])]
    if normalisation == "isnet":
        nodes += [
            helper.make_node("Sigmoid", ["logits"], ["probability"]),
            helper.make_node("Neg", ["probability"], ["side_output"]),
        ]
        outputs = [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 1, side, side])
            for name in ("probability", "side_output")
        ]
    initializers = [helper.make_tensor("axes", TensorProto.INT64, [1], [1])] + [
        helper.make_tensor(k, TensorProto.FLOAT, v.shape, v.flatten().tolist())
        for k, v in consts.items()
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_remover",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, side, side])],
        outputs,
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def test_the_learned_remover_runs_a_local_onnx_model(tmp_path: Path) -> None:
    """SPLATQ_FOREGROUND=learned with a model file: it is loaded once, its input size read
    from the model, its answer is the mask, and the job's source says `learned`."""
    backdrop = (0.2, 0.45, 0.8)
    path = tmp_path / "remover.onnx"
    _tiny_remover(path, backdrop)
    settings = Settings().with_overrides(foreground="learned", foreground_model=str(path))
    remover = load_remover(settings)
    assert remover is not None
    assert remover.source == "learned"
    assert remover.version.startswith("learned:")
    assert remover.version.endswith(":64")
    figure = sample_image(160, seed=4)
    photo = Image.new("RGB", (320, 240), tuple(round(c * 255) for c in backdrop))
    photo.paste(figure, (100, 40), figure)
    prepared = prepare_input(jpeg_bytes(photo), (128,), LIMITS, remover)
    assert prepared.foreground == "learned"
    mask = np.asarray(Image.open(io.BytesIO(prepared.mask_png or b""))) > 127
    truth = np.zeros((240, 320), bool)
    truth[40:200, 100:260] = np.asarray(figure)[..., 3] > 127
    assert _iou(mask, truth) > 0.85


def _learned_iou(remover: Remover) -> float:
    """Mask IoU of a learned remover on the figure pasted on a plain (0.2, 0.45, 0.8) photo."""
    figure = sample_image(160, seed=4)
    photo = Image.new("RGB", (320, 240), (51, 115, 204))
    photo.paste(figure, (100, 40), figure)
    prepared = prepare_input(jpeg_bytes(photo), (128,), LIMITS, remover)
    mask = np.asarray(Image.open(io.BytesIO(prepared.mask_png or b""))) > 127
    truth = np.zeros((240, 320), bool)
    truth[40:200, 100:260] = np.asarray(figure)[..., 3] > 127
    return _iou(mask, truth)


def test_an_isnet_model_needs_its_own_normalisation(tmp_path: Path) -> None:
    """An ISNet-style export (IMG.LY's background-removal-data: RGB minus 0.5 in, the
    probability and side outputs out) with SPLATQ_FOREGROUND_NORMALISATION=isnet finds the
    object; the same file under the ImageNet default gets shifted colours and does not."""
    path = tmp_path / "isnet.onnx"
    _tiny_remover(path, (0.2, 0.45, 0.8), normalisation="isnet")
    env = {
        "SPLATQ_FOREGROUND": "learned",
        "SPLATQ_FOREGROUND_MODEL": str(path),
        "SPLATQ_FOREGROUND_NORMALISATION": "isnet",
    }
    remover = load_remover(Settings.from_env(env))
    assert remover is not None
    assert remover.version.endswith(":64:isnet")
    assert _learned_iou(remover) > 0.85
    default = load_remover(
        Settings().with_overrides(foreground="learned", foreground_model=str(path))
    )
    assert default is not None
    assert default.version.endswith(":64")
    assert _learned_iou(default) < 0.5


def test_learned_without_its_model_file_is_a_configuration_error(tmp_path: Path) -> None:
    """No file, or a file that is not an ONNX model: a clear configuration error naming the
    setting, at load time -- nothing is downloaded."""
    missing = Settings().with_overrides(foreground="learned", foreground_model=str(tmp_path / "x"))
    with pytest.raises(ConfigurationError, match=r"SPLATQ_FOREGROUND_MODEL.*never downloaded"):
        load_remover(missing)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    with pytest.raises(ConfigurationError, match="not a loadable ONNX model"):
        load_remover(missing.with_overrides(foreground_model=str(junk)))


def test_the_worker_refuses_to_start_without_the_learned_model(tmp_path: Path) -> None:
    """`splatq worker` with SPLATQ_FOREGROUND=learned and no model: exit 78 (configuration)
    with the reason, before it takes any job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLATQ_")}
    env |= {"SPLATQ_FOREGROUND": "learned", "SPLATQ_FOREGROUND_MODEL": str(tmp_path / "no.onnx")}
    env["SPLATQ_REDIS_URL"] = "redis://127.0.0.1:1/0"  # never reached
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "splatq"), "worker"],
        check=False,
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 78, proc.stderr[-2000:]
    assert "SPLATQ_FOREGROUND_MODEL" in proc.stderr


def test_a_scene_is_deterministic() -> None:
    """The generated photos (and their truth) are the same every run."""
    scene = Scene("t", "tiles", width=64, height=48, seed=9)
    (a, ta), (b, tb) = render_scene(scene), render_scene(scene)
    assert np.array_equal(np.asarray(a), np.asarray(b))
    assert np.array_equal(ta, tb)
