"""Surviving device out-of-memory: split the batch in halves and retry; a single job that
still does not fit fails alone with a non-retryable CUDA_OUT_OF_MEMORY error.

Pure control flow over a `forward` callable; knows nothing of models or jobs.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from splatq.shared.errors import PermanentError

T = TypeVar("T")
R = TypeVar("R")
CUDA_OUT_OF_MEMORY = "CUDA_OUT_OF_MEMORY"


class DeviceOutOfMemory(PermanentError):
    code = CUDA_OUT_OF_MEMORY


def release_device_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def forward_with_oom_split(
    forward: Callable[[Sequence[T]], Sequence[R]],
    items: Sequence[T],
    release: Callable[[], None] = release_device_memory,
    on_split: Callable[[int], None] | None = None,
) -> list[R | DeviceOutOfMemory]:
    """Run `forward(items)`; on OOM, split and retry each half (recursively)."""
    out_of_memory = False
    try:
        return list(forward(items))
    except torch.cuda.OutOfMemoryError:
        # Do not free memory here: the live exception's traceback still references the
        # frames (and tensors) of the failed forward pass.
        out_of_memory = True
    assert out_of_memory
    release()
    if len(items) == 1:
        return [DeviceOutOfMemory("the job does not fit in device memory even alone (batch of 1)")]
    if on_split is not None:
        on_split(len(items))
    mid = len(items) // 2
    return forward_with_oom_split(forward, items[:mid], release, on_split) + (
        forward_with_oom_split(forward, items[mid:], release, on_split)
    )


class MemoryBudget:
    """Simulates a smaller device: a forward pass whose images hold more than `max_pixels`
    foreground pixels raises the real `torch.cuda.OutOfMemoryError`. Foreground, because the
    per-pixel models emit Gaussians for foreground pixels: that is what memory scales with."""

    def __init__(self, max_pixels: int) -> None:
        self.max_pixels = max_pixels

    def check(self, images: torch.Tensor) -> None:
        """images: [B, 4, H, W] RGBA in [0, 1]."""
        if not self.max_pixels:
            return
        pixels = int((images[:, 3] > 0.5).sum())
        if pixels > self.max_pixels:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory (simulated budget): {pixels} foreground pixels in a "
                f"batch of {images.shape[0]}, budget {self.max_pixels}"
            )
