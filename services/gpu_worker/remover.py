"""What every background remover shares (the segmenter, the learned ONNX remover): the
method names the job view reports, the `Remover` protocol, the configuration error and a model
file's identity. The removers import this; `foreground` chooses and runs them."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol

import numpy as np

from splatq.shared.settings import SettingsError

# The job view's `foreground` values (the API contract's names).
FROM_ALPHA = "alpha"
SEGMENTED = "segmented"
LEARNED = "learned"


class Remover(Protocol):
    """Finds the object in a photo without alpha: [H, W, 3] uint8 -> [H, W] float32 in
    [0, 1]. `source` is the job view's `foreground`; `version` enters the ingest digest."""

    source: str
    version: str

    def mask(self, rgb: np.ndarray) -> np.ndarray: ...


class ConfigurationError(SettingsError):
    """The configured foreground method cannot run (e.g. its model file is missing)."""


def file_digest(path: Path) -> str:
    """A model file's identity for the ingest digest (its SHA-256, 16 hex digits)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]
