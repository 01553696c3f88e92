"""The GPU worker's job handler: input → batched forward pass → artifacts → outcome.

Runs on the engine's worker runtime (leases, retries, outbox come from there). Inference,
rendering and encoding run off the event loop so heartbeats are never starved.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog
import torch

from splatq.services.gpu_worker.artifacts import (
    BeforeCommit,
    discard_all,
    encode_artifacts,
    publish,
    stage_and_verify,
)
from splatq.services.gpu_worker.batching import DynamicBatcher
from splatq.services.gpu_worker.device_scheduler import ChunkSizer, DeviceScheduler, Priority
from splatq.services.gpu_worker.foreground import PreparedInput, load_remover, prepare_input
from splatq.services.gpu_worker.gaussians import Gaussians
from splatq.services.gpu_worker.metrics import GpuMetrics
from splatq.services.gpu_worker.model import ReconstructionModel, model_for
from splatq.services.gpu_worker.oom import (
    DeviceOutOfMemory,
    MemoryBudget,
    forward_with_oom_split,
    release_device_memory,
)
from splatq.services.gpu_worker.remote.backend import RemoteModel
from splatq.services.gpu_worker.renderer import flush_denormals_in_this_thread
from splatq.shared.engine.artifact_refs import job_artifact_path
from splatq.shared.engine.cpu_priority import ClassExecutors
from splatq.shared.engine.job_context import JobContext
from splatq.shared.engine.jobs import JobOutcome
from splatq.shared.engine.keys import StreamName
from splatq.shared.errors import PermanentError, SplatqError
from splatq.shared.images.headers import DecodeLimits
from splatq.shared.settings import Settings
from splatq.shared.storage.store import (
    QUICK_VARIANT,
    Storage,
    artifact_prefix,
    artifact_run,
    open_storage,
)

log = structlog.get_logger("splatq.gpu_worker")
QUALITIES = ("preview", "full")
# Interactive (preview) passes go before synthesis (full) passes on the device.
PRIORITIES = {"preview": Priority.INTERACTIVE, "full": Priority.SYNTHESIS}
# torch's own intra-op thread count at import (one per core unless OMP_NUM_THREADS says).
DEFAULT_TORCH_THREADS = torch.get_num_threads()
PASS_STREAMS = {
    Priority.INTERACTIVE: StreamName.INTERACTIVE,
    Priority.SYNTHESIS: StreamName.SYNTHESIS,
}


class InputMissing(PermanentError):
    code = "INPUT_MISSING"


def select_device(setting: str) -> torch.device:
    """`auto` picks CUDA when present; asking for `cuda` without one is a configuration error."""
    if setting == "cuda" or (setting == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("SPLATQ_DEVICE=cuda but torch sees no CUDA device")
        return torch.device("cuda")
    return torch.device("cpu")


def artifact_url(base_url: str, job_id: str, name: str) -> str:
    # The path the record's compact form assumes (shared/engine/artifact_refs.py).
    return base_url + job_artifact_path(job_id) + name


def quick_artifact_url(base_url: str, job_id: str, name: str) -> str:
    """A progressive job's quick-result artifact (the gateway's `?variant=quick`)."""
    return f"{artifact_url(base_url, job_id, name)}?variant={QUICK_VARIANT}"


@dataclass(frozen=True, slots=True)
class _Item:
    image: torch.Tensor  # [4, R, R] on CPU
    quality: str
    enqueued_at: float
    job_id: str = ""


def foreground_fields(source: str | None) -> dict[str, str]:
    """The job hash's `foreground` (the job view's), when stage 0 found the object."""
    return {"foreground": source} if source else {}


def batch_hint(hints: Mapping[str, str]) -> int:
    """The `batch_max_size` a redrive policy set on the job (`hint_batch_max_size`, e.g.
    after CUDA_OUT_OF_MEMORY), or 0 (none, or not a positive integer: ignored)."""
    raw = hints.get("batch_max_size", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else 0


class GpuJobHandler:
    """One per worker process: owns the model, one batcher per quality, and the storage."""

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
        self.metrics = metrics
        self.device = device or select_device(settings.device)
        self.budget = MemoryBudget(settings.device_memory_budget_pixels)
        self.decode_limits = DecodeLimits.from_settings(settings)
        # Stage 0's remover, loaded now: a missing learned model stops the worker at start.
        self.remover = load_remover(settings)
        self.forward_passes = 0
        self.device_scheduler = DeviceScheduler()
        # (quality, items) of every forward pass, last 1,000: what ran on the device, in order
        self.pass_log: deque[tuple[str, int]] = deque(maxlen=1000)
        self.synthesis_chunks = ChunkSizer(
            settings.device_max_pass_ms / 1000, settings.batch_max_size
        )
        self._cuda_streams: dict[Priority, Any] = {}
        # Forward passes run in their class's threads: on a CPU device the synthesis ones at
        # a lower OS priority (shared/engine/cpu_priority.py), like the CUDA stream priority.
        self.executors = ClassExecutors(
            settings.synthesis_nice, 2, "splatq-pass", self.thread_setup
        )
        # Tests inject a failure at the publish step here (see artifacts.publish).
        self.before_commit: BeforeCommit | None = None
        self.batchers: dict[str, DynamicBatcher[_Item, Gaussians]] = {
            q: DynamicBatcher(
                run_batch=self._make_runner(q),
                max_size=settings.batch_max_size,
                max_wait_s=settings.batch_max_wait_ms / 1000,
                max_cost=settings.batch_max_pixels,
            )
            for q in QUALITIES
        }

    def thread_setup(self, stream: StreamName) -> None:
        """Per pool thread: torch's intra-op threads are per thread, so an interactive job's
        work keeps every core while a synthesis job's stays in its own niced thread. Subnormal
        floats are flushed to zero in the thread before its intra-op team exists, so the team
        inherits it (renderer.denormals_flushed says why)."""
        flush_denormals_in_this_thread()
        n = self.settings.synthesis_torch_threads
        torch.set_num_threads(n if n and stream is StreamName.SYNTHESIS else DEFAULT_TORCH_THREADS)

    async def startup(self) -> None:
        await asyncio.to_thread(self.model.load, self.device)
        if isinstance(self.model, RemoteModel):
            await self.model.start()  # the vendor's client and fleet-wide lane
        if self.device.type == "cuda":
            # CUDA runs a higher-priority stream's kernels first when both have work queued.
            self._cuda_streams = {
                Priority.INTERACTIVE: torch.cuda.Stream(self.device, priority=-1),  # type: ignore[no-untyped-call]
                Priority.SYNTHESIS: torch.cuda.Stream(self.device, priority=0),  # type: ignore[no-untyped-call]
            }
        for b in self.batchers.values():
            b.start()
        log.info(
            "gpu_worker.ready",
            device=str(self.device),
            model=self.model.version,
            max_batch=self.settings.batch_max_size,
        )

    async def shutdown(self) -> None:
        await self.stop_model()
        self.executors.shutdown()
        close = getattr(self.storage, "close", None)
        if close is not None:
            await close()

    async def stop_model(self) -> None:
        """The batchers, and a remote model's client and lane (the reconstruct stage's end)."""
        for b in self.batchers.values():
            await b.stop()
        if isinstance(self.model, RemoteModel):
            await self.model.stop()

    # -- the job ------------------------------------------------------------------------

    async def __call__(self, ctx: JobContext) -> JobOutcome:
        try:
            return await self._reconstruct(ctx)
        except SplatqError as exc:
            if self.metrics is not None:
                self.metrics.job_errors.labels(exc.code).inc()
            raise

    async def _reconstruct(self, ctx: JobContext) -> JobOutcome:
        quality = ctx.job.quality if ctx.job.quality in QUALITIES else "full"
        resolution = self.model.input_resolution(quality)
        started = time.monotonic()
        await ctx.progress(0.05, "loading_input")
        # Each run writes to its own folder (a stale run can never replace another run's
        # committed files); earlier runs killed mid-write may have left temporary files in
        # theirs, and older versions wrote directly under the job.
        run = artifact_run(ctx.attempt)
        await self.storage.sweep_temp(artifact_prefix(ctx.job.id))
        for earlier in range(1, ctx.attempt):
            await self.storage.sweep_temp(f"{artifact_prefix(ctx.job.id)}/{artifact_run(earlier)}")
        if not ctx.job.input_ref:
            raise InputMissing("the job has no input image")
        data = await self.storage.get_bytes(ctx.job.input_ref)
        prepared = await ctx.run_blocking(self.prepare, data, (resolution,))
        await ctx.progress(0.15, "inference")
        gaussians, charged_ms = await self.infer_charged(
            ctx, prepared.images[resolution], quality, resolution
        )
        await ctx.progress(0.6, "encoding")
        camera = self.model.input_camera(resolution)
        encoded = await ctx.run_blocking(encode_artifacts, gaussians, camera, prepared.mask_png)
        await ctx.progress(0.85, "writing_artifacts")
        staged = await stage_and_verify(self.storage, ctx.job.id, encoded, run)
        try:
            # The last stage boundary, checked against Redis: a job canceled or taken over
            # now writes nothing more. A run that loses its job after this point only fills
            # its own folder; the fenced commit decides which folder is the job's.
            await ctx.progress(0.95, "committing_artifacts")
        except BaseException:
            await discard_all(self.storage, staged)
            raise
        await publish(self.storage, staged, self.before_commit)
        base = self.settings.public_base_url
        return JobOutcome(
            artifacts={name: artifact_url(base, ctx.job.id, name) for name in encoded.files},
            compute_time_ms=(
                charged_ms if charged_ms is not None else round((time.monotonic() - started) * 1000)
            ),
            model=self.model.version,
            extra_fields={
                "gaussian_count": str(gaussians.count),
                "artifact_run": run,
                **foreground_fields(prepared.foreground),
            },
        )

    def prepare(self, data: bytes, resolutions: tuple[int, ...]) -> PreparedInput:
        """Stage 0 (blocking): decode, find the object, recentre (the ingest stage's work)."""
        return prepare_input(
            data, resolutions, self.decode_limits, self.remover, self.settings.foreground_margin
        )

    async def infer_one(
        self, ctx: JobContext, image: torch.Tensor, quality: str, resolution: int
    ) -> Gaussians:
        """One job's image through the model (see infer_charged)."""
        return (await self.infer_charged(ctx, image, quality, resolution))[0]

    async def infer_charged(
        self, ctx: JobContext, image: torch.Tensor, quality: str, resolution: int
    ) -> tuple[Gaussians, int | None]:
        """One job's image through the model, and what the quota is charged for it when the
        work ran elsewhere: a hosted model (SPLATQ_MODEL=remote) calls its vendor and charges
        the vendor's reported time or cost; a local model's is measured here (None)."""
        if isinstance(self.model, RemoteModel):
            result = await self.model.reconstruct(ctx, image, quality)
            if self.metrics is not None:
                self.metrics.gaussians_per_job.labels(quality).observe(result.gaussians.count)
            return result.gaussians, result.charge_ms
        return await self._infer_local(ctx, image, quality, resolution), None

    async def _infer_local(
        self, ctx: JobContext, image: torch.Tensor, quality: str, resolution: int
    ) -> Gaussians:
        """One job's image through the quality's batcher: batched with whatever else waits,
        on the device in priority order (the reconstruct stage calls this too)."""
        max_batch = batch_hint(ctx.job.hints)
        if max_batch:
            ctx.log.info("gpu.batch_hint", batch_max_size=max_batch)
        gaussians = await self.batchers[quality].submit(
            _Item(image, quality, time.monotonic(), ctx.job.id),
            cost=resolution * resolution,
            max_batch=max_batch,
        )
        if self.metrics is not None:
            self.metrics.gaussians_per_job.labels(quality).observe(gaussians.count)
        return gaussians

    # -- batches --------------------------------------------------------------------------

    def _make_runner(self, quality: str) -> Any:
        priority = PRIORITIES[quality]

        async def run(items: list[_Item]) -> list[Gaussians | BaseException]:
            now = time.monotonic()
            if self.metrics is not None:
                self.metrics.batch_size.labels(quality).observe(len(items))
                for it in items:
                    self.metrics.queue_wait.labels(quality).observe(now - it.enqueued_at)
            results: list[Gaussians | BaseException] = []
            done = 0
            while done < len(items):
                # A synthesis batch takes the device one chunk at a time, so a waiting
                # interactive batch runs after the current chunk, not after the whole batch.
                size = (
                    len(items)
                    if priority == Priority.INTERACTIVE
                    else (self.synthesis_chunks.size())
                )
                chunk = items[done : done + size]
                async with self.device_scheduler.turn(priority):
                    started = time.monotonic()
                    pool = self.executors.for_stream(PASS_STREAMS[priority])
                    results.extend(
                        await asyncio.get_running_loop().run_in_executor(
                            pool, self._infer_blocking, quality, priority, chunk
                        )
                    )
                    elapsed = time.monotonic() - started
                if priority == Priority.SYNTHESIS:
                    self.synthesis_chunks.observe(len(chunk), elapsed)
                done += len(chunk)
            if self.metrics is not None:
                self.metrics.inference_seconds.labels(quality).observe(time.monotonic() - now)
                self._sample_device_memory()
            return results

        return run

    def _infer_blocking(
        self, quality: str, priority: Priority, items: list[_Item]
    ) -> list[Gaussians | DeviceOutOfMemory]:
        stream = self._cuda_streams.get(priority)

        def forward(batch: Any) -> list[Gaussians]:
            self.forward_passes += 1
            self.pass_log.append((quality, len(batch)))
            images = torch.stack([it.image for it in batch])
            if stream is None:
                self.budget.check(images)
                with torch.inference_mode():
                    return self.model.infer(images.to(self.device))
            with torch.cuda.stream(stream), torch.inference_mode():
                images = images.to(self.device, non_blocking=True)
                self.budget.check(images)
                out = self.model.infer(images)
                stream.synchronize()  # results are complete before another stream reads them
                return out

        def on_split(n: int) -> None:
            if self.metrics is not None:
                self.metrics.oom_splits.labels(quality).inc()
            log.warning("gpu.oom_split", quality=quality, batch=n)

        return forward_with_oom_split(forward, items, release_device_memory, on_split)

    def _sample_device_memory(self) -> None:
        if self.metrics is not None and self.device.type == "cuda":
            self.metrics.device_memory_bytes.set(torch.cuda.memory_allocated(self.device))
            self.metrics.device_memory_peak_bytes.set(torch.cuda.max_memory_allocated(self.device))


def make(settings: Settings) -> GpuJobHandler:
    """Handler factory for `splatq worker` (the default handler)."""
    storage = open_storage(
        settings.storage_url, settings.storage_root, s3_endpoint_url=settings.s3_endpoint_url
    )
    model = model_for(settings, storage)
    return GpuJobHandler(settings, model, storage, GpuMetrics.create())
