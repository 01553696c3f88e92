"""`splatq up`: the local stack -- an embedded redis-server (AOF on, data in ./var/redis)
unless SPLATQ_REDIS_URL is set, plus one process of each service that exists; the job
pipeline runs staged, as in production: GPU worker processes for the device stages and CPU
worker processes for the others, a process per job class (a synthesis one niced as a whole),
so a flood of full jobs never shares a process, a GIL or a priority with a preview.

A supervisor only: it starts, watches and stops child processes; it runs no jobs itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import aiohttp
import structlog
from redis.asyncio import Redis

from splatq.shared.engine.keys import STREAMS, KeySchema, StreamName
from splatq.shared.engine.stages import ALL_STAGES, DEVICE_STAGES, PipelineStage
from splatq.shared.engine.worker_classes import class_label
from splatq.shared.logs import configure_logging
from splatq.shared.redis.client import connect
from splatq.shared.redis.server import RedisServer, RedisServerError, die_with_parent
from splatq.shared.settings import MIN_ADMIN_KEY_CHARS, Settings, process_environment
from splatq.shared.settings.environ import cuda_devices_hidden

log = structlog.get_logger("splatq.stack")
DEFAULT_REDIS_PORT = 6390
DEV_KEY_PREFIX = "sq_dev_"
DEV_KEY_FILE = "dev-api-key"
DEV_ADMIN_KEY_FILE = "dev-admin-key"  # the console's operator view (SPLATQ_ADMIN_API_KEY)
# The first start installs nothing but may load a model on CPU: generous, bounded.
READY_TIMEOUT_S = 300.0
# The bundled sample image (in the wheel too); found without importing the worker (numpy).
BUNDLED_SAMPLE = Path(str(resources.files("splatq.services.gpu_worker"))) / "samples" / "sample.png"


# The two pod kinds of the staged pipeline, as in k8s/base: the GPU worker runs the stages
# that need the accelerator (CUDA when there is one, else the CPU), the CPU worker every other
# stage, cleanup included. Each is `splatq worker --stages ...`.
WORKER_STAGES: Mapping[str, tuple[PipelineStage, ...]] = {
    "worker-gpu": tuple(s for s in ALL_STAGES if s in DEVICE_STAGES),
    "worker-cpu": tuple(s for s in ALL_STAGES if s not in DEVICE_STAGES),
}


@dataclass(frozen=True, slots=True)
class WorkerProcess:
    """One worker process of the stack: a pod kind's stages, for one class or both."""

    kind: str  # a key of WORKER_STAGES
    classes: tuple[StreamName, ...] = STREAMS

    @property
    def name(self) -> str:
        """'worker-cpu' (both classes) or 'worker-cpu-synthesis' (one)."""
        label = class_label(self.classes)
        return f"{self.kind}-{label}" if label else self.kind

    @property
    def argv(self) -> tuple[str, ...]:
        stages = ",".join(s.value for s in WORKER_STAGES[self.kind])
        classes = class_label(self.classes)
        return ("worker", "--stages", stages, *(("--classes", classes) if classes else ()))


PER_CLASS = ((StreamName.INTERACTIVE,), (StreamName.SYNTHESIS,))
# Every worker process any layout runs, by name (their metrics offsets below).
ALL_WORKERS: Mapping[str, WorkerProcess] = {
    w.name: w
    for w in (
        *(WorkerProcess(kind) for kind in WORKER_STAGES),
        *(WorkerProcess(kind, c) for kind in WORKER_STAGES for c in PER_CLASS),
    )
}


def cuda_device_visible(settings: Settings) -> bool:
    """Whether the GPU worker will find a CUDA device, told without importing torch here (the
    supervisor stays light): SPLATQ_DEVICE says so, else (auto) the NVIDIA driver lists a GPU
    that CUDA_VISIBLE_DEVICES does not hide."""
    if settings.device != "auto":
        return settings.device == "cuda"
    if cuda_devices_hidden():
        return False
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def worker_layout(settings: Settings, cuda: bool | None = None) -> tuple[WorkerProcess, ...]:
    """The stack's worker processes by SPLATQ_UP_LAYOUT (docs/architecture.md#per-class-worker-
    processes): `shared` one per pod kind serving both classes; `per-class` one per pod kind
    and class; `auto` (the default) per class, except one GPU worker for both classes when a
    CUDA device is there (one device: its scheduler and stream priorities order them)."""
    if settings.up_layout == "shared":
        return tuple(WorkerProcess(kind) for kind in WORKER_STAGES)
    one_gpu_process = settings.up_layout == "auto" and (
        cuda_device_visible(settings) if cuda is None else cuda
    )
    processes: list[WorkerProcess] = []
    for kind in WORKER_STAGES:
        if kind == "worker-gpu" and one_gpu_process:
            processes.append(WorkerProcess(kind))
        else:
            processes.extend(WorkerProcess(kind, c) for c in PER_CLASS)
    return tuple(processes)


# Under `splatq up`, SPLATQ_METRICS_PORT is a base: each service that serves Prometheus on
# it gets base + its offset, so no two bind one port (without it the gateway serves /metrics
# on SPLATQ_GATEWAY_PORT, behind the admin key). A service run alone (Kubernetes: one per
# pod) binds the port as given. The GPU worker keeps the single worker's +0 of before the
# pipeline was staged; each per-class worker has an offset of its own.
METRICS_PORT_OFFSETS: Mapping[str, int] = {
    "worker-gpu": 0,
    "dispatcher": 1,
    "redriver": 2,
    "settler": 3,
    "worker-cpu": 4,
    "gateway": 5,
    "worker-gpu-interactive": 6,
    "worker-gpu-synthesis": 7,
    "worker-cpu-interactive": 8,
    "worker-cpu-synthesis": 9,
}
SERVICES = ("gateway", "dispatcher", "redriver", "settler")  # besides the workers


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # on top of the stack's environment
    worker: bool = False


def service_argv(name: str) -> tuple[str, ...]:
    """The `splatq` arguments of one service of the stack."""
    worker = ALL_WORKERS.get(name)
    return worker.argv if worker is not None else (name,)


def services_to_run(settings: Settings, cuda: bool | None = None) -> list[ServiceSpec]:
    """One process of each service -- gateway, webhook dispatcher, DLQ redriver, quota
    settler -- and the worker processes of the layout (`worker_layout`)."""
    workers = [w.name for w in worker_layout(settings, cuda)]
    specs = []
    for name in (SERVICES[0], *workers, *SERVICES[1:]):
        env = {}
        if settings.metrics_port and name in METRICS_PORT_OFFSETS:
            env["SPLATQ_METRICS_PORT"] = str(settings.metrics_port + METRICS_PORT_OFFSETS[name])
        argv = (sys.executable, "-m", "splatq.services.cli", *service_argv(name))
        specs.append(ServiceSpec(name, argv, env, worker=name in ALL_WORKERS))
    return specs


AfterStart = Callable[[Settings], Awaitable[int]]


async def run_stack(
    settings: Settings, then: AfterStart | None = None, redis_port: int | None = None
) -> int:
    """Run until Ctrl-C (or until `then` returns: its exit code ends the stack). Every child,
    the embedded redis-server included, dies with this process even if it is SIGKILLed.
    "splatq is up" is printed once the gateway is ready and every worker process has reached
    Redis."""
    configure_logging(settings.log_level, settings.log_format, "stack")
    redis_port = redis_port or settings.embedded_redis_port
    redis: RedisServer | None = None
    env = process_environment()
    if settings.redis_url_is_default:
        redis = RedisServer(settings.data_dir / "redis", port=redis_port)
        try:
            await redis.start()
        except RedisServerError as exc:
            print(f"splatq up: {exc}", file=sys.stderr)
            return 1
        env["SPLATQ_REDIS_URL"] = redis.url
        log.info("redis.started", url=redis.url, data_dir=str(redis.data_dir), aof=True)
    redis_url = env.get("SPLATQ_REDIS_URL", settings.redis_url)
    if not settings.storage_url:
        env["SPLATQ_STORAGE_URL"] = f"file://{settings.storage_root.resolve()}"
    if not settings.api_keys:
        # A development key for this stack only, kept under the data dir so the next `make up`
        # (and the README's commands) reuse it; production sets its own.
        env["SPLATQ_API_KEYS"] = f"dev:{dev_api_key(settings.data_dir)}"
    if not settings.admin_api_key:
        # The same for the admin key (the console's operator view, /v1/admin/): this stack's
        # own, in a file of the data dir; the banner names the file, not the key.
        env["SPLATQ_ADMIN_API_KEY"] = dev_api_key(settings.data_dir, DEV_ADMIN_KEY_FILE)
    if "SPLATQ_WEBHOOK_ALLOW_PRIVATE" not in env:
        # The local stack delivers to receivers on this machine (examples/webhook_receiver.py);
        # production keeps the SSRF guard's default (private addresses refused).
        env["SPLATQ_WEBHOOK_ALLOW_PRIVATE"] = "1"
    api_key = env.get("SPLATQ_API_KEYS", "").split(",")[0].partition(":")[2]
    child_settings = settings.with_overrides(
        redis_url=redis_url,
        storage_url=env["SPLATQ_STORAGE_URL"],
        api_keys={api_key: "dev"} if api_key else settings.api_keys,
    )
    children: dict[str, asyncio.subprocess.Process] = {}
    specs = services_to_run(settings)
    try:
        for spec in specs:
            children[spec.name] = await asyncio.create_subprocess_exec(
                *spec.argv,
                env={**env, **spec.env},
                preexec_fn=die_with_parent(),  # dies with `splatq up`, even on SIGKILL
            )
            log.info(
                "service.started",
                service=spec.name,
                pid=children[spec.name].pid,
                metrics_port=int(spec.env.get("SPLATQ_METRICS_PORT", "0")) or None,
            )
        workers = {s.name for s in specs if s.worker}
        if not await _wait_until_ready(child_settings, children, workers):
            return 1
        print(up_banner(settings, api_key, redis_url), flush=True)
        return await _supervise(children, then(child_settings) if then else None)
    finally:
        await _stop_children(children, settings.shutdown_grace_s + 5)
        if redis is not None:
            await redis.stop()
            log.info("redis.stopped")


def dev_api_key(data_dir: Path, name: str = DEV_KEY_FILE) -> str:
    """The local stack's development key: read from `<data_dir>/<name>` (dev-api-key), or made
    once and written there (mode 0600)."""
    path = data_dir / name
    if path.exists():
        key = path.read_text(encoding="utf-8").strip()
        if key.startswith(DEV_KEY_PREFIX) and len(key) >= MIN_ADMIN_KEY_CHARS:
            return key
    # 256 random bits: strong enough for the admin key too (an older, shorter one is replaced)
    key = f"{DEV_KEY_PREFIX}{secrets.token_urlsafe(32)}"
    data_dir.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".tmp")
    temp.write_text(key + "\n", encoding="utf-8")
    temp.chmod(0o600)
    temp.replace(path)
    return key


def up_banner(settings: Settings, api_key: str, redis_url: str) -> str:
    gateway = settings.public_base_url
    sample = _display_path(BUNDLED_SAMPLE)
    key_file = settings.data_dir / DEV_KEY_FILE
    key_line = f"{api_key}  (saved in {key_file})" if settings.api_keys == {} else api_key
    admin = (
        f"the admin key in {settings.data_dir / DEV_ADMIN_KEY_FILE}"
        if not settings.admin_api_key
        else "SPLATQ_ADMIN_API_KEY"
    )
    return (
        f"splatq is up.\n  API:     {gateway}  (OpenAPI: {gateway}/openapi.json)\n"
        f"  Console: {gateway}/console  (sign in with the API key; operator: {admin})\n"
        f"  API key: {key_line}\n  Redis:   {redis_url}\n"
        f"  try:     curl -H 'Authorization: Bearer {api_key}' -F image=@{sample} "
        f'-F \'params={{"quality":"preview"}}\' {gateway}/v1/jobs\n'
        f"     or:   SPLATQ_API_KEY={api_key} splatq submit {sample} --quality preview "
        f"--wait --out out/\n(Ctrl-C stops everything)"
    )


def _display_path(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(Path.cwd()))
    return str(path)


async def _wait_until_ready(
    settings: Settings, children: dict[str, asyncio.subprocess.Process], workers: set[str]
) -> bool:
    """Until the gateway answers /readyz and each worker process of the stack has reached
    Redis since now (its fleet tick: after its handlers' startup, e.g. the model load). False
    when a child exits first or READY_TIMEOUT_S passes."""
    redis = connect(settings.redis_url, client_name="splatq-stack")
    keys = KeySchema(partitions=settings.partitions)
    pids = {p.pid for name, p in children.items() if name in workers}
    try:
        seconds, micros = await redis.time()
        since_ms = seconds * 1000 + micros // 1000
        deadline = time.monotonic() + READY_TIMEOUT_S
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            while time.monotonic() < deadline:
                dead = [n for n, p in children.items() if p.returncode is not None]
                if dead:
                    log.error("stack.not_ready", exited=dead)
                    return False
                if await _gateway_ready(http, settings) and pids <= await _ticked_pids(
                    redis, keys, since_ms
                ):
                    return True
                await asyncio.sleep(0.2)
        log.error("stack.not_ready", waited_s=READY_TIMEOUT_S)
        return False
    finally:
        await redis.aclose()


async def _gateway_ready(http: aiohttp.ClientSession, settings: Settings) -> bool:
    url = f"http://127.0.0.1:{settings.gateway_port}/readyz"
    try:
        async with http.get(url) as resp:
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def _ticked_pids(redis: Redis, keys: KeySchema, since_ms: int) -> set[int]:
    """The process ids of the workers on this host that ticked a fleet clock since
    `since_ms` (a staged process ticks once, under one name for all its stage workers)."""
    pids: set[int] = set()
    for p in range(keys.partitions):
        for member in await redis.zrangebyscore(keys.workers(p), since_ms, "+inf"):
            pid = consumer_pid(str(member))
            if pid is not None:
                pids.add(pid)
    return pids


def consumer_pid(consumer: str) -> int | None:
    """The process id in a worker's consumer name ('<host>-<pid>-<hex>', the engine's
    new_consumer_name), or None for a name of another form or of another host."""
    parts = consumer.rsplit("-", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return None
    return int(parts[1])


async def _supervise(
    children: dict[str, asyncio.subprocess.Process], then: Awaitable[int] | None
) -> int:
    """Wait for Ctrl-C/SIGTERM, a child's death (exit 1), or `then` (its exit code)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stopper = asyncio.create_task(stop.wait())
    waiters = [asyncio.create_task(p.wait()) for p in children.values()]
    runner = asyncio.ensure_future(then) if then is not None else None
    watched = [stopper, *waiters] + ([runner] if runner is not None else [])
    try:
        done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in watched:
            if not task.done():
                task.cancel()
    if runner is not None and runner in done:
        return runner.result()
    return 0 if stopper in done else 1


async def _stop_children(children: dict[str, asyncio.subprocess.Process], grace_s: float) -> None:
    for name, proc in children.items():
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        else:
            log.error("service.exited", service=name, code=proc.returncode)
    for proc in children.values():
        with contextlib.suppress(ProcessLookupError):
            try:
                await asyncio.wait_for(proc.wait(), timeout=grace_s)
            except TimeoutError:
                proc.kill()
