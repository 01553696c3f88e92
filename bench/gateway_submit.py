"""Submissions per second through the REST gateway vs a bare aiohttp "hello" handler.

Usage: python -m bench.gateway_submit [--connections 64] [--duration 10] [--warmup 2]
                                      [--rounds 2] [--threads 1] [--cache] [--tmp-dir DIR]
Needs `wrk` on PATH (Debian: apt-get install wrk) and redis-server; about 55 s with defaults.

What it measures. One run starts its own redis-server (AOF off), the gateway
(`python -m splatq.services.gateway`, one process, log level warning, rate limit and backlog limit
off, local file storage in a temp dir) and, as the baseline, a bare aiohttp app whose one
handler returns `web.Response(text="hello")`. The same load generator (`wrk`, installed with
`apt-get install wrk`) then drives each at `--connections` concurrent keep-alive connections:
a `--warmup` run that is discarded, then a `--duration` run that is measured; hello and submit
alternate (hello, submit, hello, submit, ...) so machine noise hits both alike.

The hello run is a GET of a 5-byte body. The submit run is `POST /v1/jobs`, multipart, a
32x32 RGBA PNG (4.3 KB) plus `params` = {"quality": "preview", "cache": false}. The wrk Lua
script changes three pixels of the image for every request (run, thread and request number,
with the zlib Adler-32 and the PNG CRC recomputed), so every submission is a different image:
the gateway really validates, stores (fsynced file write) and enqueues each one, and neither
the cache nor single-flight can answer it. `--cache` sends "cache": true instead (the default
client path: a content-key claim per request; the images still differ, so nothing coalesces).

The table shows requests/s, p50 and p99 latency (wrk's, per measured run and the median over
rounds), submissions as a share of hello, responses other than 2xx (hello) or other than 202
(submit), and afterwards what Redis and storage hold (stream entries across partitions of
`splatq:{p*}:stream:interactive`, distinct stored inputs) against the 202s wrk counted, which
proves the submissions were real jobs. The issue's targets (submissions >= 20 % of hello,
p99 < 50 ms) are reported, not asserted. Every process and the temp dir are removed at the
end, also on errors and Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import aiohttp
import orjson
from redis.asyncio import Redis

from splatq.shared.redis.server import RedisServer, free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
TENANT, API_KEY = "bench", "bench-key"
BOUNDARY = "splatqbenchboundary7MA4YWxkTrZu0gW"
SIDE = 32  # the image is SIDE x SIDE RGBA
ROW = 1 + SIDE * 4  # filter byte + pixels
VARYING = 12  # the last three pixels of the last row: run, thread, request number
READY_TIMEOUT_S = 30.0
STOP_GRACE_S = 5.0
WRK_TIMEOUT = "5s"  # a slower answer counts as a wrk timeout error (never expected here)
TARGET_SHARE = 0.20
TARGET_P99_MS = 50.0

HELLO_SERVER = """
import sys
from aiohttp import web

async def hello(request: web.Request) -> web.Response:
    return web.Response(text="hello")

app = web.Application()
app.router.add_get("/", hello)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""

# Printed by wrk's done() callback; parsed below. Latencies are in microseconds.
_RESULT_RE = re.compile(
    r"^BENCH requests=(\d+) duration_us=(\d+) p50_us=(\d+) p99_us=(\d+) status_errors=(\d+) "
    r"socket_errors=(\d+) unexpected=(\d+) expected=(\d+) sample=(.*)$",
    re.MULTILINE,
)

_LUA_DONE = r"""
local threads = {}
local next_tid = 0

function setup(thread)
  thread:set("tid", next_tid)
  next_tid = next_tid + 1
  table.insert(threads, thread)
end

function done(summary, latency, requests)
  local unexpected, expected, sample = 0, 0, ""
  for _, t in ipairs(threads) do
    unexpected = unexpected + (t:get("unexpected") or 0)
    expected = expected + (t:get("expected") or 0)
    local s = t:get("sample")
    if s and s ~= "" then sample = s end
  end
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration_us=%d p50_us=%d p99_us=%d status_errors=%d socket_errors=%d "
      .. "unexpected=%d expected=%d sample=%s\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout, unexpected, expected,
    (sample:gsub("[\r\n]", " "))))
end
"""

_LUA_SUBMIT = r"""
-- Every request is a different PNG: the last 12 bytes of pixel data are the run id, the wrk
-- thread id and the thread's request number; the Adler-32 of the zlib stream and the CRC-32 of
-- the last IDAT chunk are carried on from their values over the constant prefix.
local bit = require("bit")
local CRC = {%(crc_table)s}
local PREFIX = "%(prefix)s"
local SUFFIX = "%(suffix)s"
local ADLER_A, ADLER_B, CRC0 = %(adler_a)d, %(adler_b)d, %(crc0)d
local HEADERS = {
  ["Authorization"] = "Bearer %(api_key)s",
  ["Content-Type"] = "multipart/form-data; boundary=%(boundary)s",
}
local run_id = 0
local counter = 0
unexpected, expected, sample = 0, 0, ""

local function be32(x)
  return string.char(math.floor(x / 16777216) %% 256, math.floor(x / 65536) %% 256,
                     math.floor(x / 256) %% 256, x %% 256)
end

function init(args)
  run_id = tonumber(args[1]) or 0
end

function request()
  counter = counter + 1
  local vary = be32(run_id) .. be32(tid or 0) .. be32(counter)
  local a, b = ADLER_A, ADLER_B
  for i = 1, #vary do
    a = (a + vary:byte(i)) %% 65521
    b = (b + a) %% 65521
  end
  local tail = vary .. be32(b * 65536 + a)
  local c = bit.bnot(CRC0)
  for i = 1, #tail do
    c = bit.bxor(CRC[bit.band(bit.bxor(c, tail:byte(i)), 255)], bit.rshift(c, 8))
  end
  c = bit.bnot(c)
  local crc = string.char(bit.band(bit.rshift(c, 24), 255), bit.band(bit.rshift(c, 16), 255),
                          bit.band(bit.rshift(c, 8), 255), bit.band(c, 255))
  return wrk.format("POST", "/v1/jobs", HEADERS, PREFIX .. tail .. crc .. SUFFIX)
end

function response(status, headers, body)
  if status == 202 then
    expected = expected + 1
  else
    unexpected = unexpected + 1
    if sample == "" then sample = status .. " " .. string.sub(body or "", 1, 300) end
  end
end
"""

# -- the image ------------------------------------------------------------------------------


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _pixels() -> tuple[bytes, bytes]:
    """Raw scanlines (filter 0): every row but the last, and the last one's constant head."""
    rows = bytearray()
    for y in range(SIDE):
        rows.append(0)
        for x in range(SIDE):
            inside = (x - 15.5) ** 2 + (y - 15.5) ** 2 < 12.0**2
            rows += bytes((8 * x, 8 * y, 128, 255 if inside else 0))
    return bytes(rows[:-ROW]), bytes(rows[-ROW:-VARYING])


@dataclass(frozen=True)
class PngTemplate:
    """A PNG split around its varying bytes: prefix + vary + adler + crc + suffix."""

    prefix: bytes  # signature, IHDR, IDAT 1, IDAT 2 up to the varying pixels
    suffix: bytes  # IEND
    adler_a: int  # Adler-32 state after all constant pixel bytes
    adler_b: int
    crc0: int  # CRC-32 of IDAT 2's type and constant data

    @classmethod
    def build(cls) -> PngTemplate:
        head_rows, last_head = _pixels()
        ihdr = struct.pack(">IIBBBBB", SIDE, SIDE, 8, 6, 0, 0, 0)  # 8-bit RGBA
        # zlib stream of two stored (uncompressed) deflate blocks: the rows before the last
        # in IDAT 1, the last row and the Adler-32 in IDAT 2, so only IDAT 2's CRC changes.
        block1 = b"\x00" + struct.pack("<HH", len(head_rows), len(head_rows) ^ 0xFFFF)
        idat1 = b"\x78\x01" + block1 + head_rows
        idat2_head = b"\x01" + struct.pack("<HH", ROW, ROW ^ 0xFFFF) + last_head
        idat2_len = len(idat2_head) + VARYING + 4
        adler = zlib.adler32(head_rows + last_head)
        prefix = (
            b"\x89PNG\r\n\x1a\n"
            + _chunk(b"IHDR", ihdr)
            + _chunk(b"IDAT", idat1)
            + struct.pack(">I", idat2_len)
            + b"IDAT"
            + idat2_head
        )
        return cls(
            prefix=prefix,
            suffix=_chunk(b"IEND", b""),
            adler_a=adler & 0xFFFF,
            adler_b=adler >> 16,
            crc0=zlib.crc32(b"IDAT" + idat2_head),
        )

    def png(self, run_id: int, thread_id: int, counter: int) -> bytes:
        """What the Lua script sends, computed in Python (self-check and the smoke request)."""
        vary = struct.pack(">III", run_id, thread_id, counter)
        a, b = self.adler_a, self.adler_b
        for byte in vary:
            a = (a + byte) % 65521
            b = (b + a) % 65521
        tail = vary + struct.pack(">I", (b << 16) | a)
        crc = zlib.crc32(tail, self.crc0)
        return self.prefix + tail + struct.pack(">I", crc) + self.suffix


def _multipart_head(params: str) -> bytes:
    return (
        f"--{BOUNDARY}\r\n"
        'Content-Disposition: form-data; name="params"\r\n'
        "Content-Type: application/json\r\n\r\n"
        f"{params}\r\n"
        f"--{BOUNDARY}\r\n"
        'Content-Disposition: form-data; name="image"; filename="bench.png"\r\n'
        "Content-Type: image/png\r\n\r\n"
    ).encode()


_MULTIPART_TAIL = f"\r\n--{BOUNDARY}--\r\n".encode()


def _lua_bytes(data: bytes) -> str:
    return "".join(f"\\{b:03d}" for b in data)


def _crc_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (0xEDB88320 ^ (c >> 1)) if c & 1 else c >> 1
        table.append(c)
    return table


def submit_script(template: PngTemplate, params: str) -> str:
    crc = ", ".join(f"[{i}] = {v}" for i, v in enumerate(_crc_table()))
    return (
        _LUA_SUBMIT
        % {
            "crc_table": crc,
            "prefix": _lua_bytes(_multipart_head(params) + template.prefix),
            "suffix": _lua_bytes(template.suffix + _MULTIPART_TAIL),
            "adler_a": template.adler_a,
            "adler_b": template.adler_b,
            "crc0": template.crc0,
            "api_key": API_KEY,
            "boundary": BOUNDARY,
        }
        + _LUA_DONE
    )


def hello_script() -> str:
    """GET / with no per-request Lua; non-2xx come from wrk's own status error count."""
    return _LUA_DONE


# -- processes ------------------------------------------------------------------------------


def _spawn(argv: Sequence[str], env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        start_new_session=True,
    )  # fmt: skip


async def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, SIGKILL it if it is still there after STOP_GRACE_S."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        await asyncio.to_thread(proc.wait, STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await asyncio.to_thread(proc.wait)


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_bytes()[-n:].decode(errors="replace")
    except OSError:
        return ""


async def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with aiohttp.ClientSession() as http:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{url} exited with {proc.returncode}:\n{_tail(log)}")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} not ready after {READY_TIMEOUT_S} s:\n{_tail(log)}")
            await asyncio.sleep(0.1)


def _gateway_env(redis_url: str, port: int, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLATQ_")}
    env.update(
        SPLATQ_REDIS_URL=redis_url,
        SPLATQ_API_KEYS=f"{TENANT}:{API_KEY}",
        SPLATQ_GATEWAY_HOST="127.0.0.1",
        SPLATQ_GATEWAY_PORT=str(port),
        SPLATQ_STORAGE_URL=(tmp / "storage").resolve().as_uri(),
        SPLATQ_DATA_DIR=str(tmp / "data"),
        SPLATQ_LOG_LEVEL="warning",
        SPLATQ_LOG_FORMAT="json",
        SPLATQ_RATE_LIMIT_PER_S="1000000",
        SPLATQ_RATE_LIMIT_BURST="1000000000",
        SPLATQ_MAX_BACKLOG_INTERACTIVE="0",
        SPLATQ_MAX_BACKLOG_SYNTHESIS="0",
        SPLATQ_SHUTDOWN_GRACE_S="2",
    )
    return env


@contextlib.asynccontextmanager
async def _service(
    name: str, argv: Sequence[str], env: dict[str, str], ready_url: str, tmp: Path
) -> AsyncIterator[subprocess.Popen[bytes]]:
    log_path = tmp / f"{name}.log"
    with log_path.open("wb") as log:
        proc = _spawn(argv, env, log)
        try:
            await _wait_ready(ready_url, proc, log_path)
            yield proc
            if proc.poll() is not None:
                raise RuntimeError(f"{name} died during the run:\n{_tail(log_path)}")
        finally:
            await _terminate(proc)


# -- load -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class WrkResult:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    status_errors: int  # wrk: responses other than 2xx/3xx
    socket_errors: int  # connect + read + write + timeout
    unexpected: int  # submit: answers other than 202
    expected: int  # submit: 202 answers
    sample: str  # the first unexpected answer (status and body head)

    @property
    def per_s(self) -> float:
        return self.requests / self.seconds


async def run_wrk(
    url: str, script: Path, connections: int, threads: int, seconds: int, run_id: int
) -> WrkResult:
    argv = [
        "wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s",
        "--timeout", WRK_TIMEOUT, "--latency", "-s", str(script), url, "--", str(run_id),
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # a terminal's Ctrl-C reaches only this script, which kills it
    )
    try:
        out, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = out.decode(errors="replace")
    match = _RESULT_RE.search(text)
    if proc.returncode != 0 or match is None:
        raise RuntimeError(f"wrk failed (exit {proc.returncode}):\n{text}")
    g = match.groups()
    return WrkResult(
        requests=int(g[0]),
        seconds=int(g[1]) / 1e6,
        p50_ms=int(g[2]) / 1000,
        p99_ms=int(g[3]) / 1000,
        status_errors=int(g[4]),
        socket_errors=int(g[5]),
        unexpected=int(g[6]),
        expected=int(g[7]),
        sample=g[8].strip(),
    )


async def smoke_submit(url: str, template: PngTemplate, params: str) -> None:
    """One submission with the Python twin of the Lua body: a broken template fails here."""
    body = _multipart_head(params) + template.png(0xFFFFFFFF, 0, 0) + _MULTIPART_TAIL
    headers = {
        "Authorization": f"Bearer {API_KEY}",
        "Content-Type": f"multipart/form-data; boundary={BOUNDARY}",
    }
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as r:
        if r.status != 202:
            raise RuntimeError(f"smoke submission answered {r.status}: {await r.text()}")


async def stream_entries(redis_url: str) -> int:
    redis = Redis.from_url(redis_url)
    try:
        total = 0
        async for key in redis.scan_iter(match="splatq:{p*}:stream:interactive", _type="stream"):
            total += int(await redis.xlen(key))
        return total
    finally:
        await redis.aclose()


# -- report ---------------------------------------------------------------------------------


@dataclass
class Results:
    hello: list[WrkResult]
    submit: list[WrkResult]
    accepted_total: int = 0  # 202s wrk saw, warm-ups and the smoke request included
    jobs_in_redis: int = 0
    inputs_stored: int = 0


def _row(label: str, r: WrkResult, bad: int) -> str:
    return (
        f"| {label:<18} | {r.per_s:>9,.0f} | {r.p50_ms:>7.2f} | {r.p99_ms:>7.2f} | "
        f"{r.requests:>8,} | {bad:>7,} | {r.socket_errors:>6,} |"
    )


def _median_row(label: str, runs: list[WrkResult], bad: int) -> str:
    per_s = statistics.median(r.per_s for r in runs)
    p50 = statistics.median(r.p50_ms for r in runs)
    p99 = statistics.median(r.p99_ms for r in runs)
    total = sum(r.requests for r in runs)
    errors = sum(r.socket_errors for r in runs)
    return (
        f"| {label:<18} | {per_s:>9,.0f} | {p50:>7.2f} | {p99:>7.2f} | {total:>8,} | "
        f"{bad:>7,} | {errors:>6,} |"
    )


def report(res: Results, args: argparse.Namespace, wrk_version: str) -> None:
    print()
    print(
        f"gateway submit vs bare aiohttp hello: {args.connections} keep-alive connections, "
        f"{args.threads} wrk thread(s), {args.duration} s measured after {args.warmup} s "
        f"warm-up, {args.rounds} interleaved rounds"
    )
    print(
        f"{wrk_version}; Python {platform.python_version()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs; aiohttp {aiohttp.__version__}; "
        f'params {{"quality": "preview", "cache": {str(args.cache).lower()}}}, '
        f"a different 32x32 PNG per request\n"
    )
    print(
        f"| {'run':<18} | {'req/s':>9} | {'p50 ms':>7} | {'p99 ms':>7} | {'requests':>8} | "
        f"{'non-2xx':>7} | {'sock.e':>6} |"
    )
    print(f"|{'-' * 20}|{'-' * 11}|{'-' * 9}|{'-' * 9}|{'-' * 10}|{'-' * 9}|{'-' * 8}|")
    for i, (h, s) in enumerate(zip(res.hello, res.submit, strict=True), start=1):
        print(_row(f"round {i} hello", h, h.status_errors))
        print(_row(f"round {i} submit", s, s.unexpected))
    hello_bad = sum(r.status_errors for r in res.hello)
    submit_bad = sum(r.unexpected for r in res.submit)
    print(_median_row("median hello", res.hello, hello_bad))
    print(_median_row("median submit", res.submit, submit_bad))
    print(
        "\nnon-2xx for submit counts every answer other than 202; "
        "requests in the median rows is the total over the rounds\n"
    )

    hello_rate = statistics.median(r.per_s for r in res.hello)
    submit_rate = statistics.median(r.per_s for r in res.submit)
    share = submit_rate / hello_rate
    p99 = statistics.median(r.p99_ms for r in res.submit)
    per_round = ", ".join(
        f"{s.per_s / h.per_s:.1%}" for h, s in zip(res.hello, res.submit, strict=True)
    )
    samples = [r.sample for r in res.submit if r.sample]
    share_verdict = "met" if share >= TARGET_SHARE else "MISSED"
    p99_verdict = "met" if p99 < TARGET_P99_MS else "MISSED"
    lines = [
        ("submit / hello (medians)", f"{share:.1%}  (per round: {per_round})"),
        (f"target share >= {TARGET_SHARE:.0%}", share_verdict),
        (
            f"target submit p99 < {TARGET_P99_MS:g} ms",
            f"{p99_verdict}  (median p99 {p99:.2f} ms at {submit_rate:,.0f} req/s)",
        ),
        (
            "closed loop (Little's law)",
            f"{args.connections} conns / {submit_rate:,.0f} req/s = "
            f"{args.connections / submit_rate * 1000:.1f} ms mean latency; p99 < "
            f"{TARGET_P99_MS:g} ms at {args.connections} conns needs "
            f">= {args.connections / TARGET_P99_MS * 1000:,.0f} req/s",
        ),
        ("non-202 submissions", f"{submit_bad:,}"),
        *(("  first unexpected answer", x) for x in samples[:1]),
        ("202s seen by wrk", f"{res.accepted_total:,}  (all runs: warm-ups, 1 smoke included)"),
        (
            "jobs in Redis afterwards",
            f"{res.jobs_in_redis:,}  (XLEN over splatq:{{p*}}:stream:interactive; >= the "
            "202s: wrk does not count answers in flight when a run ends)",
        ),
        ("distinct inputs stored", f"{res.inputs_stored:,}"),
    ]
    for label, value in lines:
        print(f"{label + ':':<30}{value}")


# -- main -----------------------------------------------------------------------------------


def _wrk_version() -> str:
    if shutil.which("wrk") is None:
        raise SystemExit(
            "wrk not found on PATH: install it (Debian: apt-get install wrk); "
            "this benchmark has no fallback load generator"
        )
    out = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False)
    first = (out.stdout + out.stderr).strip().splitlines()
    return first[0].split(" Copyright")[0] if first else "wrk (version unknown)"


async def run(args: argparse.Namespace) -> Results:
    params = orjson.dumps({"quality": "preview", "cache": bool(args.cache)}).decode()
    template = PngTemplate.build()
    res = Results(hello=[], submit=[])
    with tempfile.TemporaryDirectory(prefix="splatq-bench-", dir=args.tmp_dir) as tmp_name:
        tmp = Path(tmp_name)
        submit_lua, hello_lua = tmp / "submit.lua", tmp / "hello.lua"
        submit_lua.write_text(submit_script(template, params))
        hello_lua.write_text(hello_script())
        redis = RedisServer(tmp / "redis", appendonly=False)
        await redis.start()
        try:
            gw_port, hello_port = free_port(), free_port()
            gw = f"http://127.0.0.1:{gw_port}"
            hello = f"http://127.0.0.1:{hello_port}/"
            env = _gateway_env(redis.url, gw_port, tmp)
            async with (
                _service("gateway", [sys.executable, "-m", "splatq.services.gateway"], env,
                         f"{gw}/readyz", tmp),
                _service("hello", [sys.executable, "-c", HELLO_SERVER, str(hello_port)], env,
                         hello, tmp),
            ):  # fmt: skip
                await smoke_submit(f"{gw}/v1/jobs", template, params)
                res.accepted_total = 1
                run_id = 0
                c, t = args.connections, args.threads
                for r in range(args.rounds):
                    for name, url, script in (
                        ("hello", hello, hello_lua),
                        ("submit", f"{gw}/v1/jobs", submit_lua),
                    ):
                        measured: WrkResult | None = None
                        for seconds in (args.warmup, args.duration):
                            if seconds <= 0:
                                continue
                            run_id += 1
                            measured = await run_wrk(url, script, c, t, seconds, run_id)
                            if name == "submit":
                                res.accepted_total += measured.expected
                        assert measured is not None
                        (res.hello if name == "hello" else res.submit).append(measured)
                        print(
                            f"round {r + 1}: {name:<6} {measured.per_s:>9,.0f} req/s  "
                            f"p50 {measured.p50_ms:.2f} ms  p99 {measured.p99_ms:.2f} ms",
                            flush=True,
                        )
            res.jobs_in_redis = await stream_entries(redis.url)
            inputs = tmp / "storage" / "inputs"
            res.inputs_stored = sum(1 for p in inputs.rglob("*.png") if p.is_file())
        finally:
            await redis.stop()
    return res


async def _main(args: argparse.Namespace) -> Results:
    # SIGTERM cancels like Ctrl-C does, so every `finally` above runs.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await run(args)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--connections", type=int, default=64, help="wrk -c (default 64)")
    parser.add_argument("--duration", type=int, default=10, help="measured seconds per run")
    parser.add_argument("--warmup", type=int, default=2, help="discarded seconds before (0: none)")
    parser.add_argument("--rounds", type=int, default=2, help="hello+submit rounds (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="wrk -t (default 1)")
    parser.add_argument("--cache", action="store_true", help='send "cache": true (default false)')
    parser.add_argument(
        "--tmp-dir",
        default=None,
        help="parent of the temp dir (Redis data, storage); default: the system temp dir."
        " /dev/shm (tmpfs) shows the gateway without the disk's fsync cost",
    )
    args = parser.parse_args()
    if args.duration <= 0 or args.rounds < 1 or args.connections < args.threads:
        parser.error("need --duration > 0, --rounds >= 1 and --connections >= --threads")
    wrk_version = _wrk_version()
    try:
        results = asyncio.run(_main(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted; every process and the temp dir were cleaned up", file=sys.stderr)
        raise SystemExit(130) from None
    report(results, args, wrk_version)


if __name__ == "__main__":
    main()
