"""A fake hosted-model vendor (aiohttp, real HTTP on loopback) shaped like Replicate's
predictions API, strict about its limits and recording everything a test asserts on.

- Limits: at most `rate` prediction creations in any sliding window of `per_s` seconds, and at
  most `concurrency` predictions in flight (created, not yet ended). A create past either is
  recorded as a *violation* (the caller broke the vendor's limit) and answered 429 with
  Retry-After, as a real vendor would.
- Faults, scripted per create (`script`: 429 with Retry-After, 500, 503, 400, a timeout, a
  slow body) or for a period (`storm_until`: every create answers 429).
- Predictions are asynchronous (`mode="async"`: created `starting`, `succeeded` after their
  duration, polled by GET) or synchronous (`mode="sync"`: the create answers when done).
- Idempotency: a create with a known `Idempotency-Key` answers the prediction made for it
  (no second one); `created_per_key` counts predictions per key.
- Cancel: `POST /v1/predictions/{id}/cancel` ends it `canceled`; `canceled` records which.
- Webhooks: a create naming `webhook` is called back, Standard Webhooks signed, when it ends.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import torch
from aiohttp import web
from aiohttp.test_utils import TestServer

from splatq.services.gpu_worker.formats import to_ply_bytes, to_splat_bytes
from splatq.services.gpu_worker.gaussians import Gaussians
from splatq.shared.webhooks.signing import signed_headers

TOKEN = "r8_fake_vendor_token_0123456789abcdef"


def sample_gaussians(n: int = 128, seed: int = 7) -> Gaussians:
    """A small, valid Gaussian cloud in front of the input camera (what a vendor returns)."""
    g = torch.Generator().manual_seed(seed)
    means = torch.rand(n, 3, generator=g) - 0.5
    means[:, 2] += 2.0
    return Gaussians(
        means=means,
        log_scales=torch.full((n, 3), -4.0),
        rotations=torch.tensor([[1.0, 0.0, 0.0, 0.0]]).repeat(n, 1),
        opacity_logits=torch.full((n,), 2.0),
        sh_dc=torch.rand(n, 3, generator=g) - 0.5,
    )


@dataclass
class Prediction:
    id: str
    key: str
    created: float
    duration_s: float
    status: str = "starting"
    ended: float | None = None
    webhook: str = ""
    input_kind: str = ""

    def refresh(self, now: float) -> None:
        if self.status in ("starting", "processing") and now >= self.created + self.duration_s:
            self.status, self.ended = "succeeded", self.created + self.duration_s
        elif self.status == "starting" and now >= self.created + 0.05:
            self.status = "processing"

    @property
    def done(self) -> bool:
        return self.status in ("succeeded", "failed", "canceled")


@dataclass
class FakeVendor:
    rate: int = 60
    per_s: float = 60.0
    concurrency: int = 5
    duration_s: float = 1.0
    # when given, the predictions' durations in turn (cycled) instead of duration_s
    durations: tuple[float, ...] = ()
    mode: str = "async"
    output: str = "ply"  # ply | splat | glb
    webhook_secret: str = ""
    # Faults for the next creates, in order: ("429", retry_after_s), ("500",), ("503", s),
    # ("400", message), ("timeout", seconds), ("slow", seconds) (a body dribbled over s).
    script: list[tuple[Any, ...]] = field(default_factory=list)
    storm_until: float = 0.0  # monotonic: every create before it answers 429
    storm_retry_after_s: float = 1.0
    # what the vendor reports (predict_time in metrics), or None
    predict_time_s: float | None = 1.25
    url: str = ""

    def __post_init__(self) -> None:
        self.predictions: dict[str, Prediction] = {}
        self.by_key: dict[str, str] = {}
        self.created_per_key: Counter[str] = Counter()
        self.creations: deque[float] = deque()
        self.create_times: list[float] = []
        self.violations: list[tuple[str, float, str]] = []
        self.answers: Counter[int] = Counter()
        self.canceled: list[str] = []
        self.requests: list[tuple[str, str]] = []
        self.bodies: list[Any] = []
        self.max_in_flight = 0
        self._ids = itertools.count(1)
        self._server: TestServer | None = None
        self._open_sync = 0
        self._tasks: set[asyncio.Task[None]] = set()
        blob = sample_gaussians()
        self.file = {"ply": to_ply_bytes(blob), "splat": to_splat_bytes(blob),
                     "glb": b"glTF" + b"\0" * 60}[self.output]  # fmt: skip

    # -- running -----------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_post("/v1/predictions", self._create)
        app.router.add_get("/v1/predictions/{id}", self._get)
        app.router.add_post("/v1/predictions/{id}/cancel", self._cancel)
        app.router.add_get("/files/{id}", self._file)
        self._server = TestServer(app, host="127.0.0.1")
        await self._server.start_server()
        self.url = str(self._server.make_url("")).rstrip("/")
        return self.url

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            await self._server.close()

    # -- what tests read -----------------------------------------------------------------

    def in_flight(self, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        for p in self.predictions.values():
            p.refresh(now)
        return sum(not p.done for p in self.predictions.values()) + self._open_sync

    @property
    def created(self) -> int:
        return len(self.predictions)

    # -- handlers ------------------------------------------------------------------------

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {TOKEN}"

    def _limits(self, now: float) -> str:
        while self.creations and self.creations[0] <= now - self.per_s:
            self.creations.popleft()
        if len(self.creations) >= self.rate:
            return f"rate: {len(self.creations) + 1} creations in {self.per_s:g} s"
        if self.in_flight(now) >= self.concurrency:
            return f"concurrency: {self.in_flight(now) + 1} in flight"
        return ""

    async def _create(self, request: web.Request) -> web.StreamResponse:
        now = time.monotonic()
        self.requests.append(("create", request.headers.get("Idempotency-Key", "")))
        if not self._authorized(request):
            return self._answer(401, {"detail": "Invalid token."})
        body, kind = await self._read_input(request)
        self.bodies.append(body)
        if self.script:
            fault = await self._fault(self.script.pop(0), request)
            if fault is not None:
                return fault
        if now < self.storm_until:
            return self._answer(429, {"detail": "slow down"}, self.storm_retry_after_s)
        key = request.headers.get("Idempotency-Key", "")
        if key and key in self.by_key:
            return self._answer(201, self._doc(self.predictions[self.by_key[key]]))
        problem = self._limits(now)
        if problem:
            self.violations.append(("limit", now, problem))
            return self._answer(429, {"detail": "rate limit exceeded"}, 1.0)
        self.creations.append(now)
        self.create_times.append(now)
        n = next(self._ids)
        pid = f"p{n:05d}"
        cycle = self.durations or (self.duration_s,)
        duration = cycle[(n - 1) % len(cycle)]
        p = Prediction(pid, key, now, duration, webhook=str(body.get("webhook", "")),
                       input_kind=kind)  # fmt: skip
        self.predictions[pid] = p
        self.created_per_key[key] += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight(now))
        if key:
            self.by_key[key] = pid
        if p.webhook:
            self._spawn(self._call_back(p))
        if self.mode == "sync":
            self._open_sync += 1
            try:
                await asyncio.sleep(p.duration_s)
            finally:
                self._open_sync -= 1
            p.refresh(time.monotonic())
        return self._answer(201, self._doc(p), headers={"X-Request-Id": f"req-{pid}"})

    async def _read_input(self, request: web.Request) -> tuple[dict[str, Any], str]:
        if request.content_type == "multipart/form-data":
            form = await request.post()
            image = form.get("image")
            data = image.file.read() if isinstance(image, web.FileField) else b""
            fields = {k: v for k, v in form.items() if isinstance(v, str)}
            return {**fields, "_image_bytes": len(data)}, "multipart"
        doc = orjson.loads(await request.read() or b"{}")
        ref = str((doc.get("input") or {}).get("image", ""))
        if ref.startswith("data:image/"):
            base64.b64decode(ref.split(",", 1)[1], validate=True)
            return doc, "data_uri"
        if ref.startswith("http"):
            async with aiohttp.ClientSession() as s, s.get(ref) as resp:
                fetched = await resp.read()
                if resp.status != 200 or not fetched:
                    raise web.HTTPBadRequest(text="input URL did not answer an image")
            return doc, "url"
        return doc, "none"

    async def _fault(  # noqa: PLR0911 - one answer per kind of fault
        self, fault: tuple[Any, ...], request: web.Request
    ) -> web.StreamResponse | None:
        kind = fault[0]
        if kind == "slow":  # a 500 whose body dribbles out (a vendor stalling mid-answer)
            resp = web.StreamResponse(status=500)
            await resp.prepare(request)
            for _ in range(10):
                await resp.write(b" ")
                await asyncio.sleep(fault[1] / 10)
            await resp.write_eof()
            return resp
        if kind == "429":
            return self._answer(429, {"detail": "slow down"}, fault[1])
        if kind == "503":
            return self._answer(503, {"detail": "busy"}, fault[1])
        if kind == "500":
            return self._answer(500, {"detail": "internal error"})
        if kind == "400":
            return self._answer(400, {"detail": fault[1]})
        if kind == "timeout":
            await asyncio.sleep(fault[1])
            return self._answer(504, {"detail": "gateway timeout"})
        return None

    async def _get(self, request: web.Request) -> web.Response:
        self.requests.append(("get", request.match_info["id"]))
        if not self._authorized(request):
            return self._answer(401, {"detail": "Invalid token."})
        p = self.predictions.get(request.match_info["id"])
        if p is None:
            return self._answer(404, {"detail": "Not found."})
        p.refresh(time.monotonic())
        return self._answer(200, self._doc(p))

    async def _cancel(self, request: web.Request) -> web.Response:
        pid = request.match_info["id"]
        self.requests.append(("cancel", pid))
        p = self.predictions.get(pid)
        if p is None:
            return self._answer(404, {"detail": "Not found."})
        p.refresh(time.monotonic())
        if not p.done:
            p.status, p.ended = "canceled", time.monotonic()
            self.canceled.append(pid)
        return self._answer(200, self._doc(p))

    async def _file(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=self.file, content_type="application/octet-stream")

    def _doc(self, p: Prediction) -> dict[str, Any]:
        out: Any = None
        if p.status == "succeeded":
            out = [f"{self.url}/files/{p.id}.log", f"{self.url}/files/{p.id}.{self.output}"]
        metrics = {"predict_time": self.predict_time_s} if self.predict_time_s else {}
        return {
            "id": p.id, "status": p.status, "output": out, "error": None, "metrics": metrics,
            "urls": {"get": f"{self.url}/v1/predictions/{p.id}"},
        }  # fmt: skip

    def _answer(
        self,
        status: int,
        doc: Any,
        retry_after_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> web.Response:
        self.answers[status] += 1
        extra = dict(headers or {})
        if retry_after_s is not None:
            extra["Retry-After"] = f"{retry_after_s:g}"
        return web.json_response(doc, status=status, headers=extra)

    # -- webhooks ------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call_back(self, p: Prediction) -> None:
        while True:
            p.refresh(time.monotonic())
            if p.done:
                break
            await asyncio.sleep(0.05)
        body = orjson.dumps(self._doc(p))
        headers = signed_headers([self.webhook_secret], f"msg_{p.id}", int(time.time()), body)
        async with aiohttp.ClientSession() as s, s.post(p.webhook, data=body, headers={
            **headers, "Content-Type": "application/json"}) as resp:  # fmt: skip
            await resp.read()
