"""Pinhole cameras: the input view a reconstruction is expressed in, and orbits around it.

Pure geometry; no rendering here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Splatter Image's convention for object-centric single views: a ~49 degree field of view,
# the object centred a fixed distance in front of the camera.
DEFAULT_FOV_DEG = 49.13
OBJECT_DISTANCE = 2.0


@dataclass(frozen=True)
class Camera:
    """OpenCV convention (x right, y down, z forward). `world_to_camera` maps the input
    camera's frame (the Gaussians' frame) into this camera's frame."""

    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float
    world_to_camera: torch.Tensor  # [4, 4] float32

    @classmethod
    def input_view(cls, width: int, height: int, fov_deg: float = DEFAULT_FOV_DEG) -> Camera:
        """The camera the input image was taken with (identity pose)."""
        focal = 0.5 * width / math.tan(math.radians(fov_deg) / 2)
        return cls(width, height, focal, focal, width / 2, height / 2, torch.eye(4))

    def orbited(self, yaw_deg: float, pivot_z: float = OBJECT_DISTANCE) -> Camera:
        """This camera moved on a circle around the point (0, 0, pivot_z), looking at it."""
        a = math.radians(yaw_deg)
        rot = torch.tensor(
            [[math.cos(a), 0.0, -math.sin(a)], [0.0, 1.0, 0.0], [math.sin(a), 0.0, math.cos(a)]]
        )
        pivot = torch.tensor([0.0, 0.0, pivot_z])
        w2c = torch.eye(4)
        # x_cam = R (x - pivot) + pivot: rotate the world about the pivot, camera stays put.
        w2c[:3, :3] = rot
        w2c[:3, 3] = pivot - rot @ pivot
        return Camera(
            self.width, self.height, self.fx, self.fy, self.cx, self.cy, w2c @ self.world_to_camera
        )

    def pixel_rays(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """[H, W, 3] directions through pixel centres with z = 1 (input view only)."""
        ys, xs = torch.meshgrid(
            torch.arange(self.height, device=device, dtype=torch.float32) + 0.5,
            torch.arange(self.width, device=device, dtype=torch.float32) + 0.5,
            indexing="ij",
        )
        return torch.stack(
            [(xs - self.cx) / self.fx, (ys - self.cy) / self.fy, torch.ones_like(xs)], dim=-1
        )
