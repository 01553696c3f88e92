"""The floor under a submission on this machine: stripped-down aiohttp handlers that do only
part of what `POST /v1/jobs` must do, driven like bench/gateway_submit.py (same wrk script,
same different-per-request PNG), next to the bare "hello" baseline in the same run.

Usage: python -m bench.gateway_floor [--connections 64] [--duration 8] [--warmup 2]

Handlers (each adds one step to the previous):
  parse            read the body, split the multipart parts with bytes.find, answer 202 JSON
  parse+redis      ... and one Redis command (XADD of the image's SHA-256)
  parse+redis+file ... and store the image durably (the gateway's group-committed writer)
  parse+redis+fsync ... the same with one fsync per file instead (no group commit)
What the real gateway adds on top: authentication, the rate-limit script, image validation
(Pillow), the params schema, the enqueue script (job record + stream entry + event), the job
view, request ids, metrics and logs. If even `parse+redis+file` stays far below 20 % of
hello, the issue's 20 % target is out of reach for any handler that stores each input.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import orjson

from bench.gateway_submit import (
    HELLO_SERVER,
    PngTemplate,
    _gateway_env,
    _service,
    hello_script,
    run_wrk,
    submit_script,
)
from splatq.shared.redis.server import RedisServer, free_port

FLOOR_SERVER = """
import asyncio, hashlib, os, sys
from pathlib import Path
import orjson
from aiohttp import web
from splatq.shared.storage.group_commit import GroupCommitWriter
from splatq.shared.redis.client import connect
from splatq.shared.storage.files import write_if_absent

mode, port, redis_url, root = sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
redis = connect(redis_url)
writer = GroupCommitWriter(root)
BODY = orjson.dumps({"id": "job_x", "status": "queued"})

async def submit(request: web.Request) -> web.Response:
    body = await request.read()
    boundary = b"--" + request.headers["Content-Type"].split("boundary=", 1)[1].encode()
    image = b""
    for part in body.split(boundary)[1:-1]:
        head, _, data = part.partition(b"\\r\\n\\r\\n")
        if b'name="image"' in head:
            image = data[:-2]
    digest = hashlib.sha256(image).hexdigest()
    if mode != "parse":
        await redis.xadd("floor", {"sha256": digest})
    path = root / digest[:2] / f"{digest}.png"
    if mode == "parse+redis+file":
        await writer.put_if_absent(path, image)
    elif mode == "parse+redis+fsync":
        await asyncio.to_thread(write_if_absent, path, image)
    return web.Response(status=202, body=BODY, content_type="application/json")

async def ready(request: web.Request) -> web.Response:
    return web.Response(text="ok")

app = web.Application()
app.router.add_post("/v1/jobs", submit)
app.router.add_get("/readyz", ready)
web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)
"""

MODES = ("parse", "parse+redis", "parse+redis+file", "parse+redis+fsync")


async def run(args: argparse.Namespace) -> None:
    params = orjson.dumps({"quality": "preview", "cache": False}).decode()
    template = PngTemplate.build()
    rows: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="splatq-floor-") as name:
        tmp = Path(name)
        submit_lua, hello_lua = tmp / "submit.lua", tmp / "hello.lua"
        submit_lua.write_text(submit_script(template, params))
        hello_lua.write_text(hello_script())
        redis = RedisServer(tmp / "redis", appendonly=False)
        await redis.start()
        try:
            run_id = 0
            for mode in ("hello", *MODES):
                port = free_port()
                env = _gateway_env(redis.url, port, tmp)
                if mode == "hello":
                    argv = [sys.executable, "-c", HELLO_SERVER, str(port)]
                    url, ready, script = f"http://127.0.0.1:{port}/", "/", hello_lua
                else:
                    root = tmp / mode.replace("+", "_")
                    argv = [sys.executable, "-c", FLOOR_SERVER, mode, str(port), redis.url,
                            str(root)]  # fmt: skip
                    url, ready, script = f"http://127.0.0.1:{port}/v1/jobs", "/readyz", submit_lua
                ready_url = f"http://127.0.0.1:{port}{ready}"
                async with _service(mode.replace("+", "_"), argv, env, ready_url, tmp):
                    for seconds in (args.warmup, args.duration):
                        run_id += 1
                        result = await run_wrk(url, script, args.connections, 1, seconds, run_id)
                print(f"{mode:<18} {result.per_s:>9,.0f} req/s", flush=True)
                rows.append((mode, result.per_s, result.p99_ms))
        finally:
            await redis.stop()
    hello = rows[0][1]
    print("\n| handler | req/s | share of hello | p99 ms |\n|---|---:|---:|---:|")
    for mode, rate, p99 in rows:
        print(f"| {mode} | {rate:,.0f} | {rate / hello:.1%} | {p99:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--duration", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
