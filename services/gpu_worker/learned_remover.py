"""The optional learned foreground remover: a local ONNX background-removal model (a
BiRefNet or U2-Net export, as rembg uses) run through onnxruntime on the CPU.

Loaded once per worker from SPLATQ_FOREGROUND_MODEL; nothing is ever downloaded. Needs the
`learned` extra (onnxruntime). The model takes [1, 3, S, S] float32 RGB normalised with the
statistics it was trained with (SPLATQ_FOREGROUND_NORMALISATION: ImageNet's for U2-Net and
BiRefNet, mean 0.5 and deviation 1 for ISNet) and returns a map whose first channel is the
object's probability (or logits, which are squashed). Only the first output is fetched
(ISNet exports also return their side outputs and decoder features).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image

from splatq.services.gpu_worker.remover import LEARNED, ConfigurationError, file_digest

# rembg's U2-Net and BiRefNet preprocessing: ImageNet statistics; 320 px when the model's
# input size is dynamic (U2-Net's own size).
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)
DEFAULT_SIDE = 320
# (mean, deviation) per SPLATQ_FOREGROUND_NORMALISATION. ISNet (DIS) is trained on [0, 1]
# RGB minus 0.5 (IMG.LY's runtime: (x - 128) / 256; rembg's isnet-general-use: 0.5 / 1.0);
# fed ImageNet statistics instead it finds a fraction of the object.
NORMALISATIONS: dict[str, tuple[np.ndarray, np.ndarray]] = {
    "imagenet": (MEAN, STD),
    "isnet": (np.full(3, 0.5, np.float32), np.ones(3, np.float32)),
}


class OnnxRemover:
    """The `learned` foreground method (SPLATQ_FOREGROUND=learned)."""

    source = LEARNED

    def __init__(self, path: Path, threads: int = 1, normalisation: str = "imagenet") -> None:
        self.mean, self.std = NORMALISATIONS[normalisation]
        options = ort.SessionOptions()
        # One thread: the worker's decode threads run several inputs at once.
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(
                str(path), options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own types for a bad file
            raise ConfigurationError(
                f"SPLATQ_FOREGROUND_MODEL={str(path)!r} is not a loadable ONNX model: {exc}"
            ) from None
        inputs = self.session.get_inputs()
        if len(inputs) != 1 or len(inputs[0].shape) != 4:
            raise ConfigurationError(
                f"the ONNX remover {str(path)!r} must take one [1, 3, S, S] image input"
            )
        self.input_name = inputs[0].name
        self.output_name = self.session.get_outputs()[0].name
        side = inputs[0].shape[-1]
        self.side = side if isinstance(side, int) and side > 0 else DEFAULT_SIDE
        # The default's version is the one before the setting existed (same masks, same digest).
        suffix = "" if normalisation == "imagenet" else f":{normalisation}"
        self.version = f"learned:{file_digest(path)}:{self.side}{suffix}"

    def mask(self, rgb: np.ndarray) -> np.ndarray:
        """[H, W] float32 probability of the object, resized back to the photo."""
        height, width = rgb.shape[:2]
        small = Image.fromarray(rgb).resize((self.side, self.side), Image.Resampling.BILINEAR)
        x = (np.asarray(small, np.float32) / 255.0 - self.mean) / self.std
        batch = np.ascontiguousarray(x.transpose(2, 0, 1)[None])
        feed = {self.input_name: batch}
        out = np.asarray(self.session.run([self.output_name], feed)[0], np.float32)
        while out.ndim > 2:
            out = out[0]
        if out.min() < 0.0 or out.max() > 1.0:
            out = (1.0 / (1.0 + np.exp(-out))).astype(np.float32)  # logits -> probability
        prob = Image.fromarray(out.astype(np.float32), "F")
        resized = prob.resize((width, height), Image.Resampling.BILINEAR)
        return np.clip(np.asarray(resized, np.float32), 0.0, 1.0)
