"""`SPLATQ_MODEL=remote`: the reconstruction runs at a vendor's hosted model (config in
SPLATQ_REMOTE_CONFIG, docs/hosted-model.md) instead of on the worker's device.

It plugs in where the local model's forward pass is (`GpuJobHandler.infer_one`): the job's
normalised image goes to the vendor, and the Gaussians it returns are exported, rendered,
verified and committed by the same code and the same fenced commit as a local model's.
Per process it holds the vendor's client and lane, and renews the concurrency slots its
calls hold; the lane's own gauges are sampled from Redis for the whole fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import random
from collections.abc import Callable
from dataclasses import dataclass

import structlog
import torch
from PIL import Image
from prometheus_client import REGISTRY, CollectorRegistry
from redis.asyncio import Redis

from splatq.services.gpu_worker.camera import Camera
from splatq.services.gpu_worker.gaussians import Gaussians
from splatq.services.gpu_worker.remote.calls import Lane, RemoteCall
from splatq.services.gpu_worker.remote.client import VendorClient
from splatq.services.gpu_worker.remote.convert import to_gaussians
from splatq.services.gpu_worker.remote.metrics import UpstreamMetrics
from splatq.shared.engine.job_context import JobContext
from splatq.shared.redis.client import connect
from splatq.shared.settings import Settings
from splatq.shared.storage.store import Storage, intermediate_key
from splatq.shared.vendor.config import VendorConfig, VendorConfigError, load_vendor_config
from splatq.shared.vendor.credentials import Credential
from splatq.shared.vendor.limiter import VendorLane
from splatq.shared.vendor.shape import data_uri

log = structlog.get_logger("splatq.remote")
SAMPLE_INTERVAL_S = 5.0


@dataclass(frozen=True, slots=True)
class RemoteResult:
    gaussians: Gaussians
    charge_ms: int  # what the quota is charged for this call (policy.charge)


def encode_input(image: torch.Tensor, image_format: str) -> bytes:
    """The job's normalised [4, R, R] RGBA image as the file the vendor gets (blocking):
    PNG keeps the cut-out's alpha; JPEG is composited on white."""
    rgba = (image.detach().to("cpu").clamp(0, 1) * 255).round().to(torch.uint8)
    array = rgba.permute(1, 2, 0).contiguous().numpy()
    picture = Image.fromarray(array, "RGBA")
    buf = io.BytesIO()
    if image_format == "jpeg":
        background = Image.new("RGB", picture.size, (255, 255, 255))
        background.paste(picture, mask=picture.getchannel("A"))
        background.save(buf, "JPEG", quality=92)
    else:
        picture.save(buf, "PNG", optimize=False)
    return buf.getvalue()


class RemoteModel:
    """The model surface the handlers use (version, input resolution and camera), with the
    vendor call in place of the batched forward pass (`reconstruct`)."""

    def __init__(
        self,
        settings: Settings,
        config: VendorConfig,
        credential: Credential,
        storage: Storage | None = None,
        registry: CollectorRegistry = REGISTRY,
        rng: random.Random | None = None,
        lane_factory: Callable[[Redis, VendorConfig], VendorLane] = VendorLane,
    ) -> None:
        if config.limits.slot_ttl_s * 1000 < 2 * (
            settings.lease_ttl_ms + settings.reaper_interval_ms
        ):
            raise VendorConfigError(
                "limits.slot_ttl_s must be at least twice SPLATQ_LEASE_TTL_MS +"
                " SPLATQ_REAPER_INTERVAL_MS: a job taken over after a crash must find its"
                " prediction's slot still held"
            )
        presigns = storage is not None and hasattr(storage, "presigned_get_url")
        if config.request.image_as == "url" and config.request.shape == "json" and not presigns:
            raise VendorConfigError(
                "request.image_as = 'url' needs object storage that presigns (s3://)"
            )
        self.settings = settings
        self.config = config
        self.client = VendorClient(config, credential)
        self.storage = storage
        self.metrics = UpstreamMetrics.create(registry)
        self._rng = rng or random.Random()
        # The fleet-wide lane; bench/remote_vendor.py swaps in a per-process limiter to show
        # what that costs.
        self._lane_factory = lane_factory
        self._redis: Redis | None = None
        self._lane: Lane | None = None
        self._held: dict[str, str] = {}
        self._tasks: list[asyncio.Task[None]] = []

    # -- the model surface ------------------------------------------------------------

    @property
    def version(self) -> str:
        return self.config.version

    def input_resolution(self, quality: str) -> int:
        try:
            return self.config.request.resolution[quality]
        except KeyError:
            raise ValueError(f"unknown quality {quality!r}; expected preview or full") from None

    def input_camera(self, resolution: int) -> Camera:
        return Camera.input_view(resolution, resolution)

    def load(self, device: torch.device) -> None:
        """Nothing to load: the weights are the vendor's."""

    def infer(self, images: torch.Tensor) -> list[Gaussians]:
        raise RuntimeError("a remote model has no local forward pass; use reconstruct()")

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        if self._lane is not None:
            return
        self._redis = connect(self.settings.redis_url, client_name="splatq-remote")
        await self.client.start()
        self._lane = Lane(
            config=self.config,
            client=self.client,
            lane=self._lane_factory(self._redis, self.config),
            redis=self._redis,
            metrics=self.metrics,
            rng=self._rng,
            held=self._held,
            image_ref=self._image_ref,
        )
        self._tasks = [
            asyncio.create_task(self._renew_loop(), name="remote-renew"),
            asyncio.create_task(self._sample_loop(), name="remote-sample"),
        ]
        log.info("remote.ready", vendor=self.config.name, version=self.version,
                 limits=f"{self.config.limits.rate}/{self.config.limits.per_s:g}s,"
                 f" {self.config.limits.concurrency} in flight")  # fmt: skip

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self.client.close()
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None
        self._lane = None

    # -- one call -----------------------------------------------------------------------

    async def reconstruct(self, ctx: JobContext, image: torch.Tensor, quality: str) -> RemoteResult:
        """One job's image through the vendor (the call named after its quality)."""
        if self._lane is None:
            await self.start()
        assert self._lane is not None
        data = await ctx.run_blocking(encode_input, image, self.config.request.image_format)
        digest = hashlib.sha256(data).hexdigest()
        outcome = await RemoteCall(self._lane, ctx, quality, data, digest).run()
        gaussians = await ctx.run_blocking(to_gaussians, outcome.output, self.config.output.format)
        return RemoteResult(gaussians, outcome.charge.ms)

    async def _image_ref(self, job_id: str, image: bytes) -> str:
        """How the image is named in a JSON request: a data URI, or a presigned GET of a copy
        in object storage (with the job's intermediates: cleanup deletes it)."""
        req = self.config.request
        if req.image_as == "data_uri" or self.storage is None:
            return data_uri(image, req.image_format)
        key = intermediate_key(job_id, "remote", hashlib.sha256(image).hexdigest()[:16],
                               f"input.{req.image_format}")  # fmt: skip
        await self.storage.put_bytes(key, image)
        presign = getattr(self.storage, "presigned_get_url")  # noqa: B009 - checked at start
        url: str = await presign(key, expires_s=req.url_ttl_s)
        return url

    # -- background -----------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        """Renew every slot this process holds, three times per slot TTL; a slot found gone
        (Redis was away longer than its TTL) is adopted back while its call still runs."""
        interval = self.config.limits.slot_ttl_s / 3
        while True:
            await asyncio.sleep(interval)
            lane = self._lane
            if lane is None:
                continue
            for member, tenant in list(self._held.items()):
                try:
                    if not await lane.lane.hold(member, tenant) and member in self._held:
                        await lane.lane.hold(member, tenant, adopt=True)
                except Exception as exc:
                    log.warning("remote.renew_failed", error=str(exc)[:200])
                    break
            self.metrics.slots_held_here.labels(self.config.name).set(len(self._held))

    async def _sample_loop(self) -> None:
        """The lane as Redis holds it, for the whole fleet (every process samples it)."""
        name = self.config.name
        while True:
            lane = self._lane
            if lane is not None:
                try:
                    state = await lane.lane.state()
                    self.metrics.slots_in_use.labels(name).set(state.slots_held)
                    self.metrics.waiting.labels(name).set(state.waiting)
                    self.metrics.breaker_open.labels(name).set(state.breaker == "open")
                except Exception as exc:
                    log.warning("remote.sample_failed", error=str(exc)[:200])
            await asyncio.sleep(SAMPLE_INTERVAL_S)


def load_remote_model(settings: Settings, storage: Storage | None = None) -> RemoteModel:
    """The remote model of SPLATQ_REMOTE_CONFIG (a configuration error names what is wrong)."""
    if not settings.remote_config:
        raise VendorConfigError("SPLATQ_MODEL=remote needs SPLATQ_REMOTE_CONFIG (a TOML file)")
    config = load_vendor_config(settings.remote_config)
    return RemoteModel(settings, config, Credential(config.auth), storage)
