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

Progressive jobs (a full job with `progressive: true`): ingest also stores the image at the
preview resolution; reconstruct runs it through the preview batcher beside the full pass,
writes the quick result's files (verified, temporary then renamed) to the job's folder
`quick-<stage digest>` and returns its StageDone with `preview_ready`, which advance.lua
emits with the stage's advance -- once, with the one advance that commits.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import time
from collections.abc import Mapping

import structlog
import torch

from splatq.services.gpu_worker.artifacts import (
    EncodedArtifacts,
    discard_all,
    encode_artifacts,
    encode_files,
    preview_size,
    publish,
    render_preview,
    stage_and_verify,
)
from splatq.services.gpu_worker.foreground import remover_version
from splatq.services.gpu_worker.gaussians import Gaussians
from splatq.services.gpu_worker.handler import (
    QUALITIES,
    GpuJobHandler,
    InputMissing,
    artifact_url,
    foreground_fields,
    quick_artifact_url,
)
from splatq.services.gpu_worker.metrics import GpuMetrics
from splatq.services.gpu_worker.model import model_for
from splatq.shared.engine import events
from splatq.shared.engine.events import EventType
from splatq.shared.engine.intermediates import (
    CHARGED_MS_FACT,
    IntermediateStore,
    StageWork,
    facts_int,
)
from splatq.shared.engine.job_context import JobContext, JobHandler
from splatq.shared.engine.jobs import JobOutcome, StageDone
from splatq.shared.engine.keys import StreamName
from splatq.shared.engine.metering import quick_unit, total_ms
from splatq.shared.engine.stages import PipelineStage, StageRecord, stage_digest
from splatq.shared.errors import (
    Deferred,
    JobCanceled,
    LeaseLost,
    PermanentError,
    SplatqError,
    TransientError,
)
from splatq.shared.settings import Settings
from splatq.shared.storage.store import (
    ARTIFACT_FILES,
    QUICK_RUN_PREFIX,
    artifact_key,
    open_storage,
    quick_run,
)

log = structlog.get_logger("splatq.stages")

# Bumped when a stage's output for the same inputs would change (its digest changes with it).
INGEST_VERSION = "ingest-2"  # 2: stage 0 (foreground, recentring), EXIF orientation
EXPORT_VERSION = "export-2"  # 2: .spz too
RENDER_VERSION = "render-1"
# The ingest output a progressive job's quick pass reads (the image at preview resolution).
QUICK_IMAGE = "quick_image.pt"
# The ingest output holding stage 0's foreground mask (the `mask` artifact), when it has one.
MASK_PNG = "mask.png"
# Artifacts of a quick result recorded before `quick_artifacts` existed: the required ones.
_QUICK_DEFAULT = ("gaussian_ply", "splat", "spz", "rendered_preview")


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

    def __init__(self, gpu: GpuJobHandler) -> None:
        # The settings, model, storage, device, the batchers and the device scheduler are the
        # whole-job handler's own: the reconstruct stage's forward pass is its.
        self.gpu = gpu
        self.settings = gpu.settings
        self.model = gpu.model
        self.storage = gpu.storage
        self.device = gpu.device
        self.decode_limits = gpu.decode_limits
        self._device_loaded = False
        self.store = IntermediateStore(gpu.storage)
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
            await self.gpu.stop_model()
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
        # Metered before the stop check: work a cancel interrupted at this boundary was done
        # (and is charged).
        done = await self.store.run_stage(ctx.job, stage, digest, names, work, ctx.meter)
        ctx.raise_if_stopped()
        return done

    @staticmethod
    def _quality(ctx: JobContext) -> str:
        return ctx.job.quality if ctx.job.quality in QUALITIES else "full"

    @classmethod
    def _progressive(cls, ctx: JobContext) -> bool:
        """A full job that asked for a quick result first (`progressive: true`; ignored on a
        preview job, which is quick already)."""
        return cls._quality(ctx) == "full" and ctx.job.params.get("progressive") is True

    # -- the stages --------------------------------------------------------------------

    async def ingest(self, ctx: JobContext) -> StageDone:
        quality = self._quality(ctx)
        resolution = self.model.input_resolution(quality)
        if not ctx.job.input_ref:
            raise InputMissing("the job has no input image")
        source = ctx.job.input_sha256 or ctx.job.input_ref
        # A progressive job's ingest also stores the image at the preview resolution, for
        # reconstruct's quick pass (and its digest says so: its outputs differ).
        quick = self._progressive(ctx)
        quick_resolution = self.model.input_resolution("preview") if quick else 0
        foreground = (remover_version(self.gpu.remover), str(self.settings.foreground_margin))
        parts = [INGEST_VERSION, source, str(resolution), *foreground]
        if quick:
            parts += ["quick", str(quick_resolution)]
        digest = stage_digest(*parts)
        resolutions = (resolution, quick_resolution) if quick else (resolution,)

        async def work() -> tuple[dict[str, bytes], dict[str, str]]:
            data = await self.storage.get_bytes(ctx.job.input_ref)
            prepared = await ctx.run_blocking(self.gpu.prepare, data, resolutions)
            image = prepared.images[resolution]
            files = {"image.pt": await ctx.run_blocking(tensor_bytes, {"image": image})}
            facts = {"resolution": str(resolution), **foreground_fields(prepared.foreground)}
            if quick:
                small = prepared.images[quick_resolution]
                files[QUICK_IMAGE] = await ctx.run_blocking(tensor_bytes, {"image": small})
                facts["quick_resolution"] = str(quick_resolution)
            if prepared.mask_png is not None:
                files[MASK_PNG] = prepared.mask_png
            return files, facts

        names: tuple[str, ...] = ("image.pt", QUICK_IMAGE) if quick else ("image.pt",)
        if self.gpu.remover is not None:
            names += (MASK_PNG,)
        return await self._stage(ctx, PipelineStage.INGEST, digest, names, work)

    async def reconstruct(self, ctx: JobContext) -> StageDone:
        quality = self._quality(ctx)
        source = self.store.upstream(ctx.job, PipelineStage.INGEST)
        digest = stage_digest(source.digest, self.model.version, quality)
        stage = PipelineStage.RECONSTRUCT
        quick = self._progressive(ctx) and QUICK_IMAGE in source.outputs
        # The quick result's folder is named by the digest the stage's outputs are stored
        # under (a redrive's rerun nonce included), so a retried run writes the same one.
        effective = self.store.effective_digest(ctx.job, stage, digest)

        charged: dict[str, str] = {}

        async def full_pass(image: torch.Tensor) -> Gaussians:
            gaussians, ms = await self.gpu.infer_charged(ctx, image, quality, int(image.shape[-1]))
            if ms is not None:  # a hosted model: the vendor's time or cost, not ours
                charged[CHARGED_MS_FACT] = str(ms)
            return gaussians

        async def work() -> tuple[dict[str, bytes], dict[str, str]]:
            blob = await self.store.read(source, "image.pt")
            image = (await ctx.run_blocking(bytes_tensors, blob))["image"]
            resolution = int(image.shape[-1])
            facts: dict[str, str] = {}
            if quick:
                # Both passes at once: the quick one goes through the preview batcher (the
                # interactive class, first on the device), its encoding and rendering
                # overlap the full pass. (Not a TaskGroup: its ExceptionGroup would hide the
                # error's code from the worker's retry decision.)
                quick_task = asyncio.create_task(
                    self._quick_or_none(ctx, source, quick_run(effective))
                )
                try:
                    gaussians = await full_pass(image)
                except BaseException:
                    quick_task.cancel()
                    await asyncio.wait([quick_task])
                    if not quick_task.cancelled():
                        quick_task.exception()  # retrieved: the full pass's error wins
                    raise
                facts.update(await quick_task)
            else:
                gaussians = await full_pass(image)
            blob = await ctx.run_blocking(gaussians_bytes, gaussians)
            facts.update(
                gaussian_count=str(gaussians.count),
                resolution=str(resolution),
                model=self.model.version,
                **charged,
            )
            return {"gaussians.pt": blob}, facts

        done = await self._stage(ctx, stage, digest, ("gaussians.pt",), work)
        if quick and done.skipped and done.facts.get("quick_run"):
            # a reuse meters the quick result an earlier run made (once per unit)
            await ctx.meter(quick_unit(effective), facts_int(done.facts, "quick_ms"))
        if quick:
            # a run that reused stored outputs (a retry, a redrive) announces what an earlier
            # run could not (it died between its commit of the files and its announce)
            await self._announce_quick(ctx, done.facts)
        return done

    async def _quick_or_none(
        self, ctx: JobContext, source: StageRecord, run: str
    ) -> dict[str, str]:
        """The quick result, or (it failed for good) none: it is an extra, and the full
        result goes on without it (no preview_ready). A transient failure, a cancel, a lost
        lease or a deferral (a hosted model's vendor said later) end the stage's run as usual
        (a retry does both passes again)."""
        try:
            return await self._quick_result(ctx, source, run)
        except (TransientError, JobCanceled, LeaseLost, Deferred):
            raise
        except Exception as exc:
            code = exc.code if isinstance(exc, SplatqError) else type(exc).__name__
            ctx.log.exception("stage.quick_result_failed", code=code)
            return {}

    async def _quick_result(self, ctx: JobContext, source: StageRecord, run: str) -> dict[str, str]:
        """A progressive job's quick result: the preview-resolution image through the preview
        batcher, encoded and rendered like the full result, verified and committed into the
        job's folder `run` (each file written temporary, then renamed). Returns the facts
        that name it; the reconstruct stage's advance announces it (preview_ready)."""
        started = time.monotonic()
        blob = await self.store.read(source, QUICK_IMAGE)
        image = (await ctx.run_blocking(bytes_tensors, blob))["image"]
        resolution = int(image.shape[-1])
        gaussians, charged_ms = await self.gpu.infer_charged(ctx, image, "preview", resolution)
        camera = self.model.input_camera(resolution)
        mask = await self._mask(source)
        encoded = await ctx.run_blocking(encode_artifacts, gaussians, camera, mask)
        staged = await stage_and_verify(self.storage, ctx.job.id, encoded, run)
        await publish(self.storage, staged)
        ms = round((time.monotonic() - started) * 1000) if charged_ms is None else charged_ms
        ctx.log.info("stage.quick_result", run=run, resolution=resolution, duration_ms=ms)
        # Metered as soon as it is committed: the tenant has it (and may cancel the full pass).
        await ctx.meter(quick_unit(run.removeprefix(QUICK_RUN_PREFIX)), ms)
        facts = {
            "quick_run": run,
            "quick_artifacts": ",".join(encoded.files),
            "quick_resolution": str(resolution),
            "quick_gaussian_count": str(encoded.gaussian_count),
            "quick_ms": str(ms),
            "model": self.model.version,
        }
        # Announced at once, while the full pass may still run: the point of a quick result.
        await self._announce_quick(ctx, facts)
        return facts

    async def _announce_quick(self, ctx: JobContext, facts: Mapping[str, str]) -> None:
        """`preview_ready` for the committed quick result named by `facts`, from inside the
        run (announce.lua: fenced by the lease, once per job), recording the folder in the
        job (`quick_run`) in the same step so its URLs work at once. Nothing when the quick
        result failed (logged then) or its files are gone (retention)."""
        run = facts.get("quick_run", "")
        if not run:
            return
        listed = [n for n in facts.get("quick_artifacts", "").split(",") if n in ARTIFACT_FILES]
        names = listed or list(_QUICK_DEFAULT)
        keys = [artifact_key(ctx.job.id, ARTIFACT_FILES[n], run) for n in names]
        if not await self.store.all_exist(keys):
            ctx.log.warning("stage.quick_result_missing", run=run)
            return
        base = self.settings.public_base_url
        extra = events.preview_ready_fields(
            facts.get("model", "") or self.model.version,
            facts_int(facts, "quick_ms"),
            facts_int(facts, "quick_resolution"),
            {name: quick_artifact_url(base, ctx.job.id, name) for name in names},
        )
        if await ctx.announce(EventType.PREVIEW_READY.value, extra, {"quick_run": run}):
            ctx.log.info("stage.preview_ready", run=run)

    async def _mask(self, ingested: StageRecord) -> bytes | None:
        """Stage 0's mask PNG that ingest stored (None: it found none, or predates it)."""
        if MASK_PNG not in ingested.outputs:
            return None
        return await self.store.read(ingested, MASK_PNG)

    async def _gaussians(self, ctx: JobContext, reconstructed: StageRecord) -> Gaussians:
        """The Gaussians the reconstruct stage stored (export's and render's input)."""
        blob = await self.store.read(reconstructed, "gaussians.pt")
        return await ctx.run_blocking(bytes_gaussians, blob)

    async def export(self, ctx: JobContext) -> StageDone:
        source = self.store.upstream(ctx.job, PipelineStage.RECONSTRUCT)
        digest = stage_digest(source.digest, EXPORT_VERSION)

        async def work() -> tuple[dict[str, bytes], dict[str, str]]:
            gaussians = await self._gaussians(ctx, source)
            files = await ctx.run_blocking(encode_files, gaussians)
            return files, dict(source.facts)

        names = ("gaussian_ply", "splat", "spz")
        return await self._stage(ctx, PipelineStage.EXPORT, digest, names, work)

    async def render(self, ctx: JobContext) -> StageDone:
        source = self.store.upstream(ctx.job, PipelineStage.RECONSTRUCT)
        digest = stage_digest(source.digest, RENDER_VERSION)

        async def work() -> tuple[dict[str, bytes], dict[str, str]]:
            gaussians = await self._gaussians(ctx, source)
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
        # An export made before .spz existed (a job in flight across the upgrade) has none:
        # the job completes without it, as jobs finished before it did.
        if "spz" in exported.outputs:
            files["spz"] = await self.store.read(exported, "spz")
        ingested = self.store.upstream(ctx.job, PipelineStage.INGEST)
        mask = await self._mask(ingested)
        if mask is not None:
            files["mask"] = mask
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
        compute_ms = total_ms(ctx.job.metered)
        return JobOutcome(
            artifacts={
                name: artifact_url(base, ctx.job.id, name)
                for name in ARTIFACT_FILES
                if name in files
            },
            compute_time_ms=compute_ms,
            model=exported.facts.get("model", "") or self.model.version,
            extra_fields={
                "gaussian_count": str(count),
                "artifact_run": run,
                **foreground_fields(ingested.facts.get("foreground")),
            },
        )


def make(settings: Settings) -> StageHandlers:
    """Stage handlers factory for `splatq worker --stages ...` (the default)."""
    storage = open_storage(
        settings.storage_url, settings.storage_root, s3_endpoint_url=settings.s3_endpoint_url
    )
    model = model_for(settings, storage)
    return StageHandlers(GpuJobHandler(settings, model, storage, GpuMetrics.create()))
