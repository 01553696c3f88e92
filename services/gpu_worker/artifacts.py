"""A job's artifacts: encoded from its Gaussians, staged under temporary keys, verified, and
only then committed — so a reader never sees a partial or corrupt file.

Encoding is pure (runs in a worker thread); staging and committing go through `Storage`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from splatq.services.gpu_worker import formats, spz
from splatq.services.gpu_worker.camera import Camera
from splatq.services.gpu_worker.gaussians import Gaussians
from splatq.services.gpu_worker.renderer import render, to_png_bytes
from splatq.shared.storage.store import ARTIFACT_FILES, Staged, Storage, artifact_key

PREVIEW_YAW_DEG = 25.0  # a turned view shows the reconstruction is 3-D, not a copy
PREVIEW_MAX_SIZE = 256


@dataclass(frozen=True, slots=True)
class EncodedArtifacts:
    files: Mapping[str, bytes]  # contract name -> bytes
    gaussian_count: int
    preview_size: int


def encode_files(gaussians: Gaussians) -> dict[str, bytes]:
    """The Gaussians as `.ply`, `.splat` and `.spz` (blocking; the export stage's work)."""
    cpu = gaussians.to("cpu")
    return {
        "gaussian_ply": formats.to_ply_bytes(cpu),
        "splat": formats.to_splat_bytes(cpu),
        "spz": spz.to_spz_bytes(cpu),
    }


def preview_size(input_camera: Camera) -> int:
    return min(PREVIEW_MAX_SIZE, input_camera.width)


def render_preview(gaussians: Gaussians, input_camera: Camera) -> bytes:
    """The preview PNG rendered from a turned camera, on the Gaussians' device (blocking;
    the render stage's work)."""
    size = preview_size(input_camera)
    preview_cam = Camera.input_view(size, size).orbited(PREVIEW_YAW_DEG)
    return to_png_bytes(render(gaussians, preview_cam))


def encode_artifacts(
    gaussians: Gaussians, input_camera: Camera, mask_png: bytes | None = None
) -> EncodedArtifacts:
    """PLY, .splat and a preview PNG rendered from a turned camera (CPU/GPU, blocking), and
    the foreground mask stage 0 used when there is one."""
    mask = {"mask": mask_png} if mask_png is not None else {}
    return EncodedArtifacts(
        files={
            **encode_files(gaussians),
            "rendered_preview": render_preview(gaussians, input_camera),
            **mask,
        },
        gaussian_count=gaussians.count,
        preview_size=preview_size(input_camera),
    )


def verify_encoded(data: Mapping[str, bytes], gaussian_count: int, preview_size: int) -> None:
    """Raise `formats.ArtifactInvalid` unless every file is whole and consistent."""
    formats.verify_ply(data["gaussian_ply"], expected_count=gaussian_count)
    formats.verify_splat(data["splat"], expected_count=gaussian_count)
    if "spz" in data:  # absent only from an export made before it existed (stages.publish)
        spz.verify_spz(data["spz"], expected_count=gaussian_count)
    formats.verify_png(data["rendered_preview"], preview_size, preview_size)
    if "mask" in data:
        formats.verify_png(data["mask"])


async def stage_and_verify(
    storage: Storage, job_id: str, encoded: EncodedArtifacts, run: str = ""
) -> dict[str, Staged]:
    """Write every file under a temporary key and verify what storage actually holds."""
    staged: dict[str, Staged] = {}
    try:
        for name, data in encoded.files.items():
            key = artifact_key(job_id, ARTIFACT_FILES[name], run)
            staged[name] = await storage.stage(key, data)
        read_back = {name: await storage.read_staged(s) for name, s in staged.items()}
        verify_encoded(read_back, encoded.gaussian_count, encoded.preview_size)
    except BaseException:
        await discard_all(storage, staged)
        raise
    return staged


async def commit_all(storage: Storage, staged: Mapping[str, Staged]) -> None:
    for s in staged.values():
        await storage.commit(s)


BeforeCommit = Callable[[str], Awaitable[None]]


async def publish(
    storage: Storage, staged: Mapping[str, Staged], before_commit: BeforeCommit | None = None
) -> None:
    """Commit every staged file, or none: a failure part-way (storage, a cancellation, or a
    fault a test injects through `before_commit`, called with each file's name) removes the
    files this call committed and the staged ones, then re-raises. The job then ends without
    artifacts (failed, or retried for a transient error) and its terminal event releases
    its quota reservation: the saga's rollback at its last step."""
    committed: list[Staged] = []
    try:
        for name, s in staged.items():
            if before_commit is not None:
                await before_commit(name)
            await storage.commit(s)
            committed.append(s)
    except BaseException:
        for s in staged.values():
            if s in committed:
                await storage.delete(s.key)
            else:
                await storage.discard(s)
        raise


async def discard_all(storage: Storage, staged: Mapping[str, Staged]) -> None:
    for s in staged.values():
        await storage.discard(s)
