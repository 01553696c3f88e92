"""The Gaussians one job produces, in the layout the artifacts store (pre-activation).

A value type only; conversion to files lives in `formats`, drawing in `renderer`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SH_C0 = 0.28209479177387814  # degree-0 spherical harmonic constant: rgb = 0.5 + C0 * f_dc


@dataclass(frozen=True)
class Gaussians:
    """N Gaussians of one reconstruction. Stored *before* activation, as 3DGS files do:
    opacity is a logit, scales are natural logs, rotations are (w, x, y, z) quaternions (not
    necessarily normalised), colour is the degree-0 SH coefficient. Positions are in the input
    camera's frame (OpenCV: x right, y down, z forward)."""

    means: torch.Tensor  # [N, 3] float32
    log_scales: torch.Tensor  # [N, 3] float32
    rotations: torch.Tensor  # [N, 4] float32, (w, x, y, z)
    opacity_logits: torch.Tensor  # [N] float32
    sh_dc: torch.Tensor  # [N, 3] float32

    def __post_init__(self) -> None:
        n = self.means.shape[0]
        shapes = {
            "means": (self.means, (n, 3)),
            "log_scales": (self.log_scales, (n, 3)),
            "rotations": (self.rotations, (n, 4)),
            "opacity_logits": (self.opacity_logits, (n,)),
            "sh_dc": (self.sh_dc, (n, 3)),
        }
        for name, (tensor, shape) in shapes.items():
            if tuple(tensor.shape) != shape:
                raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {shape}")

    @property
    def count(self) -> int:
        return int(self.means.shape[0])

    def to(self, device: torch.device | str) -> Gaussians:
        return Gaussians(
            self.means.to(device),
            self.log_scales.to(device),
            self.rotations.to(device),
            self.opacity_logits.to(device),
            self.sh_dc.to(device),
        )

    @property
    def rgb(self) -> torch.Tensor:
        """Activated colour in [0, 1] (view-independent)."""
        return (0.5 + SH_C0 * self.sh_dc).clamp(0.0, 1.0)

    @property
    def opacity(self) -> torch.Tensor:
        return torch.sigmoid(self.opacity_logits)

    @property
    def scales(self) -> torch.Tensor:
        return torch.exp(self.log_scales)
