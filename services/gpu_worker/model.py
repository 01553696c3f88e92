"""The reconstruction model interface and the registry that picks one by configuration.

`SPLATQ_MODEL=builtin` or `package.module:factory`; weights come from a local path
(`SPLATQ_MODEL_CHECKPOINT`), never from a hub. `SPLATQ_MODEL=remote` calls a vendor's hosted
model instead (services/gpu_worker/remote/, docs/hosted-model.md). No model code lives here.
"""

from __future__ import annotations

import importlib
from typing import Protocol

import torch

from splatq.services.gpu_worker.camera import Camera
from splatq.services.gpu_worker.gaussians import Gaussians
from splatq.shared.settings import Settings
from splatq.shared.storage.store import Storage


class ReconstructionModel(Protocol):
    """A feed-forward image → Gaussians model that serves batches."""

    @property
    def version(self) -> str:
        """Identifies the weights and code; goes into cache keys and job records."""
        ...

    def input_resolution(self, quality: str) -> int:
        """Square input size for `preview` / `full`."""
        ...

    def input_camera(self, resolution: int) -> Camera:
        """The camera the returned Gaussians are expressed in."""
        ...

    def load(self, device: torch.device) -> None:
        """Move weights to `device` (called once before the first batch)."""
        ...

    def infer(self, images: torch.Tensor) -> list[Gaussians]:
        """One forward pass: images [B, 4, R, R] RGBA in [0, 1] on the model's device ->
        one `Gaussians` per image. Must not mix items of the batch."""
        ...


def load_model(spec: str, checkpoint: str = "") -> ReconstructionModel:
    """`builtin` or `package.module:factory` (the factory gets the checkpoint path)."""
    if spec == "remote":
        raise ValueError("SPLATQ_MODEL=remote is built from the settings: use model_for()")
    if spec == "builtin":
        from splatq.services.gpu_worker.builtin_model import SilhouetteInflationModel  # noqa: PLC0415

        return SilhouetteInflationModel()
    module_name, sep, attr = spec.partition(":")
    if not sep:
        raise ValueError(f"SPLATQ_MODEL must be 'builtin' or 'package.module:factory': {spec!r}")
    factory = getattr(importlib.import_module(module_name), attr)
    model: ReconstructionModel = factory(checkpoint)
    return model


def model_for(settings: Settings, storage: Storage | None = None) -> ReconstructionModel:
    """The model a worker runs: SPLATQ_MODEL's, the hosted one for `remote` (its vendor
    configuration from SPLATQ_REMOTE_CONFIG; `storage` presigns its inputs when asked)."""
    if settings.model == "remote":
        from splatq.services.gpu_worker.remote.backend import load_remote_model  # noqa: PLC0415

        return load_remote_model(settings, storage)
    return load_model(settings.model, settings.model_checkpoint)
