"""The 3DGS job as pipeline stages (docs/architecture.md#staged-pipeline).

ingest (fetch, decode, normalise; CPU) -> reconstruct (the batched forward pass; the device)
-> export (.ply, .splat; CPU) -> render (the preview PNG; the device when there is one) ->
publish (the artifacts become the job's result, in the fenced `completed` commit) -> cleanup
(the job's intermediates are deleted once it ended).

Each stage reads its inputs from the ledger of the stage before (object keys), computes the
digest of those inputs with its own version and profile, and stores what it produces
content-addressed by that digest under `intermediates/<job>/`: a stage whose ledger record
already holds a success for the same digest skips its work (a redrive resumes where the job
failed), and one whose outputs an earlier run finished writing reuses them (a retried export
never runs the forward pass again). Only publish writes where users look, and its commit is
fenced by the run's lease token, so a stale run can never replace a newer result.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping

import structlog
import torch

from splatq.services.gpu_worker.artifacts import (
    EncodedArtifacts,
    discard_all,
    encode_files,
    preview_size,
    publish,
    render_preview,
    stage_and_verify,
)
from splatq.services.gpu_worker.gaussians import Gaussians
from splatq.services.gpu_worker.handler import (
    QUALITIES,
    GpuJobHandler,
    InputMissing,
    artifact_url,
    select_device,
)
from splatq.services.gpu_worker.images import decode_image
from splatq.services.gpu_worker.metrics import GpuMetrics
from splatq.services.gpu_worker.model import ReconstructionModel, load_model
from splatq.shared.engine.errors import PermanentError
from splatq.shared.engine.jobs import JobOutcome, StageDone
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.stages import PipelineStage, stage_digest
from splatq.shared.engine.worker import JobContext, JobHandler
from splatq.shared.images.headers import DecodeLimits
from splatq.shared.settings import Settings
from splatq.shared.storage.intermediates import IntermediateStore, StageWork, facts_int
from splatq.shared.storage.store import ARTIFACT_FILES, Storage, open_storage

log = structlog.get_logger("splatq.stages")

# Bumped when a stage's output for the same inputs would change (its digest changes with it).
INGEST_VERSION = "ingest-1"
EXPORT_VERSION = "export-1"
RENDER_VERSION = "render-1"


def tensor_bytes(tensors: Mapping[str, torch.Tensor]) -> bytes:
    buf = io.BytesIO()
    torch.save({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, buf)
    return buf.getvalue()


def bytes_tensors(data: bytes) -> dict[str, torch.Tensor]:
    loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if not isinstance(loaded, dict) or not all(
        isinstance(v, torch.Tensor) for v in loaded.values()
    ):
        raise PermanentError("an intermediate is not a tensor map", code="INTERMEDIATE_CORRUPT")
    return loaded


def gaussians_bytes(g: Gaussians) -> bytes:
    return tensor_bytes(
        {
            "means": g.means,
            "log_scales": g.log_scales,
            "rotations": g.rotations,
            "opacity_logits": g.opacity_logits,
            "sh_dc": g.sh_dc,
        }
    )


def bytes_gaussians(data: bytes) -> Gaussians:
    t = bytes_tensors(data)
    try:
        return Gaussians(
            t["means"], t["log_scales"], t["rotations"], t["opacity_logits"], t["sh_dc"]
        )
    except (KeyError, ValueError) as exc:
        raise PermanentError(f"unreadable Gaussians: {exc}", code="INTERMEDIATE_CORRUPT") from None


class StageHandlers:
    """One per staged worker process: the handlers of the stages it runs, sharing storage and
    (for reconstruct) the model, its batchers and the device scheduler."""

    def __init__(
        self,
        settings: Settings,
        model: ReconstructionModel,
        storage: Storage,
        metrics: GpuMetrics | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.settings = settings
        self.model = model
        self.storage = storage
        self.device = device or select_device(settings.device)
        self.decode_limits = DecodeLimits.from_settings(settings)
        # The forward pass, batching and device priority are the whole-job handler's own.
        self.gpu = GpuJobHandler(settings, model, storage, metrics, self.device)
        self._device_loaded = False
        self.store = IntermediateStore(storage)
        self.handlers: dict[PipelineStage, JobHandler] = {
            PipelineStage.INGEST: self.ingest,
            PipelineStage.RECONSTRUCT: self.reconstruct,
            PipelineStage.EXPORT: self.export,
            PipelineStage.RENDER: self.render,
            PipelineStage.PUBLISH: self.publish,
        }

    def handler(self, stage: PipelineStage) -> JobHandler:
        return self.handlers[stage]

    def thread_setup(self, stream: StreamName) -> None:
        self.gpu.thread_setup(stream)

    async def startup(self, stages: tuple[PipelineStage, ...]) -> None:
        if PipelineStage.RECONSTRUCT in stages:
            await self.gpu.startup()  # the model goes to the device; batchers start
            self._device_loaded = True
        log.info("stages.ready", stages=[s.value for s in stages], device=str(self.device))

    async def shutdown(self) -> None:
        if self._device_loaded:
            for b in self.gpu.batchers.values():
                await b.stop()
        self.gpu.executors.shutdown()
        close = getattr(self.storage, "close", None)
        if close is not None:
            await close()

    async def cleanup(self, job_id: str) -> int:
        """Delete a finished job's intermediates (idempotent); returns how many objects."""
        return await self.store.delete_job(job_id)

    async def _stage(
        self,
        ctx: JobContext,
        stage: PipelineStage,
        digest: str,
        names: tuple[str, ...],
        work: StageWork,
    ) -> StageDone:
        ctx.raise_if_stopped()
        done = await self.store.run_stage(ctx.job, stage, digest, names, work)
        ctx.raise_if_stopped()
        return done

    @staticmethod
    def _quality(ctx: JobContext) -> str:
        return ctx.job.quality if ctx.job.quality in QUALITIES else "full"

    # -- the stages --------------------------------------------------------------------

    async def ingest(self, ctx: JobContext) -> StageDone:
        quality = self._quality(ctx)
        resolution = self.model.input_resolution(quality)
        if not ctx.job.input_ref:
            raise InputMissing("the job has no input image")
        source = ctx.job.input_sha256 or ctx.job.input_ref
        digest = stage_digest(INGEST_VERSION, source, str(resolution))

        async def work() -> tuple[dict[str, bytes], dict[str, str]]:
            data = await self.storage.get_bytes(ctx.job.input_ref)
            image = await ctx.run_blocking(decode_image, data, resolution, self.decode_limits)
            blob = await ctx.run_blocking(tensor_bytes, {"image": image})
            return {"image.pt": blob}, {"resolution": str(resolution)}

        return await self._stage(ctx, PipelineStage.INGEST, digest, ("image.pt",), work)

    async def reconstruct(self, ctx: JobContext) -> StageDone:
        quality = self._quality(ctx)
        source = self.store.upstream(ctx.job, PipelineStage.INGEST)
        digest = stage_digest(source.digest, self.model.version, quality)

        async def work() -> tuple[dict[str, bytes], dict[str, str]]:
            blob = await self.store.read(source, "image.pt")
            image = (await ctx.run_blocking(bytes_tensors, blob))["image"]
            resolution = int(image.shape[-1])
            gaussians = await self.gpu.infer_one(ctx, image, quality, resolution)
            blob = await ctx.run_blocking(gaussians_bytes, gaussians)
            return {"gaussians.pt": blob}, {
                "gaussian_count": str(gaussians.count),
                "resolution": str(resolution),
                "model": self.model.version,
            }

        return await self._stage(ctx, PipelineStage.RECONSTRUCT, digest, ("gaussians.pt",), work)

    async def export(self, ctx: JobContext) -> StageDone:
        source = self.store.upstream(ctx.job, PipelineStage.RECONSTRUCT)
        digest = stage_digest(source.digest, EXPORT_VERSION)

        async def work() -> tuple[dict[str, bytes], dict[str, str]]:
            blob = await self.store.read(source, "gaussians.pt")
            gaussians = await ctx.run_blocking(bytes_gaussians, blob)
            files = await ctx.run_blocking(encode_files, gaussians)
            return files, dict(source.facts)

        names = ("gaussian_ply", "splat")
        return await self._stage(ctx, PipelineStage.EXPORT, digest, names, work)

    async def render(self, ctx: JobContext) -> StageDone:
        source = self.store.upstream(ctx.job, PipelineStage.RECONSTRUCT)
        digest = stage_digest(source.digest, RENDER_VERSION)

        async def work() -> tuple[dict[str, bytes], dict[str, str]]:
            blob = await self.store.read(source, "gaussians.pt")
            gaussians = await ctx.run_blocking(bytes_gaussians, blob)
            camera = self.model.input_camera(facts_int(source.facts, "resolution"))
            png = await ctx.run_blocking(render_preview, gaussians.to(self.device), camera)
            return {"rendered_preview": png}, {"preview_size": str(preview_size(camera))}

        names = ("rendered_preview",)
        return await self._stage(ctx, PipelineStage.RENDER, digest, names, work)

    async def publish(self, ctx: JobContext) -> JobOutcome:
        """Copy the export and render outputs into this run's own folder, verify them, make
        them visible, and return the outcome the fenced `completed` commit records."""
        ctx.raise_if_stopped()
        exported = self.store.upstream(ctx.job, PipelineStage.EXPORT)
        rendered = self.store.upstream(ctx.job, PipelineStage.RENDER)
        files = {
            "gaussian_ply": await self.store.read(exported, "gaussian_ply"),
            "splat": await self.store.read(exported, "splat"),
            "rendered_preview": await self.store.read(rendered, "rendered_preview"),
        }
        count = facts_int(exported.facts, "gaussian_count")
        encoded = EncodedArtifacts(
            files=files,
            gaussian_count=count,
            preview_size=facts_int(rendered.facts, "preview_size"),
        )
        # A folder of this run's own (its lease token): a stale publish run can only fill its
        # own folder; the fenced commit decides which folder is the job's.
        run = "p" + hashlib.sha256(ctx.token.encode()).hexdigest()[:12]
        staged = await stage_and_verify(self.storage, ctx.job.id, encoded, run)
        try:
            ctx.raise_if_stopped()
        except BaseException:
            await discard_all(self.storage, staged)
            raise
        await publish(self.storage, staged, self.gpu.before_commit)
        self.store.work_done[PipelineStage.PUBLISH] += 1
        base = self.settings.public_base_url
        compute_ms = sum(r.work_ms or 0 for r in ctx.job.ledger.values())
        return JobOutcome(
            artifacts={name: artifact_url(base, ctx.job.id, name) for name in ARTIFACT_FILES},
            compute_time_ms=compute_ms,
            model=exported.facts.get("model", "") or self.model.version,
            extra_fields={"gaussian_count": str(count), "artifact_run": run},
        )


def make(settings: Settings) -> StageHandlers:
    """Stage handlers factory for `splatq worker --stages ...` (the default)."""
    model = load_model(settings.model, settings.model_checkpoint)
    storage = open_storage(
        settings.storage_url, settings.storage_root, s3_endpoint_url=settings.s3_endpoint_url
    )
    return StageHandlers(settings, model, storage, GpuMetrics.create())
